#!/usr/bin/env python3
"""Independent numpy forward pass and temperature-0 reference samplers for LLaDA, Dream and LLaDA-MoE.

Written from shared/specs/models.md and shared/specs/algorithms.md section 1 only (never from tessera's
C++ code). All math is fp32 (weights widened from bf16 exactly); sampler probabilities are computed in
float64, as LLaDA's reference code does.

  reference.py logits --model DIR --tokens 5,9,3 [--rows 0,2] --out FILE [--margins FILE2]
      Writes raw little-endian float32 logits [len(rows), vocab] (rows default: every position, in
      order; listed rows are written in the order given). Dream logits are already shifted.
      --margins: float32 [len(rows)], each row's smallest router margin over the MoE layers (k-th
      minus (k+1)-th router logit; inf for dense models): rows near a routing tie.
      --des seq|vote|off --des-rows LO,HI [--des-k 2] [--des-beta 0.4] [--des-scope block|all]
      [--des-stats FILE]: Dynamic Expert Sharing in every MoE layer (des_route); FILE receives per MoE
      layer [unique experts of all rows, of rows LO..HI-1, coreset size].
  reference.py generate --model DIR --prompt 5,9,3 --gen-length 16 --steps 8 --block-length 8
                        --alg low_confidence|entropy|maskgit_plus|topk_margin
      LLaDA2 checkpoints: the LLaDA2 loop instead (generate_llada2: blocks on the attention-block grid,
      --steps per block, --threshold 0.95); prints the canvas trimmed to prompt + gen-length.
      Temperature-0 sampler; prints JSON {"tokens": [...final canvas incl. prompt...],
      "order": [[positions unmasked at step 0], [step 1], ...]} (one list per step; each sorted).

Model (models.md): family from config.json model_type ("llada", "Dream"/"dream", or "lladamoe"/"llada_moe";
"llada" with num_experts and no d_model is LLaDA-MoE too).
  x = embed(tokens); per layer: h = x + o(Attn(RoPE(q(n)), RoPE(k(n)), v(n))), n = RMSNorm(x);
  x = h + down(silu(gate(m)) * up(m)), m = RMSNorm(h); logits = RMSNorm(x) @ head^T.
  - RMSNorm: x / sqrt(mean(x^2) + eps) * w, in fp32.
  - RoPE: rotate-half (NeoX) on absolute positions 0..L-1, inv_freq_i = theta^(-2i/head_dim);
    angles computed in float64 and rounded to fp32, then cos/sin in fp32.
    Config "rope_interleaved": true (tessera's llama2.c conversions) rotates pairs (2i, 2i+1) instead.
  - Attention: scale 1/sqrt(head_dim), GQA (kv head j serves query heads j*H/KV .. (j+1)*H/KV-1),
    bidirectional unless config "is_causal": true. Optional q/k/v biases (Dream; LLaDA include_qkv_bias).
  - LM head: untied, or the embedding when LLaDA "weight_tying" / Dream "tie_word_embeddings".
  - Dream logit shift: logits[i] = head(hidden[i-1]) for i >= 1, logits[0] = head(hidden[0]).
  - LLaDA-MoE: Dream-style names, no biases; qk-norm (qk_layernorm, default true): RMSNorm over each
    head's head_dim values of q and k (weights self_attn.q_norm / k_norm) before RoPE; RoPE on the first
    partial_rotary_factor * head_dim dims of each head (inv_freq over that rotary dim). FFN of a layer with
    moe_layer_freq[i] != 0 (default: every layer): p = softmax(m @ gate^T) in fp32; the top
    num_experts_per_tok experts by p (ties: lower expert id); weights w = p of those experts, NOT
    renormalised unless norm_topk_prob is true, times routed_scaling_factor (default 1);
    out = sum_e w_e * down_e(silu(gate_e(m)) * up_e(m)), plus shared_expert.* (a SwiGLU MLP on every
    row) when shared_expert_intermediate_size is set. moe_layer_freq[i] == 0: the dense mlp.* SwiGLU.

  - LLaDA2 (model_type "llada2_moe", models.md "LLaDA2.0-mini"): model.word_embeddings, fused
    attention.query_key_value (q heads, k heads, v heads), qk-norm (attention.query_layernorm /
    key_layernorm), attention.dense, RoPE on partial_rotary_factor (default 0.5) of each head;
    BLOCK-CAUSAL attention: key j visible to query i iff j // B <= i // B (logits --block B, default 32);
    layers < first_k_dense_replace: dense mlp.*; others: s = sigmoid(m @ gate^T), b = s + expert_bias,
    n_group groups scored by the sum of their top-2 b, topk_group groups kept, top-k experts by b
    inside them, weights s / (sum s + 1e-20) * routed_scaling_factor (UNBIASED s), plus
    mlp.shared_experts.* on every row. Margins: the smaller of the kept-group gap and the expert gap
    in b. Mask / EOS ids from config.json, else tokenizer.json's <|mask|> / <|endoftext|>.

Samplers (algorithms.md 1A/1B), temperature 0. The schedule follows the algorithm:
  - low_confidence: 1A. Blocks of --block-length (must divide gen-length; blocks must divide steps);
    per block n = #masked, step i unmasks n // S + (i < n % S) positions; confidence = softmax(L)[argmax].
  - entropy | maskgit_plus | topk_margin: 1B. ts = linspace(1, 1e-3, S + 1); step i unmasks
    k = int(#masked * (1 - ts[i+1]/ts[i])) positions (all of them on the last step); confidence =
    max prob | sum p log(p + 1e-10) | p1 - p2. With --block-length < gen-length the generation is split
    into blocks the same way as 1A (steps / blocks steps each) and 1B runs inside each block on that
    block's masked positions; with --block-length = gen-length (or 0) it is plain Dream over everything.
  - Candidates are only the masked positions of the current block (never prompt positions).
  - x0 = argmax of the logits; equal logits -> the lowest token id.
  - TIE-BREAKING: positions with equal confidence are ranked lower position first (a stable sort by
    descending confidence). The C++ sampler must do the same.
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_np  # noqa: E402


# ---------------------------------------------------------------------------------------------
# building blocks (also used by selftest.py)
# ---------------------------------------------------------------------------------------------

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


def sparse_patterns(q, k, block, rho, prompt_len, tie=1e-4):
    """SparseD isolated selection of one layer in float64 (Backend::sparse_select): q [Lq, H, hd], k [L, KV,
    hd] post-RoPE. Per head and query block, each key block's importance is the sum over the tile of the
    rows' softmax over all keys (scale 1/sqrt(hd)); the prompt blocks [0, prompt_len // block) and the
    generation blocks keep floor(n * rho) + 1 (at most n) each, ties to the lower block. Returns (mask [H,
    nqb, nkb] uint8, clear [H, nqb] uint8: 0 where a kept and a dropped block are within `tie`)."""
    Lq, H, hd = q.shape
    L, KV = k.shape[0], k.shape[1]
    k = np.repeat(k.astype(np.float64), H // KV, axis=1)
    s = np.einsum("qhd,khd->hqk", q.astype(np.float64), k) / np.sqrt(hd)
    s = np.exp(s - s.max(axis=-1, keepdims=True))
    s /= s.sum(axis=-1, keepdims=True)
    nqb, nkb = -(-Lq // block), -(-L // block)
    pad = np.zeros((H, nqb * block, nkb * block))
    pad[:, :Lq, :L] = s
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


# ---------------------------------------------------------------------------------------------
# model
# ---------------------------------------------------------------------------------------------

class Model:
    """A LLaDA, Dream or LLaDA-MoE checkpoint directory, loaded into fp32 numpy arrays."""

    def __init__(self, model_dir):
        with open(os.path.join(model_dir, "config.json")) as f:
            c = json.load(f)
        self.config = c
        w = safetensors_np.read_dir(model_dir)
        self.causal = bool(c.get("is_causal", False))
        self.interleaved = bool(c.get("rope_interleaved", False))
        mt = c["model_type"]
        self.moe = mt in ("lladamoe", "llada_moe") or (mt == "llada" and "num_experts" in c and "d_model" not in c)
        self.qk_norm = self.moe and c.get("qk_layernorm", True) is not False
        self.block = 0
        if mt == "llada2_moe":
            self._load_llada2(model_dir, c, w)
            return
        if self.moe:
            self.family, self.shift = "llada_moe", False
            d, nl, H = c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"]
            KV = c.get("num_key_value_heads") or H
            self.theta, self.eps = c.get("rope_theta", 10000.0), c.get("rms_norm_eps", 1e-5)
            self.emb, self.norm_f = w["model.embed_tokens.weight"], w["model.norm.weight"]
            self.head = self.emb if c.get("tie_word_embeddings", False) else w["lm_head.weight"]
            names = dict(an="input_layernorm", q="self_attn.q_proj", k="self_attn.k_proj",
                         v="self_attn.v_proj", o="self_attn.o_proj", fn="post_attention_layernorm")
            prefix = lambda i: f"model.layers.{i}."  # noqa: E731
        elif mt == "llada":
            self.family, self.shift = "llada", False
            d, nl, H = c["d_model"], c["n_layers"], c["n_heads"]
            KV = c.get("n_kv_heads") or H
            self.theta, self.eps = c.get("rope_theta", 10000.0), c.get("rms_norm_eps", 1e-5)
            p = "model.transformer."
            self.emb, self.norm_f = w[p + "wte.weight"], w[p + "ln_f.weight"]
            self.head = self.emb if c.get("weight_tying", False) else w[p + "ff_out.weight"]
            names = dict(an="attn_norm", q="q_proj", k="k_proj", v="v_proj", o="attn_out", fn="ff_norm",
                         g="ff_proj", u="up_proj", dn="ff_out")
            prefix = lambda i: f"{p}blocks.{i}."  # noqa: E731
        elif mt in ("Dream", "dream"):
            self.family, self.shift = "dream", True
            d, nl, H = c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"]
            KV = c.get("num_key_value_heads") or H
            self.theta, self.eps = c.get("rope_theta", 10000.0), c.get("rms_norm_eps", 1e-6)
            self.emb, self.norm_f = w["model.embed_tokens.weight"], w["model.norm.weight"]
            self.head = self.emb if c.get("tie_word_embeddings", False) else w["lm_head.weight"]
            names = dict(an="input_layernorm", q="self_attn.q_proj", k="self_attn.k_proj",
                         v="self_attn.v_proj", o="self_attn.o_proj", fn="post_attention_layernorm",
                         g="mlp.gate_proj", u="mlp.up_proj", dn="mlp.down_proj")
            prefix = lambda i: f"model.layers.{i}."  # noqa: E731
        else:
            raise SystemExit(f"unsupported model_type {mt!r}")
        if "mask_token_id" not in c:
            raise SystemExit("config.json has no mask_token_id")
        self.mask_id = int(c["mask_token_id"])
        self.layers = []
        for i in range(nl):
            b = prefix(i)
            ly = {key: w[b + n + ".weight"] for key, n in names.items()}
            for key in ("q", "k", "v"):
                ly["b" + key] = w.get(b + names[key] + ".bias")
            if self.moe:
                self._load_moe_layer(c, w, b, i, ly)
            self.layers.append(ly)
        self.d, self.H, self.KV = d, H, KV
        self.hd = c.get("head_dim") or d // H
        self.rotary_dim = int(round(self.hd * (c.get("partial_rotary_factor") or 1.0)))
        self.vocab = self.head.shape[0]

    def _load_llada2(self, model_dir, c, w):
        """LLaDA2.0 (models.md "LLaDA2.0-mini"): fused attention.query_key_value rows (H q heads, then KV
        k heads, then KV v heads), qk-norm (attention.query_layernorm / key_layernorm), RoPE on
        partial_rotary_factor (default 0.5) of each head, block-causal attention (block = the
        generation's block length, default 32), dense FFN below first_k_dense_replace, else the grouped
        sigmoid router with mlp.gate.expert_bias plus mlp.shared_experts (moe_intermediate_size *
        num_shared_experts). Mask / EOS ids: config.json, else tokenizer.json's <|mask|> / <|endoftext|>."""
        self.family, self.shift, self.moe, self.block = "llada2", False, True, 32
        d, nl, H, KV = c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"], c["num_key_value_heads"]
        hd = c.get("head_dim") or d // H
        self.theta, self.eps = c.get("rope_theta", 10000.0), c.get("rms_norm_eps", 1e-5)
        self.emb, self.norm_f = w["model.word_embeddings.weight"], w["model.norm.weight"]
        self.head = self.emb if c.get("tie_word_embeddings", False) else w["lm_head.weight"]
        self.qk_norm = c.get("use_qk_norm", True)
        specials = {}
        with open(os.path.join(model_dir, "tokenizer.json"), encoding="utf-8") as f:
            for t in json.load(f).get("added_tokens", []):
                specials[t["content"]] = t["id"]
        self.mask_id = int(c.get("mask_token_id", specials.get("<|mask|>", -1)))
        self.eos_id = int(c.get("eos_token_id", specials.get("<|endoftext|>", -1)))
        self.top_k, self.scale = c["num_experts_per_tok"], c.get("routed_scaling_factor", 2.5)
        self.n_group, self.topk_group = c.get("n_group", 8), c.get("topk_group", 4)
        mlp = lambda p: tuple(w[f"{p}{n}_proj.weight"] for n in ("gate", "up", "down"))  # noqa: E731
        self.layers = []
        for i in range(nl):
            b = f"model.layers.{i}."
            qkv = w[b + "attention.query_key_value.weight"]
            ly = {"an": w[b + "input_layernorm.weight"], "q": qkv[: H * hd], "k": qkv[H * hd:(H + KV) * hd],
                  "v": qkv[(H + KV) * hd:], "o": w[b + "attention.dense.weight"],
                  "fn": w[b + "post_attention_layernorm.weight"], "bq": None}
            if c.get("use_qkv_bias", False):
                bias = w[b + "attention.query_key_value.bias"]
                ly["bq"], ly["bk"], ly["bv"] = bias[: H * hd], bias[H * hd:(H + KV) * hd], bias[(H + KV) * hd:]
            if self.qk_norm:
                ly["qn"], ly["kn"] = w[b + "attention.query_layernorm.weight"], w[b + "attention.key_layernorm.weight"]
            if i < c.get("first_k_dense_replace", 0):
                ly["dense"] = mlp(b + "mlp.")
            else:
                ly["router"], ly["bias"] = w[b + "mlp.gate.weight"], w[b + "mlp.gate.expert_bias"]
                ly["experts"] = [mlp(f"{b}mlp.experts.{e}.") for e in range(c["num_experts"])]
                ly["shared"] = mlp(b + "mlp.shared_experts.") if c.get("num_shared_experts") else None
            self.layers.append(ly)
        self.d, self.H, self.KV, self.hd = d, H, KV, hd
        self.rotary_dim = int(round(hd * c.get("partial_rotary_factor", 0.5)))
        self.interleaved, self.causal = False, False
        self.vocab = self.head.shape[0]

    def _load_moe_layer(self, c, w, b, i, ly):
        """LLaDA-MoE: q/k norms and the FFN of layer i (experts + router, or the dense MLP)."""
        mlp = lambda p: tuple(w[f"{p}{n}_proj.weight"] for n in ("gate", "up", "down"))  # noqa: E731
        if self.qk_norm:
            ly["qn"], ly["kn"] = w[b + "self_attn.q_norm.weight"], w[b + "self_attn.k_norm.weight"]
        freq = c.get("moe_layer_freq") or [1] * c["num_hidden_layers"]
        if freq[i] == 0:
            ly["dense"] = mlp(b + "mlp.")
            return
        ly["router"] = w[b + "mlp.gate.weight"]
        ly["experts"] = [mlp(f"{b}mlp.experts.{e}.") for e in range(c["num_experts"])]
        ly["shared"] = mlp(b + "shared_expert.") if c.get("shared_expert_intermediate_size") else None
        self.top_k = c["num_experts_per_tok"]
        self.norm_topk = bool(c.get("norm_topk_prob") or False)
        self.scale = c.get("routed_scaling_factor") or 1.0

    def ffn(self, m, ly):
        """The FFN of one layer on the normed rows m (MoE layers also lower self.margins; with self.des
        set, DES routing, and self.des_stats receives the layer's counts)."""
        des = getattr(self, "des", None)
        if "router" in ly and "bias" in ly:  # LLaDA2
            z = m @ ly["router"].T
            ids, wts, margin = sigmoid_group_route(z, ly["bias"], self.top_k, self.n_group,
                                                   self.topk_group, self.scale)
            self.margins = np.minimum(self.margins, margin)
            if des:
                s = (np.float32(1.0) / (np.float32(1.0) + np.exp(-z))).astype(np.float32)
                b = (s + ly["bias"][None, :]).astype(np.float32)

                def w_fn(ids_):
                    w = np.take_along_axis(s, ids_, axis=-1)
                    if self.top_k > 1:
                        w = w / (w.sum(axis=-1, keepdims=True) + np.float32(1e-20))
                    return (w * np.float32(self.scale)).astype(np.float32)
                ids, w2, st = des_route(z, s, b, ids, w_fn, des)
                wts = w2 if w2 is not None else wts
                self.des_stats.append(st)
            return moe_ffn(m, ly, self.top_k, ids_w=(ids, wts))
        if "router" in ly:
            z = m @ ly["router"].T
            self.margins = np.minimum(self.margins, route_margin(z, self.top_k))
            if des:
                ids, wts = moe_route(z, self.top_k, self.norm_topk, self.scale)
                zz = np.asarray(z, dtype=np.float32)
                s = np.exp(zz - zz.max(axis=-1, keepdims=True))
                s = (s / s.sum(axis=-1, keepdims=True)).astype(np.float32)

                def w_fn(ids_):
                    w = np.take_along_axis(s, ids_, axis=-1)
                    if self.norm_topk:
                        w = w / w.sum(axis=-1, keepdims=True)
                    return (w * np.float32(self.scale)).astype(np.float32)
                ids, w2, st = des_route(z, s, s, ids, w_fn, des)
                self.des_stats.append(st)
                return moe_ffn(m, ly, self.top_k, ids_w=(ids, w2 if w2 is not None else wts))
            return moe_ffn(m, ly, self.top_k, self.norm_topk, self.scale)
        if "dense" in ly:
            return swiglu_mlp(m, *ly["dense"])
        return swiglu_mlp(m, ly["g"], ly["u"], ly["dn"])

    def hidden(self, tokens, record=None, cached=None, record_q=None, patterns=None, sparse_block=0):
        """Final-norm hidden states [L, d] (before the LM head). record: a list that receives every
        layer's post-RoPE (K, V) of all rows. cached = (rows, kv): a KV-cache step, computing only the
        ascending rows `rows` (returns their hidden states); the other rows' K / V come from kv (a record
        of at least len(tokens) rows).
        record_q: a list that receives every layer's post-RoPE Q. patterns [layers, H, nqb, nkb] (SparseD
        tiles of sparse_block rows): attention sees only the kept tiles."""
        tokens = np.asarray(tokens, dtype=np.int64)
        if tokens.min() < 0 or tokens.max() >= self.emb.shape[0]:
            raise SystemExit("token id outside the vocabulary")
        pos = np.asarray(cached[0], dtype=np.int64) if cached else np.arange(len(tokens))
        n = len(pos)
        self.margins = np.full(n, np.inf, dtype=np.float32)  # smallest router margin of each row
        x = self.emb[tokens[pos]].astype(np.float32)
        for li, ly in enumerate(self.layers):
            h = rms_norm(x, ly["an"], self.eps)
            q, k, v = h @ ly["q"].T, h @ ly["k"].T, h @ ly["v"].T
            if ly["bq"] is not None:
                q, k, v = q + ly["bq"], k + ly["bk"], v + ly["bv"]
            q, k = q.reshape(n, self.H, self.hd), k.reshape(n, self.KV, self.hd)
            if "qn" in ly:
                q, k = rms_norm(q, ly["qn"], self.eps), rms_norm(k, ly["kn"], self.eps)
            q = apply_rope(q, pos, self.theta, self.interleaved, self.rotary_dim)
            k = apply_rope(k, pos, self.theta, self.interleaved, self.rotary_dim)
            v = v.reshape(n, self.KV, self.hd).astype(np.float32)
            if cached:
                k_all, v_all = cached[1][li][0][:len(tokens)].copy(), cached[1][li][1][:len(tokens)].copy()
                k_all[pos], v_all[pos] = k, v
                k, v = k_all, v_all
            if record is not None:
                record.append((k, v))
            if record_q is not None:
                record_q.append(q)
            keep = None
            if patterns is not None:
                t = np.repeat(np.repeat(patterns[li] != 0, sparse_block, axis=1), sparse_block, axis=2)
                keep = t[:, :n, :k.shape[0]]
            att = attention(q, k, v, self.causal, self.block, pos, keep).reshape(n, self.H * self.hd)
            x = x + att @ ly["o"].T
            x = x + self.ffn(rms_norm(x, ly["fn"], self.eps), ly)
        return rms_norm(x, self.norm_f, self.eps)

    def forward(self, tokens):
        """Logits [L, vocab] in fp32 (Dream: shifted)."""
        logits = (self.hidden(tokens) @ self.head.T).astype(np.float32)
        return shift_logits(logits) if self.shift else logits


# ---------------------------------------------------------------------------------------------
# samplers (temperature 0)
# ---------------------------------------------------------------------------------------------

def softmax64(logits):
    l = np.asarray(logits, dtype=np.float64)
    l = l - l.max(axis=-1, keepdims=True)
    p = np.exp(l)
    return p / p.sum(axis=-1, keepdims=True)


def confidence(probs, alg):
    """(x0, conf) per row of probs [n, V]; higher conf = more certain."""
    x0 = probs.argmax(axis=-1)  # first maximum = lowest token id on ties
    if alg in ("low_confidence", "maskgit_plus"):
        c = probs[np.arange(len(x0)), x0]
    elif alg == "topk_margin":
        srt = np.sort(probs, axis=-1)
        c = srt[:, -1] - srt[:, -2]
    elif alg == "entropy":
        c = (probs * np.log(probs + 1e-10)).sum(axis=-1)
    else:
        raise SystemExit(f"unsupported alg {alg!r} (low_confidence, entropy, maskgit_plus, topk_margin)")
    return x0, c


def top_positions(positions, conf, k):
    """The k candidate positions with the highest confidence; equal confidences -> lower position
    first (stable sort by descending confidence, candidates given in increasing position)."""
    order = sorted(range(len(positions)), key=lambda r: (-conf[r], positions[r]))
    return [r for r in order[:k]]


def llada_schedule(n, steps):
    """1A: n // S + (i < n % S) tokens at step i."""
    return [n // steps + (1 if i < n % steps else 0) for i in range(steps)]


def dream_count(n_masked, i, steps, eps=1e-3):
    """1B: int(#masked * (1 - s/t)) with ts = linspace(1, eps, steps+1); all of them on the last step."""
    ts = np.linspace(1, eps, steps + 1)
    if i == steps - 1:
        return n_masked
    return int(n_masked * (1 - ts[i + 1] / ts[i]))


def generate(m, prompt, gen_length, steps, block_length, alg, eps=1e-3):
    """Returns (final canvas, order: one sorted list of unmasked positions per step)."""
    if block_length <= 0:
        block_length = gen_length
    if gen_length % block_length:
        raise SystemExit("gen-length must be a multiple of block-length")
    nb = gen_length // block_length
    if steps % nb:
        raise SystemExit("steps must be a multiple of gen-length / block-length")
    spb = steps // nb
    x = list(prompt) + [m.mask_id] * gen_length
    P = len(prompt)
    order = []
    for b in range(nb):
        lo, hi = P + b * block_length, P + (b + 1) * block_length
        sched = llada_schedule(sum(1 for j in range(lo, hi) if x[j] == m.mask_id), spb)
        for i in range(spb):
            cand = [j for j in range(lo, hi) if x[j] == m.mask_id]
            k = sched[i] if alg == "low_confidence" else dream_count(len(cand), i, spb, eps)
            k = min(k, len(cand))
            if k == 0:
                order.append([])
                continue
            probs = softmax64(m.forward(x)[cand])
            x0, conf = confidence(probs, alg)
            sel = top_positions(cand, conf, k)
            for r in sel:
                x[cand[r]] = int(x0[r])
            order.append(sorted(cand[r] for r in sel))
    return x, order


def generate_window(m, prompt, gen_length, steps, block_length, alg, w_ex, w_in, refresh, early_eos=(),
                    eps=1e-3):
    """Window-Diffusion (algorithms.md 3) over generate()'s blocks and schedules, temperature 0.
    Positions >= stop are dropped (early stop: after a token of early_eos is decided at p, stop = p + 1).
    A phase starts at a step when `refresh` forwards have run in the current one (refresh 0: at every
    step), or when the current phase has no candidate left. At its start: u0 = the first masked position
    (>= len(prompt), < stop); the external window is the first w_ex masked positions from u0 and ends at
    E (one past the w_ex-th, or stop); phase_rows = those positions. Every forward sees x[:min(E, stop)].
    Each step: active = the first w_in masked positions of [u0, min(E, stop)); the candidates are the
    active positions inside the block (and < stop). refresh 0: a plain forward. The phase's first
    forward: a full forward whose K / V of every layer are kept. Later ones compute only the rows of
    phase_rows before the end of the active set (plus the logit rows of the candidates) with the other
    rows' K / V from the kept ones, and keep the result. The block's count k (LLaDA: schedule +
    owed; Dream: from the block's masked count) is capped at the candidates; LLaDA owes the rest to the
    next step. After the block's schedule, every candidate is decided per step until the block is.
    Positions never decided after an early stop read as the stopping token."""
    if block_length <= 0:
        block_length = gen_length
    nb = gen_length // block_length
    spb = steps // nb
    P = len(prompt)
    x = list(prompt) + [m.mask_id] * gen_length
    st = dict(stop=len(x), left=0, u0=0, E=0, rows=[], fresh=False, kv=None, a_end=0)
    order = []

    def masked(lo, hi):
        return [j for j in range(lo, hi) if x[j] == m.mask_id]

    def new_phase():
        free = masked(P, st["stop"])
        st["u0"] = free[0] if free else st["stop"]
        st["rows"] = free[:w_ex]
        st["E"] = free[w_ex - 1] + 1 if len(free) >= w_ex else st["stop"]
        st["left"], st["fresh"] = refresh, True

    def prepare(lo, hi):
        started = False
        if st["left"] <= 0:
            new_phase()
            started = True
        while True:
            act = masked(st["u0"], min(st["E"], st["stop"]))[:w_in]
            st["a_end"] = act[-1] + 1 if act else st["u0"]
            cand = [j for j in act if lo <= j < min(hi, st["stop"])]
            if cand or started:
                return cand
            new_phase()
            started = True

    def predict(cand):
        n = min(st["E"], st["stop"])
        src = [max(j - 1, 0) if m.shift else j for j in cand]
        if refresh == 0:
            H, rows = m.hidden(x[:n]), list(range(n))
        elif st["fresh"]:
            kv = []
            H, rows = m.hidden(x[:n], record=kv), list(range(n))
            st["kv"] = kv
        else:
            rows = sorted(set([r for r in st["rows"] if r < st["a_end"] and r < n] + src))
            kv = []
            H = m.hidden(x[:n], cached=(rows, st["kv"]), record=kv)
            st["kv"] = kv
        st["fresh"] = False
        st["left"] -= 1
        L = (H[[rows.index(r) for r in src]] @ m.head.T).astype(np.float32)
        return confidence(softmax64(L), alg)

    def commit(cand, x0, sel):
        for r in sel:
            x[cand[r]] = int(x0[r])
            if x0[r] in early_eos:
                st["stop"] = min(st["stop"], cand[r] + 1)
        order.append(sorted(cand[r] for r in sel))

    for b in range(nb):
        lo, hi = P + b * block_length, P + (b + 1) * block_length
        sched = llada_schedule(len(masked(lo, min(hi, st["stop"]))), spb)
        owed = 0
        for i in range(spb):
            if alg == "low_confidence":
                k = sched[i] + owed
            else:
                n_masked = len(masked(lo, min(hi, st["stop"])))
                if n_masked == 0:
                    continue
                k = dream_count(n_masked, i, spb, eps)
            if k == 0:
                continue
            cand = prepare(lo, hi)
            if not cand:
                break
            x0, conf = predict(cand)
            kk = min(k, len(cand))
            owed = k - kk
            commit(cand, x0, top_positions(cand, conf, kk))
        while True:
            cand = prepare(lo, hi)
            if not cand:
                break
            x0, conf = predict(cand)
            commit(cand, x0, list(range(len(cand))))
    for j in range(st["stop"], len(x)):
        if x[j] == m.mask_id:
            x[j] = x[st["stop"] - 1]
    return x, order


def generate_llada2(m, prompt, gen_length, steps, block_length, threshold):
    """LLaDA2's block-diffusion loop (algorithms.md 1C; LLaDA2MoeModelLM.generate), temperature 0.
    Blocks are the model's attention blocks on absolute positions [b*BL, (b+1)*BL); the canvas is
    padded with masks to whole blocks; blocks from the one holding position len(prompt) on. Each
    forward sees x[:block end] with the block-causal mask of block BL. Per block, at most `steps`
    steps; step i decides the masked positions of the block with conf > threshold if there are at
    least sched[i] of them (sched = llada_schedule(BL, steps)), else the sched[i] most confident
    (at least one). x0 = argmax (the reference samples even at temperature 0; greedy is the intent).
    After a block holding an EOS in x[P:block end], later blocks are skipped. Returns (canvas
    trimmed to prompt + gen_length, order)."""
    P, BL = len(prompt), block_length
    total = (P + gen_length + BL - 1) // BL * BL
    x = list(prompt) + [m.mask_id] * (total - P)
    sched = llada_schedule(BL, steps)
    m.block = BL
    order = []
    for b in range(P // BL, total // BL):
        end = (b + 1) * BL
        for i in range(steps):
            cand = [j for j in range(max(b * BL, P), end) if x[j] == m.mask_id]
            if not cand:
                break
            probs = softmax64(m.forward(x[:end])[cand])
            x0, conf = confidence(probs, "low_confidence")
            high = [r for r in range(len(cand)) if conf[r] > threshold]
            k = max(1, sched[i])
            sel = high if len(high) >= k else top_positions(cand, conf, min(k, len(cand)))
            for r in sel:
                x[cand[r]] = int(x0[r])
            order.append(sorted(cand[r] for r in sel))
        if m.eos_id in x[P:end]:
            break
    return x[:P + gen_length], order


# ---------------------------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------------------------

def ids(s):
    return [int(t) for t in s.split(",") if t.strip()]


def main():
    ap = argparse.ArgumentParser(description="numpy reference for tessera (LLaDA / Dream / LLaDA-MoE)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("logits")
    a.add_argument("--model", required=True)
    a.add_argument("--tokens", required=True)
    a.add_argument("--rows", default="")
    a.add_argument("--out", required=True)
    a.add_argument("--margins", default="", help="also write each row's smallest router margin (f32)")
    a.add_argument("--block", type=int, default=32, help="LLaDA2: the attention block (generation block length)")
    a.add_argument("--cache-tokens", default="",
                   help="KV-cache step: the canvas whose full forward filled the cache (same length as --tokens)")
    a.add_argument("--compute", default="", help="KV-cache step: LO,HI, the rows of --tokens computed")
    a.add_argument("--compute-rows", default="", help="KV-cache step: the (ascending) rows of --tokens computed")
    a.add_argument("--sparse-patterns", default="",
                   help="SparseD: attend only to the kept tiles of this uint8 file [layers, H, nqb, nkb]")
    a.add_argument("--sparse-block", type=int, default=32, help="SparseD: the tile side")
    a.add_argument("--des", default="", help="DES: off | seq | vote (MoE models; des_route)")
    a.add_argument("--des-k", type=int, default=2, help="DES-Seq: experts per voting row in the union")
    a.add_argument("--des-beta", type=float, default=0.4, help="DES-Vote: coreset size floor(beta * E)")
    a.add_argument("--des-rows", default="", help="DES: LO,HI, the rows decoded in parallel")
    a.add_argument("--des-scope", default="block", help="DES: block | all")
    a.add_argument("--des-stats", default="", help="DES: write JSON [[unique, unique of voting rows, |C|], ...] per MoE layer")
    sp = sub.add_parser("patterns", help="SparseD patterns of every layer from the forward over --tokens")
    sp.add_argument("--model", required=True)
    sp.add_argument("--tokens", required=True)
    sp.add_argument("--block", type=int, required=True)
    sp.add_argument("--rho", type=float, required=True)
    sp.add_argument("--prompt-len", type=int, required=True)
    sp.add_argument("--out", required=True, help="uint8 [layers, H, nqb, nkb]")
    sp.add_argument("--clear", required=True, help="uint8 [layers, H, nqb]: 0 where the selection is a near tie")
    g = sub.add_parser("generate")
    g.add_argument("--model", required=True)
    g.add_argument("--prompt", required=True)
    g.add_argument("--gen-length", type=int, required=True)
    g.add_argument("--steps", type=int, required=True)
    g.add_argument("--block-length", type=int, default=0)
    g.add_argument("--alg", default="low_confidence")
    g.add_argument("--threshold", type=float, default=0.95, help="LLaDA2 only: the confidence threshold")
    g.add_argument("--window", default="", help="Window-Diffusion: W_EX,W_IN,REFRESH (generate_window)")
    g.add_argument("--early-eos", default="", help="Window-Diffusion early stop at these token ids")
    args = ap.parse_args()
    m = Model(args.model)
    if args.cmd == "patterns":
        qs, kv = [], []
        m.hidden(ids(args.tokens), record=kv, record_q=qs)
        out = [sparse_patterns(q, k, args.block, args.rho, args.prompt_len) for q, (k, _) in zip(qs, kv)]
        np.stack([o[0] for o in out]).tofile(args.out)
        np.stack([o[1] for o in out]).tofile(args.clear)
        return
    if args.cmd == "logits":
        if m.family == "llada2":
            m.block = args.block
        if args.des:
            lo, hi = ids(args.des_rows)
            E = m.config.get("num_experts")
            m.des = dict(mode=args.des, k=args.des_k, m=max(1, min(E, int(np.floor(args.des_beta * E)))),
                         lo=lo, hi=hi, scope=args.des_scope)
            m.des_stats = []
        toks = ids(args.tokens)
        rows = ids(args.rows)
        if args.cache_tokens:  # logits of positions `rows`, from a KV-cache step over rows [lo, hi)
            if args.compute_rows:
                comp = ids(args.compute_rows)
            else:
                lo, hi = ids(args.compute)
                comp = list(range(lo, hi))
            kv = []
            m.hidden(ids(args.cache_tokens), record=kv)
            H = m.hidden(toks, cached=(comp, kv))
            src = [max(r - 1, 0) if m.shift else r for r in rows]
            if any(r not in comp for r in src):
                raise SystemExit("a row's hidden state is outside the computed rows")
            L = (H[[comp.index(r) for r in src]] @ m.head.T).astype(np.float32)
            np.ascontiguousarray(L, dtype="<f4").tofile(args.out)
            return
        if args.sparse_patterns:
            n, nb = len(toks), -(-len(toks) // args.sparse_block)
            pat = np.fromfile(args.sparse_patterns, dtype=np.uint8).reshape(len(m.layers), m.H, nb, nb)
            L = (m.hidden(toks, patterns=pat, sparse_block=args.sparse_block) @ m.head.T).astype(np.float32)
            L = shift_logits(L) if m.shift else L
        else:
            L = m.forward(toks)
        if rows:
            if min(rows) < 0 or max(rows) >= len(toks):
                raise SystemExit("row outside the token list")
            L = L[rows]
        np.ascontiguousarray(L, dtype="<f4").tofile(args.out)
        if args.des_stats:
            with open(args.des_stats, "w") as f:
                json.dump(m.des_stats, f)
        if args.margins:
            mg = m.margins[rows] if rows else m.margins
            np.ascontiguousarray(mg, dtype="<f4").tofile(args.margins)
    else:
        if m.family == "llada2":
            x, order = generate_llada2(m, ids(args.prompt), args.gen_length, args.steps, args.block_length or 32,
                                       args.threshold)
        elif args.window:
            w_ex, w_in, refresh = ids(args.window)
            x, order = generate_window(m, ids(args.prompt), args.gen_length, args.steps, args.block_length,
                                       args.alg, w_ex, w_in, refresh, tuple(ids(args.early_eos)))
        else:
            x, order = generate(m, ids(args.prompt), args.gen_length, args.steps, args.block_length, args.alg)
        print(json.dumps({"tokens": x, "order": order}))


if __name__ == "__main__":
    main()
