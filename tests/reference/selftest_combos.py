"""selftest.py's checks of the feature combinations (run by selftest.py, which calls register()): SparseD
inside Window-Diffusion (A), SparseD with classifier-free guidance (B), Window-Diffusion on block-causal
LLaDA2 (C) and SparseD on LLaDA2, uncached and with its KV cache (D). Every check can fail."""
import json
import os
import subprocess
import sys

import numpy as np

import reference as ref
from ref_loops import rows_logits
from ref_sparse_cache import generate_sparse_cache

CHECKS = []
H = {}  # selftest.py's make, close and recording_hidden (register)
MODELS = {}


def check(fn):
    CHECKS.append(fn)
    return fn


def register(add, make, close, recording_hidden):
    """Adds the checks of this file to selftest.py's (add: its @check) with selftest.py's helpers."""
    H.update(make=make, close=close, recording_hidden=recording_hidden)
    for fn in CHECKS:
        add(fn)


def model(fam):
    if fam not in MODELS:
        MODELS[fam] = ref.Model(H["make"](fam, "combo_" + fam))
    return MODELS[fam]


def recording_views(m):
    """Wraps m.hidden: returns the list that receives (view length, cached, selects, sparse) per call."""
    calls, inner = [], m.hidden

    def hidden(tokens, **kw):
        calls.append((len(tokens), kw.get("cached") is not None, kw.get("record_q") is not None,
                      kw.get("patterns") is not None))
        return inner(tokens, **kw)
    m.hidden = hidden
    return calls


def window_selections_follow_the_rule(calls, select_at):
    """The selections and sparse forwards of a window run (one hidden call per forward, no cfg) as
    generate_window's docstring states them; returns (the number of selections, of sparse forwards over
    a view shorter than the selected one)."""
    sel_n, n_sel, shorter = None, 0, 0
    for f, (n, cached, selects, sparse) in enumerate(calls):
        want = f >= select_at and not cached and (sel_n is None or n != sel_n)
        assert selects == want, (f, calls)
        assert sparse == (not want and sel_n is not None and n <= sel_n), (f, calls)
        shorter += sparse and n < sel_n
        if want:
            sel_n, n_sel = n, n_sel + 1
    return n_sel, shorter


@check
def window_sparse_generate():
    """A: SparseD inside the window. rho 1 (every tile kept) is the plain window run; the selections happen
    at the first forward of every row from select_at on and wherever the view length changes (a refresh
    with refresh > 0, every forward with refresh 0), one with a suffix (fixed view); cached forwards
    attend sparsely; an early stop's shorter views too."""
    for fam, alg in (("llada", "low_confidence"), ("dream", "entropy")):
        m = model(fam)
        prompt = [5, 17, 230, 8, 9]
        run = lambda *w, **kw: ref.generate_window(m, prompt, 16, 8, 8, alg, *w, **kw)  # noqa: E731
        sp = dict(block=4, rho=0.0, skip=0.25)  # select_at = 2
        changed = False
        for w in ((6, 3, 3), (6, 3, 0)):
            plain = run(*w)
            assert run(*w, sparse=dict(sp, rho=1.0)) == plain, (fam, w)
            calls = recording_views(m)
            thin = run(*w, sparse=sp)
            del m.hidden
            n_sel = window_selections_follow_the_rule(calls, 2)[0]
            assert n_sel >= 2 and any(c[1] and c[3] for c in calls) == (w[2] > 0), (fam, w, calls)
            changed |= thin != plain
        assert changed, f"{fam}: rho 0 changed nothing"
        calls = recording_views(m)
        run(16, 16, 0, suffix=[40, 41], sparse=sp)
        del m.hidden
        assert [c[2] for c in calls] == [False, False, True] + [False] * (len(calls) - 3), calls
        assert all(c[3] for c in calls[3:]) and len({c[0] for c in calls}) == 1, calls
        if fam == "llada":  # an early stop shortens the view: cached forwards stay sparse (by position)
            sp0 = dict(sp, skip=0.0)
            x, _ = run(6, 3, 3, sparse=sp0)
            shorter = 0
            for eos in sorted(set(x[5:]), key=x.index):
                calls = recording_views(m)
                run(6, 3, 3, early_eos=(eos,), sparse=sp0)
                del m.hidden
                shorter += window_selections_follow_the_rule(calls, 0)[1]
            assert shorter, "no early stop inside a sparse phase"


@check
def cfg_sparse_generate():
    """B: SparseD with cfg. Both canvases of a step attend with the same phase: the selecting step's
    unconditional forward is exact, then both are sparse; rho 1 is cfg alone (plain, window, the SparseD +
    cache loop); ref_sparse_cache's loop without a cache is generate()'s."""
    m = model("llada")
    prompt = [5, 17, 230, 8, 9]
    run = lambda **kw: ref.generate(m, prompt, 16, 8, 8, "low_confidence", **kw)  # noqa: E731
    sp = dict(block=4, rho=0.0, skip=0.25)
    calls = H["recording_hidden"](m)
    thin = run(cfg=1.0, sparse=sp)
    del m.hidden
    assert calls == ["full"] * 4 + ["select", "full"] + ["sparse"] * (len(calls) - 6), calls
    assert thin != run(cfg=1.0) and thin != run(sparse=sp), "cfg or SparseD changed nothing"
    assert run(cfg=1.0, sparse=dict(sp, rho=1.0)) == run(cfg=1.0)
    win = lambda **kw: ref.generate_window(m, prompt, 16, 8, 8, "low_confidence", 6, 3, 3, cfg=1.0, **kw)  # noqa
    assert win(sparse=dict(sp, rho=1.0)) == win()
    calls = recording_views(m)
    win(sparse=sp)
    del m.hidden
    assert [c[:2] + (False,) + c[3:] for c in calls[0::2]] == calls[1::2], calls
    window_selections_follow_the_rule(calls[0::2], 2)
    assert generate_sparse_cache(m, prompt, 16, 8, 8, "low_confidence", None, sp, cfg=1.0)[:2] == thin
    for c in ("prefix", "dual"):
        got = generate_sparse_cache(m, prompt, 16, 8, 8, "low_confidence", c, dict(sp, rho=1.0), cfg=1.0)
        assert got[:2] == run(cache=c, cfg=1.0) and got[2]["select_forward"] == 4, (c, got[2])
    # one step per block: every cached forward is a refresh of the whole canvas, so the cache changes nothing
    got = generate_sparse_cache(m, prompt, 16, 2, 8, "low_confidence", "dual", sp, cfg=1.0)
    assert got[:2] == ref.generate(m, prompt, 16, 2, 8, "low_confidence", sparse=sp, cfg=1.0), got


@check
def llada2_window_generate():
    """C: the window on LLaDA2. Windows holding a block (w_ex, w_in >= BL) with refresh 0 or 1 are
    generate_llada2; a small window decides the blocks in order, each position once, and its cached
    forwards compute the phase rows before the active set's end plus the candidates; a cached forward
    over a block-causal view equals the full forward's rows when no row changed."""
    m = model("llada2")
    prompt = [5, 9, 3]
    for thr in (0.95, 0.05):
        want = ref.generate_llada2(m, prompt, 21, 8, 8, thr)
        for refresh in (0, 1):
            assert ref.generate_llada2_window(m, prompt, 21, 8, 8, thr, 8, 8, refresh) == want, (thr, refresh)
        info = {}
        x, order = ref.generate_llada2_window(m, prompt, 21, 8, 8, thr, 4, 2, 2, info=info)
        flat = [p for s in order for p in s]
        assert sorted(flat) == sorted(set(flat)) and len(order) == len(info["calls"])
        assert all(p // 8 <= q // 8 for p, q in zip(flat, flat[1:])), "blocks in order"
        kinds = [c[1] if c[1] in ("refresh", None) else "rows" for c in info["calls"]]
        assert kinds[0] == "refresh" and "rows" in kinds and None not in kinds, kinds
        done = set(range(len(prompt)))
        for t, ((E, spec), s) in enumerate(zip(info["calls"], order)):  # replay: phase rows, E, candidates
            blk = s[0] // 8 * 8
            free = [p for p in range(max(blk, 3), blk + 8) if p not in done]
            if spec == "refresh":
                rows = free[:4]
                assert E == (rows[3] + 1 if len(rows) == 4 else blk + 8), (t, E, rows)
            cand = [p for p in free if p < E][:2]
            assert set(s) <= set(cand), (t, s, cand)
            if spec != "refresh":
                assert spec == sorted({r for r in rows if r <= cand[-1]} | set(cand)), (t, spec, rows, cand)
            done |= set(s)
        assert (x, order) != want
    x = want[0][:13] + [m.mask_id] * 3
    m.block, st = 8, {}
    full = rows_logits(m, x[:14], "refresh", [11, 13], st, "c")
    H["close"](rows_logits(m, x[:14], [9, 11, 12], [11, 13], st, "c"), full, 1e-5, "cached block-causal rows")


@check
def llada2_sparse_generate():
    """D: SparseD per LLaDA2 block. Keeping every tile (rho 1) or no sparsity is generate_llada2, uncached
    and with the (exact) KV cache; per block, forwards < s exact, s selects, later ones sparse; the cached
    rows are [0, end) first, then [(b-1) BL, end) at a block's first forward and [b BL, end) after; the
    block-causal selection ranks only visible keys."""
    m = model("llada2")
    prompt = [5, 9, 3, 7, 1]
    want = ref.generate_llada2(m, prompt, 27, 8, 8, 0.95)
    sp = dict(block=4, rho=0.0, skip=0.25)
    changed = False
    for cache in (None, "prefix"):
        assert ref.generate_llada2_sparse(m, prompt, 27, 8, 8, 0.95, None, cache) == want, cache
        assert ref.generate_llada2_sparse(m, prompt, 27, 8, 8, 0.95, dict(sp, rho=1.0), cache) == want, cache
        info = {}
        changed |= ref.generate_llada2_sparse(m, prompt, 27, 8, 8, 0.95, sp, cache, info=info) != want
        for n, (b, i, mode, lo, end) in enumerate(info["calls"]):
            assert mode == ("exact" if i < 2 else "select" if i == 2 else "sparse") and end == 8 * b + 8, mode
            assert lo == (0 if cache is None or n == 0 else 8 * b - 8 if i == 0 else 8 * b), (n, lo)
    assert changed, "rho 0 changed nothing"
    rng = np.random.default_rng(4)
    q, k = rng.standard_normal((16, 2, 8)), rng.standard_normal((16, 2, 8))
    plain = ref.sparse_patterns(q, k, 4, 0.3, 4)
    for a, b in zip(plain, ref.sparse_patterns(q, k, 4, 0.3, 4, q_pos=np.arange(16))):
        assert np.array_equal(a, b), "q_pos = every row is the plain selection"
    mask = ref.sparse_patterns(q, k, 4, 0.0, 4, attn_block=8)[0]
    assert mask[:, :2, 2:].sum() == 0 and mask[:, :, 1:].sum(axis=-1).min() == 1, "only visible blocks kept"
    part = ref.sparse_patterns(q[8:], k, 4, 0.0, 4, attn_block=8, q_pos=np.arange(8, 16))[0]
    assert np.array_equal(part[:, 2:], ref.sparse_patterns(q, k, 4, 0.0, 4, attn_block=8)[0][:, 2:])


@check
def cli_combinations():
    """The command line runs the new combinations: --sparse with --window, --window and --sparse --cache
    prefix on LLaDA2, each equal to the loop it names."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference.py")
    d = H["make"]("llada2", "combo_cli")
    m = ref.Model(d)
    base = [sys.executable, script, "generate", "--model", d, "--prompt", "5,9,3", "--gen-length", "14",
            "--steps", "4", "--block-length", "8", "--threshold", "0.5"]
    for extra, want in ((["--window", "4,2,1"], ref.generate_llada2_window(m, [5, 9, 3], 14, 4, 8, 0.5, 4, 2, 1)),
                        (["--sparse", "--sparse-block", "4", "--sparse-rho", "0.0", "--cache", "prefix"],
                         ref.generate_llada2_sparse(m, [5, 9, 3], 14, 4, 8, 0.5, dict(block=4, rho=0.0, skip=0.2),
                                                    "prefix"))):
        j = json.loads(subprocess.run(base + extra, check=True, capture_output=True, text=True).stdout)
        assert [j["tokens"], j["order"]] == list(want), extra
