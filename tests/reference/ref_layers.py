"""Building blocks of the numpy reference (reference.py): fp32 layers, attention, RoPE, the SparseD selection
and the MoE routers, written from shared/specs/models.md and shared/specs/algorithms.md only (never from
tessera's C++ code). Also used by selftest.py (through reference.py, which re-exports them)."""
import numpy as np


def rms_norm(x, w, eps):
    """RMSNorm over the last axis in fp32."""
    x = np.asarray(x, dtype=np.float32)
    ms = np.mean(x * x, axis=-1, keepdims=True, dtype=np.float32)
    return (x / np.sqrt(ms + np.float32(eps))) * np.asarray(w, dtype=np.float32)


def rope_cos_sin(positions, head_dim, theta):
    """cos, sin [L, head_dim/2] (fp32) for integer positions; inv_freq_i = theta^(-2i/head_dim)."""
    inv = 1.0 / (float(theta) ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    ang = (np.asarray(positions, dtype=np.float64)[:, None] * inv[None, :]).astype(np.float32)
    return np.cos(ang), np.sin(ang)


def apply_rope(x, positions, theta, interleaved=False, rotary_dim=None):
    """x [L, heads, head_dim] -> rotated copy. Rotate-half pairs (i, i + hd/2); interleaved pairs
    (2i, 2i+1). Pair i rotates by angle pos * inv_freq_i in both layouts. rotary_dim < head_dim: only
    the first rotary_dim dims rotate (with inv_freq over rotary_dim), the rest pass through."""
    x = np.asarray(x, dtype=np.float32)
    if rotary_dim is not None and rotary_dim < x.shape[-1]:
        rot = apply_rope(x[..., :rotary_dim], positions, theta, interleaved)
        return np.concatenate([rot, x[..., rotary_dim:]], axis=-1)
    hd = x.shape[-1]
    cos, sin = rope_cos_sin(positions, hd, theta)
    cos, sin = cos[:, None, :], sin[:, None, :]
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = a * cos - b * sin
        out[..., 1::2] = b * cos + a * sin
        return out
    a, b = x[..., : hd // 2], x[..., hd // 2:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


def attention(q, k, v, causal=False, block=0, q_pos=None, keep=None):
    """q [Lq, H, hd], k/v [L, KV, hd] (post-RoPE) -> [Lq, H, hd]. Softmax(q k^T / sqrt(hd)) v per head,
    GQA by repeating each kv head H/KV times; causal masks keys j > i; block > 0 (LLaDA2's block-causal
    mask) masks keys of later blocks: key j is seen by query i iff j // block <= i // block. Key j is at
    position j; query i at q_pos[i] (default i). keep [H, Lq, L] bool (SparseD tiles): other scores are
    masked; a row that keeps nothing outputs 0."""
    n, H, hd = q.shape
    qp = np.arange(n) if q_pos is None else np.asarray(q_pos)
    KV = k.shape[1]
    if H % KV:
        raise ValueError(f"{H} query heads are not a multiple of {KV} kv heads")
    k = np.repeat(k, H // KV, axis=1)
    v = np.repeat(v, H // KV, axis=1)
    s = np.einsum("qhd,khd->hqk", q, k).astype(np.float32) / np.float32(np.sqrt(hd))
    kp = np.arange(k.shape[0])
    if causal:
        s = np.where((kp[None, :] <= qp[:, None])[None], s, np.float32(-np.inf))
    if block > 0:
        qb, kb = qp // block, kp // block
        s = np.where((kb[None, :] <= qb[:, None])[None], s, np.float32(-np.inf))
    if keep is not None:
        s = np.where(keep, s, np.float32(-np.inf))
    mx = s.max(axis=-1, keepdims=True)
    s = s - np.where(np.isfinite(mx), mx, 0)
    p = np.exp(s)
    p /= np.maximum(p.sum(axis=-1, keepdims=True), np.float32(1e-30))
    return np.einsum("hqk,khd->qhd", p, v).astype(np.float32)


def sparse_patterns(q, k, block, rho, prompt_len, tie=1e-4, attn_block=0, q_pos=None):
    """SparseD isolated selection of one layer in float64 (Backend::sparse_select): q [Lq, H, hd], k [L, KV,
    hd] post-RoPE. Per head and query block, each key block's importance is the sum over the tile of the
    rows' softmax over all keys (scale 1/sqrt(hd)); the prompt blocks [0, prompt_len // block) and the
    generation blocks keep floor(n * rho) + 1 (at most n) each, ties to the lower block. Returns (mask [H,
    nqb, nkb] uint8, clear [H, nqb] uint8: 0 where a kept and a dropped block are within `tie`).
    q_pos (a forward computing only some rows, e.g. with a KV cache): query row i is at position q_pos[i]
    and falls into the query block q_pos[i] // block, nqb = ceil(L / block) (query blocks holding none of
    the rows score 0 everywhere; callers keep only the rows' blocks). attn_block > 0 (LLaDA2's block-causal
    mask): the softmax of the query at position p runs over the keys j with j // attn_block <= p //
    attn_block only; masked keys contribute 0 to the importance (the keep counts are unchanged)."""
    Lq, H, hd = q.shape
    L, KV = k.shape[0], k.shape[1]
    k = np.repeat(k.astype(np.float64), H // KV, axis=1)
    s = np.einsum("qhd,khd->hqk", q.astype(np.float64), k) / np.sqrt(hd)
    qp = np.arange(Lq) if q_pos is None else np.asarray(q_pos, dtype=np.int64)
    if attn_block > 0:
        s = np.where((np.arange(L)[None, :] // attn_block <= qp[:, None] // attn_block)[None], s, -np.inf)
    s = np.exp(s - s.max(axis=-1, keepdims=True))
    s /= s.sum(axis=-1, keepdims=True)
    nqb, nkb = -(-(Lq if q_pos is None else L) // block), -(-L // block)
    pad = np.zeros((H, nqb * block, nkb * block))
    pad[:, qp, :L] = s
    imp = pad.reshape(H, nqb, block, nkb, block).sum(axis=(2, 4))
    g = prompt_len // block
    mask = np.zeros((H, nqb, nkb), dtype=np.uint8)
    clear = np.ones((H, nqb), dtype=np.uint8)
    for a, b in ((0, g), (g, nkb)):
        n = b - a
        if n == 0:
            continue
        keep = min(n, int(np.floor(n * np.float64(np.float32(rho)))) + 1)
        for h in range(H):
            for r in range(nqb):
                order = sorted(range(a, b), key=lambda j: (-imp[h, r, j], j))
                mask[h, r, order[:keep]] = 1
                if keep < n and imp[h, r, order[keep - 1]] - imp[h, r, order[keep]] <= tie * imp[h, r, order[keep - 1]]:
                    clear[h, r] = 0
    return mask, clear


def shift_logits(logits):
    """Dream: row i <- row i-1 for i >= 1; row 0 stays."""
    return np.concatenate([logits[:1], logits[:-1]], axis=0)


def silu(x):
    return x / (np.float32(1.0) + np.exp(-x))


def swiglu_mlp(m, g, u, dn):
    """down(silu(gate(m)) * up(m)) in fp32."""
    return (silu(m @ g.T) * (m @ u.T)) @ dn.T


def route_margin(logits, top_k):
    """Per row: k-th highest minus (k+1)-th highest router logit (inf when every expert is chosen).
    A row whose margin is within the rounding noise of the logits may choose other experts in bf16."""
    z = np.sort(np.asarray(logits, dtype=np.float32), axis=-1)[:, ::-1]
    if top_k >= z.shape[1]:
        return np.full(z.shape[0], np.inf, dtype=np.float32)
    return z[:, top_k - 1] - z[:, top_k]


def moe_route(logits, top_k, norm_topk=False, scale=1.0):
    """Softmax router: (ids [n, k], weights [n, k]) from fp32 logits [n, E]; experts ranked by
    probability, ties to the lower expert id; weights = the probabilities of the chosen experts
    (renormalised to sum 1 only with norm_topk), times scale."""
    z = np.asarray(logits, dtype=np.float32)
    p = np.exp(z - z.max(axis=-1, keepdims=True))
    p = p / p.sum(axis=-1, keepdims=True)
    ids = np.argsort(-p, axis=-1, kind="stable")[:, :top_k]
    w = np.take_along_axis(p, ids, axis=-1)
    if norm_topk:
        w = w / w.sum(axis=-1, keepdims=True)
    return ids, (w * np.float32(scale)).astype(np.float32)


def sigmoid_group_route(logits, bias, top_k, n_group, topk_group, scale):
    """LLaDA2 router (models.md): s = sigmoid(fp32 logits), b = s + expert_bias; each of n_group groups
    of consecutive experts scores the sum of its top-2 b; the topk_group best groups are kept (ties: the
    lower group); top_k experts by b inside them (ties: the lower id); weights = the UNBIASED s of those
    experts / (their sum + 1e-20) (only when top_k > 1) * scale. Returns (ids, weights, margins): margins
    per row = the smaller of the group-score gap (topk_group-th minus next group) and the b gap (top_k-th
    minus next kept expert), inf where there is no next."""
    z = np.asarray(logits, dtype=np.float32)
    s = (np.float32(1.0) / (np.float32(1.0) + np.exp(-z))).astype(np.float32)
    b = (s + np.asarray(bias, dtype=np.float32)[None, :]).astype(np.float32)
    n, E = b.shape
    per = E // n_group
    gb = np.sort(b.reshape(n, n_group, per), axis=-1)[:, :, ::-1]
    gscore = gb[:, :, 0] + gb[:, :, 1]
    gorder = np.argsort(-gscore, axis=-1, kind="stable")
    keep = np.zeros((n, n_group), dtype=bool)
    np.put_along_axis(keep, gorder[:, :topk_group], True, axis=-1)
    masked = np.where(np.repeat(keep, per, axis=1), b, -np.inf)
    ids = np.argsort(-masked, axis=-1, kind="stable")[:, :top_k]
    w = np.take_along_axis(s, ids, axis=-1)
    if top_k > 1:
        w = w / (w.sum(axis=-1, keepdims=True) + np.float32(1e-20))
    w = (w * np.float32(scale)).astype(np.float32)
    gs = np.take_along_axis(gscore, gorder, axis=-1)
    gmargin = gs[:, topk_group - 1] - gs[:, topk_group] if topk_group < n_group else np.full(n, np.inf)
    srt = np.sort(masked, axis=-1)[:, ::-1]
    emargin = srt[:, top_k - 1] - srt[:, top_k] if top_k < topk_group * per else np.full(n, np.inf)
    return ids, w, np.minimum(gmargin, emargin).astype(np.float32)


def moe_ffn(m, ly, top_k, norm_topk=False, scale=1.0, ids_w=None):
    """sum over the chosen experts e of w_e * expert_e(m) (+ the shared expert, if any); ids_w: the
    (ids, weights) of another router (default: the softmax router)."""
    ids, w = ids_w if ids_w is not None else moe_route(m @ ly["router"].T, top_k, norm_topk, scale)
    out = np.zeros_like(m)
    for e, (g, u, dn) in enumerate(ly["experts"]):
        rows, slot = np.nonzero(ids == e)
        if len(rows):
            out[rows] += w[rows, slot, None] * swiglu_mlp(m[rows], g, u, dn)
    if ly.get("shared") is not None:
        out += swiglu_mlp(m, *ly["shared"])
    return out


def des_route(z, s, b, ids, w_fn, des):
    """Dynamic Expert Sharing (algorithms.md 4) of one MoE layer, written from the spec: z router logits,
    s the unbiased scores, b = s + bias, ids the normal selection [n, K] (descending b). des: dict with
    mode ("seq" | "vote" | "off"), k, m (the coreset size, floor(beta * E)), lo, hi (the rows decoded in
    parallel) and scope ("block" | "all"). Votes V[e] = sum over voting rows of s * 1[e in TopK] in
    float64; Seq C = union of each voting row's first k experts; Vote C = the m experts of highest V among
    V > 0 (ties: lower id); then the best of the rest by (V, lower id) until C holds K experts; no voting
    row: C = every expert. Share rows (the voting rows, or every row with scope all) take their top K of C
    by b (no group limits), weights by w_fn. Returns (ids, weights or None for the normal weights, stats
    [unique experts of all rows, of the voting rows, |C|])."""
    n, E = s.shape
    K = ids.shape[1]
    lo, hi = des["lo"], des["hi"]
    V = np.zeros(E, dtype=np.float64)
    seq = np.zeros(E, dtype=np.int64)
    for r in range(lo, hi):
        for j, e in enumerate(ids[r]):
            V[e] += float(s[r, e])
            seq[e] += 1 if j < des["k"] else 0
    order = sorted(range(E), key=lambda e: (-V[e], e))
    if hi <= lo or des["mode"] == "off":
        core = set(range(E))
    elif des["mode"] == "seq":
        core = {e for e in range(E) if seq[e] > 0}
    else:
        core = set([e for e in order if V[e] > 0][:des["m"]])
    for e in order:
        if len(core) >= K:
            break
        core.add(e)
    ids = ids.copy()
    w = None
    if des["mode"] != "off":
        share = range(n) if des["scope"] == "all" else range(lo, hi)
        allowed = np.array([e in core for e in range(E)])
        for r in share:
            masked = np.where(allowed, b[r], -np.inf)
            ids[r] = np.argsort(-masked, kind="stable")[:K]
        w = w_fn(ids)
    stats = [len(set(ids.ravel().tolist())), len(set(ids[lo:hi].ravel().tolist())), len(core)]
    return ids, w, stats
