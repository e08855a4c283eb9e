"""Temperature-0 unmasking loops of the numpy reference (reference.py generate): LLaDA 1A, Dream 1B, the
Fast-dLLM KV caches (1D), infilling, SparseD (2), Window-Diffusion (3) and LLaDA2's block diffusion (1C),
and their combinations with classifier-free guidance (1A's cfg), DES (4) and SparseD (with cfg, inside
the window; LLaDA2's combinations are in ref_combos.py), written from shared/specs/algorithms.md and
tessera's documented loop semantics (src/decode/generate.h's comments), never from tessera's C++ code.
`m` is a reference.Model. Re-exported by reference.py."""
import numpy as np

from ref_layers import sparse_patterns


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


def log_softmax64(logits):
    l = np.asarray(logits, dtype=np.float64)
    l = l - l.max(axis=-1, keepdims=True)
    return l - np.log(np.exp(l).sum(axis=-1, keepdims=True))


def des_setup(m, des):
    """Sets m.des for a generation's DES (algorithms.md 4; des: dict(mode, k, beta, scope)), or clears it.
    Its lo, hi are canvas positions: reference.Model.hidden votes with the computed rows inside them."""
    m.des = None
    if des:
        E = m.config.get("num_experts")
        if not E:
            raise SystemExit("DES needs a mixture-of-experts model")
        core = max(1, min(E, int(np.floor(np.float64(np.float32(des.get("beta", 0.4))) * E))))
        m.des = dict(mode=des["mode"], k=des.get("k", 2), m=core, lo=0, hi=0, scope=des.get("scope", "block"))
        m.des_stats = []


def rows_logits(m, toks, spec, src, st, key, sp=None):
    """Logits [len(src), V] at the hidden rows src of one forward over toks. spec None: a plain forward;
    "refresh": a full forward whose every layer's post-RoPE K / V become the cache st[key]; a row list:
    those rows (plus src) computed, the other rows' K / V from st[key], which the computed rows update.
    sp (SparseD) None: exact attention; dict(mode="select", block, rho, P): an exact forward of every row
    (spec None or "refresh") that also builds every layer's pattern from its post-RoPE q / k
    (sparse_patterns, prompt length P) into sp["patterns"]; dict(mode="sparse", block, patterns): the
    computed rows attend only to the kept tiles (the pattern row of each row's POSITION // block)."""
    mode = sp["mode"] if sp else None
    kw = dict(patterns=sp["patterns"], sparse_block=sp["block"]) if mode == "sparse" else {}
    qs = [] if mode == "select" else None
    if spec is None and mode != "select":
        H, rows = m.hidden(toks, **kw), list(range(len(toks)))
    elif spec is None or spec == "refresh":
        kv = []
        H, rows = m.hidden(toks, record=kv, record_q=qs, **kw), list(range(len(toks)))
        if spec == "refresh":
            st[key] = kv
    else:
        if mode == "select":
            raise ValueError("a SparseD selection needs a forward of every row")
        rows, kv = sorted(set(spec) | set(src)), []
        H = m.hidden(toks, cached=(rows, st[key]), record=kv, **kw)
        st[key] = kv
    if mode == "select":
        sp["patterns"] = np.stack([sparse_patterns(q, k, sp["block"], sp["rho"], sp["P"])[0]
                                   for q, (k, _) in zip(qs, kv)])
    return (H[[rows.index(r) for r in src]] @ m.head.T).astype(np.float32)


def guided_logits(m, x, n, P, G, cand, spec, st, cfg, sp=None):
    """The logits of the candidates from a forward over x[:n] (rows_logits' spec); cfg > 0 (classifier-free
    guidance, algorithms.md 1A): also over the unconditional canvas (the same view with the prompt
    [0, P) and the suffix [P + G, n) masked), each canvas with its own cache (st["c"], st["u"]), and
    L_u + (cfg + 1) (L_c - L_u) in fp32. sp (SparseD, rows_logits'): a selection is built from the
    CONDITIONAL canvas's forward (the unconditional one of that step attends exactly); in a sparse
    step both canvases attend over the same pattern."""
    src = [max(j - 1, 0) if m.shift else j for j in cand]
    Lc = rows_logits(m, x[:n], spec, src, st, "c", sp)
    if cfg <= 0:
        return Lc
    u = [m.mask_id if j < P or j >= P + G else t for j, t in enumerate(x[:n])]
    Lu = rows_logits(m, u, spec, src, st, "u", None if sp is None or sp["mode"] == "select" else sp)
    g = np.float32(np.float32(cfg) + np.float32(1.0))
    return (Lu + g * (Lc - Lu)).astype(np.float32)


def generate(m, prompt, gen_length, steps, block_length, alg, eps=1e-3, cache=None, suffix=(), sparse=None,
             logprobs=None, cfg=0.0, des=None):
    """1A / 1B over blocks, temperature 0. Returns (final canvas, order: one sorted list of unmasked
    positions per step; a step whose count is 0 runs no forward and lists none).

    suffix (infilling): the canvas is prompt + gen_length masks + suffix; every forward sees the
    suffix; its positions are never candidates.
    cache (algorithms.md 1D, Fast-dLLM, bidirectional models): "prefix" | "dual". The first forward of
    every block computes the whole canvas and keeps every layer's post-RoPE K / V. Each later forward
    of the block computes only rows [lo, end of canvas) (prefix) or [lo, hi) (dual), plus the rows
    whose hidden states give the candidates' logits (Dream's shift: row p - 1 for position p), with
    every other row's K / V from the kept ones; the computed rows' K / V replace theirs in the cache.
    sparse (algorithms.md 2, SparseD): dict(block, rho, skip). Forwards are counted over the whole
    request (steps that run none are not counted); s = floor(steps * skip). Forwards 0 .. s-1 attend
    exactly; forward s too, and builds every layer's pattern from its post-RoPE q / k (sparse_patterns:
    isolated selection with prompt length len(prompt), tiles of `block`, ratio rho; with a suffix its
    key blocks are ranked with the generation's); every later forward attends only to the kept tiles.
    cfg > 0 (classifier-free guidance, LLaDA's low_confidence): every forward also runs the
    unconditional canvas (prompt and suffix masked; guided_logits); with a cache, both canvases compute
    the same rows and each keeps its own cache. With sparse, both canvases of a step attend with the same
    phase (one forward counted per step): the selecting step's pattern is built from the conditional
    canvas's forward (its unconditional forward attends exactly); later steps attend over that one
    pattern with both canvases.
    des (MoE models, algorithms.md 4): dict(mode seq | vote, k, beta, scope block | all); the rows
    decoded in parallel are the block's positions [lo, hi) (of the rows a cached forward computes).
    logprobs: a dict that receives, per decided position, log_softmax (float64) of the logits of the
    forward that decided it at the chosen token (with cfg: of the guided logits)."""
    if block_length <= 0:
        block_length = gen_length
    if gen_length % block_length:
        raise SystemExit("gen-length must be a multiple of block-length")
    nb = gen_length // block_length
    if steps % nb:
        raise SystemExit("steps must be a multiple of gen-length / block-length")
    if cache not in (None, "prefix", "dual"):
        raise SystemExit(f"unknown cache {cache!r} (prefix, dual)")
    if cfg > 0 and alg != "low_confidence":
        raise SystemExit("cfg: LLaDA's low_confidence only")
    if sparse and cache:
        raise SystemExit("sparse does not combine with a cache")
    spb = steps // nb
    P = len(prompt)
    x = list(prompt) + [m.mask_id] * gen_length + list(suffix)
    if m.mask_id in suffix:
        raise SystemExit("the suffix holds the mask token")
    n = len(x)
    st = dict(fresh=True, forwards=0, patterns=None)
    select_at = int(np.floor(steps * np.float64(np.float32(sparse["skip"])))) if sparse else -1
    des_setup(m, des)

    def logits_of(cand, lo, hi):
        f = st["forwards"]
        st["forwards"] += 1
        if sparse and f >= select_at:
            sp = dict(sparse, mode="select" if f == select_at else "sparse", P=P, patterns=st["patterns"])
            L = guided_logits(m, x, n, P, gen_length, cand, None, st, cfg, sp)
            st["patterns"] = sp["patterns"]  # the selection's (f == select_at), else unchanged
            return L
        spec = None
        if cache and st["fresh"]:
            spec = "refresh"
        elif cache:
            spec = range(lo, n if cache == "prefix" else hi)
        st["fresh"] = False
        return guided_logits(m, x, n, P, gen_length, cand, spec, st, cfg)

    order = []
    for b in range(nb):
        lo, hi = P + b * block_length, P + (b + 1) * block_length
        st["fresh"] = True
        if m.des:
            m.des["lo"], m.des["hi"] = lo, hi
        sched = llada_schedule(sum(1 for j in range(lo, hi) if x[j] == m.mask_id), spb)
        for i in range(spb):
            cand = [j for j in range(lo, hi) if x[j] == m.mask_id]
            k = sched[i] if alg == "low_confidence" else dream_count(len(cand), i, spb, eps)
            k = min(k, len(cand))
            if k == 0:
                continue
            L = logits_of(cand, lo, hi)
            probs = softmax64(L)
            x0, conf = confidence(probs, alg)
            sel = top_positions(cand, conf, k)
            for r in sel:
                x[cand[r]] = int(x0[r])
                if logprobs is not None:
                    logprobs[cand[r]] = float(log_softmax64(L[r])[x0[r]])
            order.append(sorted(cand[r] for r in sel))
    m.des = None
    return x, order


def generate_window(m, prompt, gen_length, steps, block_length, alg, w_ex, w_in, refresh, early_eos=(),
                    eps=1e-3, logprobs=None, suffix=(), cfg=0.0, des=None, sparse=None):
    """Window-Diffusion (algorithms.md 3) over generate()'s blocks and schedules, temperature 0.
    Positions >= stop are dropped (early stop: after a token of early_eos is decided at p, stop = p + 1).
    A phase starts at a step when `refresh` forwards have run in the current one (refresh 0: at every
    step), or when the current phase has no candidate left. At its start: u0 = the first masked position
    (>= len(prompt), < stop); the external window is the first w_ex masked positions from u0 and ends at
    E (one past the w_ex-th, or stop); phase_rows = those positions. Every forward sees x[:min(E, stop)]
    (the view). Each step: active = the first w_in masked positions of [u0, min(E, stop)); the
    candidates are the active positions inside the block (and < stop). refresh 0: a plain forward. The
    phase's first forward: a full forward whose K / V of every layer are kept. Later ones compute only
    the rows of phase_rows before the end of the active set (plus the logit rows of the candidates) with
    the other rows' K / V from the kept ones, and keep the result. The block's count k (LLaDA: schedule
    + owed; Dream: from the block's masked count) is capped at the candidates; LLaDA owes the rest to the
    next step. After the block's schedule, every candidate is decided per step until the block is.
    Positions never decided after an early stop read as the stopping token. logprobs: as generate()'s.
    suffix (infilling; not with early_eos): the canvas is prompt + masks + suffix and the view of every
    forward is the whole canvas (the far field between the window and the suffix is not pruned); the
    window still picks the active set and, with refresh > 0, the rows computed after the refresh.
    cfg > 0: as generate()'s, over the same view; with refresh > 0 each canvas keeps its own phase cache
    (same rows computed). des: as generate()'s, the rows decoded in parallel are each forward's span of
    candidates [first, last + 1).
    sparse (SparseD inside the window): dict(block, rho, skip). Forwards are counted over the whole request
    as run (one per step, with cfg too); select_at = floor(steps * skip) (skip rounded to fp32). A forward
    SELECTS when (forwards run before it) >= select_at, it computes every row of its view (refresh > 0:
    the phase's first forward; refresh 0: every forward), and no pattern exists yet or its view length
    differs from the view length of the last selection: it attends exactly and builds every layer's
    pattern over its view (queries and keys = rows [0, view), sparse_patterns with prompt length
    len(prompt)), which replaces the previous one. Any other forward, once a pattern exists and its view
    is not longer than the selected one, attends only to the kept tiles, each query row's and key row's
    tile given by its absolute position // block over the pattern's strides (a cached forward computes
    the phase rows, the other rows' K / V from the phase cache); otherwise it attends exactly. With a
    suffix the view (the whole canvas) never changes: one selection. After an early stop the view
    shrinks: a forward of every row re-selects, a cached one attends sparsely by position. cfg: the
    selection comes from the conditional canvas (guided_logits)."""
    if block_length <= 0:
        block_length = gen_length
    if suffix and early_eos:
        raise SystemExit("the window's early stop does not combine with a suffix")
    if cfg > 0 and alg != "low_confidence":
        raise SystemExit("cfg: LLaDA's low_confidence only")
    nb = gen_length // block_length
    spb = steps // nb
    P = len(prompt)
    x = list(prompt) + [m.mask_id] * gen_length + list(suffix)
    if m.mask_id in suffix:
        raise SystemExit("the suffix holds the mask token")
    st = dict(stop=len(x), left=0, u0=0, E=0, rows=[], fresh=False, a_end=0, forwards=0, patterns=None, sel_n=0)
    select_at = int(np.floor(steps * np.float64(np.float32(sparse["skip"])))) if sparse else -1
    order = []
    des_setup(m, des)

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
        n = st["stop"] if suffix else min(st["E"], st["stop"])
        if refresh == 0:
            spec = None
        elif st["fresh"]:
            spec = "refresh"
        else:
            spec = [r for r in st["rows"] if r < st["a_end"] and r < n]
        if m.des:
            m.des["lo"], m.des["hi"] = cand[0], cand[-1] + 1
        sp = None
        if sparse:
            f, whole = st["forwards"], refresh == 0 or st["fresh"]
            st["forwards"] += 1
            if f >= select_at and whole and (st["patterns"] is None or n != st["sel_n"]):
                sp = dict(sparse, mode="select", P=P)
            elif st["patterns"] is not None and n <= st["sel_n"]:
                sp = dict(sparse, mode="sparse", patterns=st["patterns"])
        st["fresh"] = False
        st["left"] -= 1
        L = guided_logits(m, x, n, P, gen_length, cand, spec, st, cfg, sp)
        if sp and sp["mode"] == "select":
            st["patterns"], st["sel_n"] = sp["patterns"], n
        st["L"] = L
        return confidence(softmax64(L), alg)

    def commit(cand, x0, sel):
        for r in sel:
            x[cand[r]] = int(x0[r])
            if logprobs is not None:
                logprobs[cand[r]] = float(log_softmax64(st["L"][r])[x0[r]])
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
    for j in range(st["stop"], P + gen_length):
        if x[j] == m.mask_id:
            x[j] = x[st["stop"] - 1]
    m.des = None
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
