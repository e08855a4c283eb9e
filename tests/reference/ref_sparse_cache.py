#!/usr/bin/env python3
"""SparseD (algorithms.md 2) combined with the Fast-dLLM prefix / dual KV caches (algorithms.md 1D): the
numpy reference of tessera's combination, temperature 0, written from the rules below (never from
tessera's C++ code). It reuses reference.py's model (weights, FFN / MoE routing), ref_layers.py's
RMSNorm, RoPE, attention and SparseD selection, and ref_loops.py's schedules and confidences.

Rules (a request's forwards are counted from 0; steps whose count is 0 run none and do not count):
  - select_at = floor(steps * skip) (skip rounded to fp32, as tessera's option). Before the selection
    every forward attends exactly.
  - The selection happens at the first forward f >= select_at that computes EVERY row of the canvas:
    without a cache every forward; with one, the first forward of a block (the refresh, which computes
    the whole canvas and writes every row's post-RoPE K / V to the cache). That forward attends exactly
    and builds, per layer and head, the pattern from its own q / k over the whole canvas (sparse_patterns:
    isolated selection, prompt key blocks [0, P // block) and the others, floor(n * rho) + 1 kept each).
  - Every later forward attends sparsely: a computed query row at position p attends only to the keys
    of the key blocks kept for (head, p // block), over the whole canvas's keys (the rows it does not
    compute read their K / V from the cache). Prefix cache: later forwards of a block compute rows
    [block start, end of canvas); dual: [block start, block end); plus the rows whose hidden states give
    the candidates' logits (Dream: row p - 1); the first forward of every block refreshes everything
    (after the selection it is sparse too). Computed rows write their K / V into the cache.
  - cfg > 0 (classifier-free guidance, LLaDA's low_confidence): every forward also runs the unconditional
    canvas (the prompt masked), which computes the same rows with its own cache; guided logits
    L_u + (cfg + 1) (L_c - L_u) in fp32. Both canvases of a step attend with the same phase (one forward
    counted per step): the selecting step's pattern is built from the conditional canvas's forward (the
    unconditional forward of that step attends exactly, over every row); later steps attend sparsely
    with that one pattern on both canvases.

Command line (like reference.py's):
  ref_sparse_cache.py generate --model DIR --prompt 5,9,3 --gen-length 32 --steps 16 --block-length 8
      --alg low_confidence|entropy|maskgit_plus|topk_margin --cache prefix|dual|none
      [--sparse-block 4 --sparse-rho 0.3 --sparse-skip 0.25 | --no-sparse] [--cfg S]
    prints JSON {"tokens": [...final canvas...], "order": [[positions of step 0], ...], "forwards": N,
    "select_forward": F (the forward that built the patterns; -1 if none)}.
  ref_sparse_cache.py logits --model DIR --cache-tokens A --tokens B --compute LO,HI --rows 33,36
      --sparse-block 8 --sparse-rho 0.3 --prompt-len 20 --out FILE [--patterns-out F --clear-out F]
      [--patterns F] [--dense]
    One cached sparse step: the full forward over canvas A (exact attention) fills the cache and builds
    the patterns (or --patterns: uint8 [layers, H, nqb, nkb] given instead); canvas B (same length)
    computes rows [LO, HI) (plus the logit rows of --rows: Dream p - 1) attending sparsely, the other
    rows' K / V from A. Writes float32 logits [len(rows), V] (Dream logits shifted: row p from hidden
    p - 1). --patterns-out / --clear-out: the patterns built from A and sparse_patterns' near-tie flags
    (uint8 [layers, H, nqb]). --dense: the same cached step with exact attention.
  ref_sparse_cache.py selfcheck --model DIR [--alg low_confidence]
    The degenerate cases against ref_loops.generate: no cache = generate(sparse=...), no sparsity =
    generate(cache=...); prints "N passed, 0 failed".
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference import Model, ids  # noqa: E402
from ref_layers import rms_norm, apply_rope, attention, sparse_patterns  # noqa: E402
from ref_loops import (softmax64, confidence, top_positions, llada_schedule, dream_count,  # noqa: E402
                       generate)


def forward_rows(m, toks, rows=None, kv=None, patterns=None, block=0, record_q=None):
    """One forward over the canvas toks computing the ascending rows `rows` (None: every row, and kv is
    not read). The other rows' post-RoPE K / V come from kv (a list per layer of (K [L, KV, hd], V)).
    patterns [layers, H, nqb, nkb] (tiles of `block`): computed row i at position p attends only to the
    keys j with patterns[layer, h, p // block, j // block] != 0 (the pattern row of its POSITION, over all
    the canvas's keys); None: exact attention. Returns (final-norm hidden states of the rows [n, d], the
    new K / V of every row of the canvas per layer: the cache after this forward)."""
    toks = np.asarray(toks, dtype=np.int64)
    L = len(toks)
    pos = np.arange(L) if rows is None else np.asarray(rows, dtype=np.int64)
    if rows is not None and (kv is None or np.any(np.diff(pos) <= 0) or pos[0] < 0 or pos[-1] >= L):
        raise SystemExit("forward_rows: ascending rows of the canvas and a cache expected")
    n = len(pos)
    m.des, m.des_rows = None, None  # no expert sharing here (reference.Model.ffn reads them)
    m.margins = np.full(n, np.inf, dtype=np.float32)
    x = m.emb[toks[pos]].astype(np.float32)
    out_kv = []
    for li, ly in enumerate(m.layers):
        h = rms_norm(x, ly["an"], m.eps)
        q, k, v = h @ ly["q"].T, h @ ly["k"].T, h @ ly["v"].T
        if ly["bq"] is not None:
            q, k, v = q + ly["bq"], k + ly["bk"], v + ly["bv"]
        q, k = q.reshape(n, m.H, m.hd), k.reshape(n, m.KV, m.hd)
        if "qn" in ly:
            q, k = rms_norm(q, ly["qn"], m.eps), rms_norm(k, ly["kn"], m.eps)
        q = apply_rope(q, pos, m.theta, m.interleaved, m.rotary_dim)
        k = apply_rope(k, pos, m.theta, m.interleaved, m.rotary_dim)
        v = v.reshape(n, m.KV, m.hd).astype(np.float32)
        if rows is not None:
            k_all, v_all = kv[li][0].copy(), kv[li][1].copy()
            k_all[pos], v_all[pos] = k, v
            k, v = k_all, v_all
        out_kv.append((k, v))
        if record_q is not None:
            record_q.append(q)
        keep = None
        if patterns is not None:
            tiles = patterns[li] != 0  # [H, nqb, nkb]
            keep = tiles[:, pos // block][:, :, np.arange(L) // block]  # [H, n, L]
        att = attention(q, k, v, m.causal, 0, pos, keep).reshape(n, m.H * m.hd)
        x = x + att @ ly["o"].T
        x = x + m.ffn(rms_norm(x, ly["fn"], m.eps), ly)
    return rms_norm(x, m.norm_f, m.eps), out_kv


def select_at_of(steps, skip):
    return int(np.floor(steps * np.float64(np.float32(skip))))


def generate_sparse_cache(m, prompt, gen_length, steps, block_length, alg, cache, sparse, eps=1e-3, cfg=0.0):
    """1A / 1B over blocks (ref_loops.generate's schedules, candidates and ties), temperature 0, with
    SparseD (sparse: dict(block, rho, skip), or None), a KV cache (cache: None | "prefix" | "dual") and
    classifier-free guidance (cfg > 0, low_confidence) under the rules of this module's docstring.
    Returns (final canvas, order, info: dict(forwards, select_forward))."""
    if block_length <= 0:
        block_length = gen_length
    if gen_length % block_length:
        raise SystemExit("gen-length must be a multiple of block-length")
    nb = gen_length // block_length
    if steps % nb:
        raise SystemExit("steps must be a multiple of gen-length / block-length")
    if cache not in (None, "prefix", "dual"):
        raise SystemExit(f"unknown cache {cache!r} (prefix, dual)")
    if m.causal or m.block or m.family == "llada2":
        raise SystemExit("SparseD with a cache: bidirectional LLaDA / Dream / LLaDA-MoE models only")
    if cfg > 0 and alg != "low_confidence":
        raise SystemExit("cfg: LLaDA's low_confidence only")
    spb = steps // nb
    P = len(prompt)
    x = list(prompt) + [m.mask_id] * gen_length
    n = len(x)
    select_at = select_at_of(steps, sparse["skip"]) if sparse else -1
    st = dict(forwards=0, patterns=None, kv={}, fresh=True, select_forward=-1)

    def logits_of(cand, lo, hi):
        f = st["forwards"]
        st["forwards"] += 1
        src = [max(j - 1, 0) if m.shift else j for j in cand]
        whole = cache is None or st["fresh"]
        rows = None if whole else sorted(set(range(lo, n if cache == "prefix" else hi)) | set(src))
        st["fresh"] = False
        select = sparse and st["patterns"] is None and f >= select_at and whole
        out = []
        for key in ("c", "u") if cfg > 0 else ("c",):
            canvas = x if key == "c" else [m.mask_id if j < P else t for j, t in enumerate(x)]
            if select and key == "c":
                qs = []
                H, kv = forward_rows(m, canvas, record_q=qs)  # exact, and builds the patterns
                st["patterns"] = np.stack([sparse_patterns(q, k, sparse["block"], sparse["rho"], P)[0]
                                           for q, (k, _) in zip(qs, kv)])
                st["select_forward"] = f
            elif select:  # the unconditional canvas of the selecting step attends exactly
                H, kv = forward_rows(m, canvas)
            else:
                H, kv = forward_rows(m, canvas, rows, st["kv"].get(key), st["patterns"],
                                     sparse["block"] if sparse else 0)
            st["kv"][key] = kv
            rr = list(range(n)) if rows is None else rows
            out.append((H[[rr.index(r) for r in src]] @ m.head.T).astype(np.float32))
        if cfg <= 0:
            return out[0]
        g = np.float32(np.float32(cfg) + np.float32(1.0))
        return (out[1] + g * (out[0] - out[1])).astype(np.float32)

    order = []
    for b in range(nb):
        lo, hi = P + b * block_length, P + (b + 1) * block_length
        st["fresh"] = True
        sched = llada_schedule(sum(1 for j in range(lo, hi) if x[j] == m.mask_id), spb)
        for i in range(spb):
            cand = [j for j in range(lo, hi) if x[j] == m.mask_id]
            k = sched[i] if alg == "low_confidence" else dream_count(len(cand), i, spb, eps)
            k = min(k, len(cand))
            if k == 0:
                continue
            x0, conf = confidence(softmax64(logits_of(cand, lo, hi)), alg)
            sel = top_positions(cand, conf, k)
            for r in sel:
                x[cand[r]] = int(x0[r])
            order.append(sorted(cand[r] for r in sel))
    return x, order, dict(forwards=st["forwards"], select_forward=st["select_forward"])


def cached_sparse_step(m, a, b, lo, hi, positions, block, rho, prompt_len, patterns=None, dense=False):
    """One cached step: the exact full forward over canvas a fills the cache and (patterns None) builds
    the patterns; canvas b computes rows [lo, hi) plus the logit rows of `positions` (Dream: p - 1)
    attending sparsely with them (dense: exactly). Returns (logits [len(positions), V] fp32, patterns,
    clear flags [layers, H, nqb])."""
    if len(a) != len(b):
        raise SystemExit("the cache canvas and the step canvas must have the same length")
    qs = []
    _, kv = forward_rows(m, a, record_q=qs)
    sel = [sparse_patterns(q, k, block, rho, prompt_len) for q, (k, _) in zip(qs, kv)]
    clear = np.stack([s[1] for s in sel])
    if patterns is None:
        patterns = np.stack([s[0] for s in sel])
    src = [max(p - 1, 0) if m.shift else p for p in positions]
    rows = sorted(set(range(lo, hi)) | set(src))
    H, _ = forward_rows(m, b, rows, kv, None if dense else patterns, block)
    L = (H[[rows.index(r) for r in src]] @ m.head.T).astype(np.float32)
    return L, patterns, clear


def selfcheck(m, alg):
    """The degenerate combinations equal ref_loops.generate's single features."""
    prompt = [5, 17, 230, 9, 44]
    o = dict(gen_length=24, steps=12, block_length=8, alg=alg)
    sp = dict(block=4, rho=0.3, skip=0.2)
    passed = failed = 0

    def check(name, got, want):
        nonlocal passed, failed
        if got == want:
            passed += 1
        else:
            failed += 1
            print(f"FAIL {name}: {got} != {want}")

    x, order, _ = generate_sparse_cache(m, prompt, cache=None, sparse=sp, **o)
    check("sparse without a cache", (x, order), generate(m, prompt, sparse=sp, **o))
    for c in ("prefix", "dual"):
        x, order, _ = generate_sparse_cache(m, prompt, cache=c, sparse=None, **o)
        check(f"{c} cache without sparsity", (x, order), generate(m, prompt, cache=c, **o))
        # rho = 1 keeps every tile: the cache alone
        x, order, info = generate_sparse_cache(m, prompt, cache=c, sparse=dict(sp, rho=1.0), **o)
        check(f"{c} cache, rho 1", (x, order), generate(m, prompt, cache=c, **o))
        check(f"{c} cache, selection at a refresh", info["select_forward"] >= 2 and
              info["select_forward"] % 4 == 0, True)
    print(f"{passed} passed, {failed} failed")
    return failed == 0


def main():
    ap = argparse.ArgumentParser(description="numpy reference of SparseD with the prefix / dual KV cache")
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate")
    g.add_argument("--model", required=True)
    g.add_argument("--prompt", required=True)
    g.add_argument("--gen-length", type=int, required=True)
    g.add_argument("--steps", type=int, required=True)
    g.add_argument("--block-length", type=int, default=0)
    g.add_argument("--alg", default="low_confidence")
    g.add_argument("--cache", default="none", help="prefix | dual | none")
    g.add_argument("--no-sparse", action="store_true", help="the cache alone")
    g.add_argument("--sparse-block", type=int, default=32)
    g.add_argument("--sparse-rho", type=float, default=0.5)
    g.add_argument("--sparse-skip", type=float, default=0.2)
    g.add_argument("--cfg", type=float, default=0.0, help="classifier-free guidance scale (low_confidence)")
    a = sub.add_parser("logits")
    a.add_argument("--model", required=True)
    a.add_argument("--cache-tokens", required=True, help="canvas A: its full forward fills the cache")
    a.add_argument("--tokens", required=True, help="canvas B: the cached step's canvas")
    a.add_argument("--compute", required=True, help="LO,HI: the rows of B computed")
    a.add_argument("--rows", required=True, help="the positions whose logits are written")
    a.add_argument("--sparse-block", type=int, required=True)
    a.add_argument("--sparse-rho", type=float, required=True)
    a.add_argument("--prompt-len", type=int, required=True)
    a.add_argument("--out", required=True)
    a.add_argument("--patterns", default="", help="uint8 [layers, H, nqb, nkb] to use instead of A's")
    a.add_argument("--patterns-out", default="")
    a.add_argument("--clear-out", default="")
    a.add_argument("--dense", action="store_true", help="the cached step with exact attention")
    s = sub.add_parser("selfcheck")
    s.add_argument("--model", required=True)
    s.add_argument("--alg", default="low_confidence")
    args = ap.parse_args()
    m = Model(args.model)
    if args.cmd == "selfcheck":
        sys.exit(0 if selfcheck(m, args.alg) else 1)
    if args.cmd == "logits":
        a_toks, b_toks = ids(args.cache_tokens), ids(args.tokens)
        lo, hi = ids(args.compute)
        pats = None
        if args.patterns:
            nb = -(-len(a_toks) // args.sparse_block)
            pats = np.fromfile(args.patterns, dtype=np.uint8).reshape(len(m.layers), m.H, nb, nb)
        L, pats, clear = cached_sparse_step(m, a_toks, b_toks, lo, hi, ids(args.rows), args.sparse_block,
                                            args.sparse_rho, args.prompt_len, pats, args.dense)
        np.ascontiguousarray(L, dtype="<f4").tofile(args.out)
        if args.patterns_out:
            np.ascontiguousarray(pats, dtype=np.uint8).tofile(args.patterns_out)
        if args.clear_out:
            np.ascontiguousarray(clear, dtype=np.uint8).tofile(args.clear_out)
        return
    cache = None if args.cache in ("", "none") else args.cache
    sparse = None if args.no_sparse else dict(block=args.sparse_block, rho=args.sparse_rho, skip=args.sparse_skip)
    x, order, info = generate_sparse_cache(m, ids(args.prompt), args.gen_length, args.steps, args.block_length,
                                           args.alg, cache, sparse, cfg=args.cfg)
    print(json.dumps(dict(tokens=x, order=order, **info)))


if __name__ == "__main__":
    main()
