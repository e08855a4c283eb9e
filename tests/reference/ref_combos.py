"""LLaDA2 (block-causal) feature combinations of the numpy reference (reference.py generate on a llada2_moe
checkpoint), temperature 0: Window-Diffusion inside LLaDA2's block loop (generate_llada2_window, --window)
and SparseD per block, uncached or with LLaDA2's exact KV cache (generate_llada2_sparse, --sparse
[--cache prefix]). Written from shared/specs/algorithms.md (1C, 2, 3) and the combination semantics
documented below, never from tessera's C++ code. `m` is a reference.Model. Re-exported by reference.py.
The bidirectional combinations (SparseD inside the window, SparseD with cfg) are in ref_loops.py."""
import numpy as np

from ref_layers import sparse_patterns
from ref_loops import softmax64, confidence, top_positions, llada_schedule, rows_logits


def llada2_decide(cand, L, threshold, sched, i):
    """LLaDA2's decision of step i of a block among the candidates from their logits L (generate_llada2):
    (x0, the chosen candidate indices). high = the candidates with conf > threshold (strict); k =
    max(1, sched[i]) capped at len(cand); high if len(high) >= k, else the k most confident (ties to the
    lower position). Past the schedule (i >= len(sched): a window held the block back) every candidate
    is decided, as generate_window does after a block's schedule."""
    x0, conf = confidence(softmax64(L), "low_confidence")
    if i >= len(sched):
        return x0, list(range(len(cand)))
    high = [r for r in range(len(cand)) if conf[r] > threshold]
    k = min(max(1, sched[i]), len(cand))
    return x0, high if len(high) >= k else top_positions(cand, conf, k)


def llada2_canvas(m, prompt, gen_length, block_length):
    """(padded canvas: prompt + masks up to a whole number of blocks, its length); sets m.block."""
    total = (len(prompt) + gen_length + block_length - 1) // block_length * block_length
    m.block = block_length
    return list(prompt) + [m.mask_id] * (total - len(prompt)), total


def generate_llada2_window(m, prompt, gen_length, steps, block_length, threshold, w_ex, w_in, refresh,
                           info=None):
    """Window-Diffusion (algorithms.md 3) inside LLaDA2's block loop (generate_llada2), temperature 0.
    Blocks, schedule (sched = llada_schedule(BL, steps), i counts the block's steps), threshold (strict >)
    and the EOS stop (a block holding EOS in x[P:end] ends the generation) are generate_llada2's; every
    forward uses the block-causal mask of block BL. Every block starts a new phase. At a phase start:
    u0 = the first masked position of [max(b * BL, P), end); E = one past the w_ex-th masked position
    counted from u0 within [u0, end), or end if there are fewer; phase_rows = those masked positions;
    the view is x[:E]. Each step: the candidates (the active set) are the first w_in masked positions of
    [u0, E); llada2_decide picks among them (k = max(1, sched[i]) capped at the candidates; past the
    block's `steps` steps every candidate). A phase ends after `refresh` forwards, or when its window has
    no masked position left (the next step starts a new phase in the block); the block ends when none of
    its positions is masked. refresh 0: every step is a new phase and a plain forward over x[:E].
    refresh > 0: the phase's first forward is a full forward over the view keeping every layer's post-RoPE
    K / V; later forwards of the phase compute only the rows of phase_rows before the end of the active
    set (one past the last candidate), plus the candidates' rows, the other rows' K / V from the kept
    ones, and keep the result (as generate_window). info: a dict that receives "calls": per forward
    (view length, None for a plain forward | "refresh" | the computed rows). Returns (canvas trimmed to
    P + gen_length, order)."""
    P, BL = len(prompt), block_length
    x, total = llada2_canvas(m, prompt, gen_length, BL)
    sched = llada_schedule(BL, steps)
    order, st, calls = [], {}, []

    def masked(lo, hi):
        return [j for j in range(lo, hi) if x[j] == m.mask_id]

    for b in range(P // BL, total // BL):
        start, end = max(b * BL, P), (b + 1) * BL
        st["left"], i = 0, 0
        while True:
            if st["left"] <= 0 or not masked(st["u0"], st["E"]):  # a new phase
                free = masked(start, end)
                st["u0"] = free[0] if free else end
                st["rows"] = free[:w_ex]
                st["E"] = free[w_ex - 1] + 1 if len(free) >= w_ex else end
                st["left"], st["fresh"] = refresh, True
            cand = masked(st["u0"], st["E"])[:w_in]
            if not cand:  # a new phase found nothing masked: the block is done
                break
            if refresh == 0:
                spec = None
            elif st["fresh"]:
                spec = "refresh"
            else:
                spec = [r for r in st["rows"] if r <= cand[-1]]
            st["fresh"] = False
            st["left"] -= 1
            calls.append((st["E"], spec if spec is None or spec == "refresh" else sorted(set(spec) | set(cand))))
            x0, sel = llada2_decide(cand, rows_logits(m, x[:st["E"]], spec, cand, st, "c"), threshold, sched, i)
            for r in sel:
                x[cand[r]] = int(x0[r])
            order.append(sorted(cand[r] for r in sel))
            i += 1
        if m.eos_id in x[P:end]:
            break
    if info is not None:
        info["calls"] = calls
    return x[:P + gen_length], order


def generate_llada2_sparse(m, prompt, gen_length, steps, block_length, threshold, sparse=None, cache=None,
                           info=None):
    """SparseD (algorithms.md 2) per block of LLaDA2's loop (generate_llada2's blocks, schedule, threshold
    and EOS stop), temperature 0; sparse: dict(block, rho, skip) or None (the loop, or the cache, alone).
    In every block, with s = floor(steps * skip) (skip rounded to fp32): the block's forwards with index
    (within the block) < s attend exactly; forward s attends exactly and SELECTS; the block's later
    forwards attend sparsely. The selection: per layer, sparse_patterns over the forward's computed
    query rows (at their positions) and all its keys [0, end), the importance from the block-causal-masked
    attention probabilities (masked keys contribute 0), the keep counts and the isolated prompt /
    generation split of the bidirectional case (prompt key blocks [0, P // block), the rest of the
    key blocks of [0, end)); tiles are indexed by absolute position over the strides of the whole padded
    canvas, and the selection writes the pattern rows of the computed rows' query blocks only (a query
    block that straddles the first computed row is ranked from the computed rows it holds). A sparse
    forward's computed row at position p attends only to the key tiles kept in pattern row p // block
    (and the block-causal mask still applies).
    cache None: every forward computes x[:end] (the selection covers every query block of [0, end)).
    cache "prefix" (LLaDA2's KV cache, exact without sparsity): the first forward of the request computes
    every row of x[:end] (nothing is cached yet); the first forward of every later block computes rows
    [(b - 1) * BL, end) (the previous block's rows were computed before it was final), later forwards
    rows [b * BL, end); the other rows' post-RoPE K / V come from the cache, and the computed rows' K / V
    are written into it. info: a dict that receives "calls": per forward (block, i, "exact" | "select" |
    "sparse", first computed row, end). Returns (canvas trimmed to P + gen_length, order)."""
    if cache not in (None, "prefix"):
        raise SystemExit(f"LLaDA2: unknown cache {cache!r} (prefix)")
    P, BL = len(prompt), block_length
    x, total = llada2_canvas(m, prompt, gen_length, BL)
    sched = llada_schedule(BL, steps)
    sb = sparse["block"] if sparse else 1
    s_at = int(np.floor(steps * np.float64(np.float32(sparse["skip"])))) if sparse else -1
    nb = -(-total // sb)
    pats = np.zeros((len(m.layers), m.H, nb, nb), dtype=np.uint8) if sparse else None
    kv, order, calls = None, [], []
    for b in range(P // BL, total // BL):
        start, end = max(b * BL, P), (b + 1) * BL
        for i in range(steps):
            cand = [j for j in range(start, end) if x[j] == m.mask_id]
            if not cand:
                break
            if cache is None or kv is None:
                rows = list(range(end))
            else:
                rows = list(range(max(0, (b - 1) * BL) if i == 0 else b * BL, end))
            mode = "exact" if not sparse or i < s_at else "select" if i == s_at else "sparse"
            calls.append((b, i, mode, rows[0], end))
            qs, rec = ([] if mode == "select" else None), []
            kw = dict(patterns=pats, sparse_block=sb) if mode == "sparse" else {}
            cached = None if len(rows) == end else (rows, kv)
            H = m.hidden(x[:end], record=rec, record_q=qs, cached=cached, **kw)
            if cache:
                if kv is None:
                    kv = [tuple(np.zeros((total,) + t.shape[1:], np.float32) for t in kv_) for kv_ in rec]
                for (K, V), (k, v) in zip(kv, rec):
                    K[:end], V[:end] = k, v
            if mode == "select":
                qb = sorted({r // sb for r in rows})
                nkb = -(-end // sb)
                for li, (q, (k, _)) in enumerate(zip(qs, rec)):
                    mask = sparse_patterns(q, k, sb, sparse["rho"], P, attn_block=BL, q_pos=rows)[0]
                    pats[li][:, qb, :] = 0
                    pats[li][:, qb, :nkb] = mask[:, qb]
            L = (H[[rows.index(j) for j in cand]] @ m.head.T).astype(np.float32)
            x0, sel = llada2_decide(cand, L, threshold, sched, i)
            for r in sel:
                x[cand[r]] = int(x0[r])
            order.append(sorted(cand[r] for r in sel))
        if m.eos_id in x[P:end]:
            break
    if info is not None:
        info["calls"] = calls
    return x[:P + gen_length], order
