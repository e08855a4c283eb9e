#!/usr/bin/env python3
"""Measures decoding settings of a model on held-out prompts: how the text it writes repeats, how long it
runs before EOS and how likely the model itself finds it. The evidence for a model's decoding defaults
(generation_config.json); models/tessera-tiny/MODEL_CARD.md holds the table for the bundled model.

  /usr/bin/python3 tools/decoding_sweep.py [--model models/tessera-tiny] [--heldout models/heldout.jsonl]
      [--prompts 60] [--words 8] [--seed 33] [--gen-length 64] [--nll-groups 0] [--threads 1]
      [--only LABEL ...] [--json sweep.json] [--build build]

Prompts: --prompts documents of the held-out file drawn with --seed (random.Random(seed).sample over the
documents of at least 2 * --words words), each cut to its first --words words (its first paragraph's);
never training text. Every setting of the grid (SETTINGS below; --only picks some by label) generates
once per prompt through `tessera generate --prompts-file F --json` (batched, --seed 1 for the sampling
ones) and is scored on the answers (the tokens before EOS):

  d2       distinct-2: unique token bigrams / bigrams of an answer, mean over answers of >= 2 tokens
  rep4     4-gram repetition: 1 - unique 4-grams / 4-grams of an answer, mean over answers of >= 4 tokens
  loop     share of answers holding a loop: some span of p = 1..16 tokens repeated back to back until the
           run covers >= max(3p, 8) tokens (three copies of a phrase, eight of one token)
  len      mean answer length in tokens (the answer ends at the first EOS; gen-length when none)
  short    share of answers shorter than 8 tokens
  pNLL     pseudo-NLL of the answers under the model itself, nats per token: the canvas prompt + answer
           (+ EOS where it ended at one), the answer's tokens masked in --nll-groups interleaved groups
           (0: one token at a time, the textbook pseudo-likelihood) and -log p of each read from the
           engine's own forward (Engine::forward_logprob, the path of `tessera eval`'s NLL(exact)) by
           tools/decoding_sweep_nll.cpp, which this script builds against BUILD/libtessera_lib.a

Loops score a low pNLL (a masked copy is easy to predict from the others): read pNLL beside loop and d2.
Every setting pins its options (--alg, --temperature, --block-length; steps = gen-length unless it says
steps/2), so the table does not depend on the model's generation_config.json. The default grid (25
settings) takes about 17 minutes of one core on tessera-tiny (generation and scoring ~20 s each).
"""
import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (label, tessera generate options). Top-p / top-k apply to the Dream algorithms (origin, maskgit_plus,
# topk_margin, entropy) and to token editing; the edit penalty only with editing on (--edit-mode).
SETTINGS = [
    ("low_confidence greedy b32", ["--alg", "low_confidence", "--temperature", "0", "--block-length", "32"]),
    ("low_confidence greedy b64", ["--alg", "low_confidence", "--temperature", "0", "--block-length", "64"]),
    ("low_confidence greedy b32 steps/2",
     ["--alg", "low_confidence", "--temperature", "0", "--block-length", "32", "--steps", "HALF"]),
    ("low_confidence T0.6 b32", ["--alg", "low_confidence", "--temperature", "0.6", "--block-length", "32"]),
    ("low_confidence T0.8 b32", ["--alg", "low_confidence", "--temperature", "0.8", "--block-length", "32"]),
    ("low_confidence T1.0 b32", ["--alg", "low_confidence", "--temperature", "1.0", "--block-length", "32"]),
    ("random greedy b32", ["--alg", "random", "--temperature", "0", "--block-length", "32"]),
    ("random greedy b64", ["--alg", "random", "--temperature", "0", "--block-length", "64"]),
    ("random T0.8 b32", ["--alg", "random", "--temperature", "0.8", "--block-length", "32"]),
    ("entropy greedy b32", ["--alg", "entropy", "--temperature", "0", "--block-length", "32"]),
    ("topk_margin greedy b32", ["--alg", "topk_margin", "--temperature", "0", "--block-length", "32"]),
    ("maskgit_plus greedy b32", ["--alg", "maskgit_plus", "--temperature", "0", "--block-length", "32"]),
    ("entropy T0.7 p0.95 b32", ["--alg", "entropy", "--temperature", "0.7", "--top-p", "0.95",
                                "--block-length", "32"]),
    ("entropy T0.8 b32", ["--alg", "entropy", "--temperature", "0.8", "--block-length", "32"]),
    ("entropy T0.8 p0.95 b32", ["--alg", "entropy", "--temperature", "0.8", "--top-p", "0.95",
                                "--block-length", "32"]),
    ("entropy T0.8 p0.95 b32 seed 2", ["--alg", "entropy", "--temperature", "0.8", "--top-p", "0.95",
                                       "--block-length", "32", "--seed", "2"]),
    ("entropy T0.8 p0.95 b64", ["--alg", "entropy", "--temperature", "0.8", "--top-p", "0.95",
                                "--block-length", "64"]),
    ("entropy T0.8 p0.95 b32 steps/2", ["--alg", "entropy", "--temperature", "0.8", "--top-p", "0.95",
                                        "--block-length", "32", "--steps", "HALF"]),
    ("entropy T0.9 p0.95 b32", ["--alg", "entropy", "--temperature", "0.9", "--top-p", "0.95",
                                "--block-length", "32"]),
    ("entropy T1.0 p0.9 b32", ["--alg", "entropy", "--temperature", "1.0", "--top-p", "0.9",
                               "--block-length", "32"]),
    ("topk_margin T0.8 p0.95 b32", ["--alg", "topk_margin", "--temperature", "0.8", "--top-p", "0.95",
                                    "--block-length", "32"]),
    ("maskgit_plus T0.8 p0.95 b32", ["--alg", "maskgit_plus", "--temperature", "0.8", "--top-p", "0.95",
                                     "--block-length", "32"]),
    ("edit quality greedy b32", ["--alg", "low_confidence", "--temperature", "0", "--block-length", "32",
                                 "--edit-mode", "quality"]),
    ("edit quality pen3 b32", ["--alg", "low_confidence", "--temperature", "0", "--block-length", "32",
                               "--edit-mode", "quality", "--edit-penalty", "3"]),
    ("edit quality pen3 T0.8 p0.95 b32", ["--alg", "low_confidence", "--temperature", "0.8", "--top-p", "0.95",
                                          "--block-length", "32", "--edit-mode", "quality",
                                          "--edit-penalty", "3"]),
]

# Prompts whose answers are kept in the JSON output for every setting (the README's candidates).
SHOWCASE = ["Once upon a time", "The old man said", "In the beginning", "Elizabeth said to her sister",
            "It is a truth universally acknowledged", "The king of Israel", "A computer is"]


def pick_prompts(heldout, n, words, seed):
    """[(prompt, the document's text after it)]: n documents drawn with the seed, cut after `words` words."""
    docs = []
    with open(heldout, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                text = json.loads(line)["text"].strip()
                first = text.split("\n")[0]
                m = list(re.finditer(r"\S+", first))
                if len(m) >= 2 * words:
                    docs.append((" ".join(x.group(0) for x in m[:words]), text[m[words - 1].end():]))
    if len(docs) < n:
        raise SystemExit(f"decoding_sweep: {heldout} has only {len(docs)} documents of >= {2 * words} words")
    return random.Random(seed).sample(docs, n)


def ngrams(t, n):
    return [tuple(t[i:i + n]) for i in range(len(t) - n + 1)]


def distinct(t, n):
    g = ngrams(t, n)
    return len(set(g)) / len(g) if g else None


def has_loop(t, max_period=16):
    for p in range(1, max_period + 1):
        need = max(3 * p, 8) - p  # consecutive i with t[i] == t[i + p]
        run = 0
        for i in range(len(t) - p):
            run = run + 1 if t[i] == t[i + p] else 0
            if run >= need:
                return True
    return False


def mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else float("nan")


def metrics(answers, nlls):
    ntok = sum(len(t) for t in answers)
    return {
        "d2": mean(distinct(t, 2) for t in answers),
        "rep4": mean((1 - distinct(t, 4)) if len(t) >= 4 else None for t in answers),
        "loop": sum(has_loop(t) for t in answers) / len(answers),
        "len": ntok / len(answers),
        "short": sum(len(t) < 8 for t in answers) / len(answers),
        "pnll": sum(nlls) / ntok if ntok else float("nan"),
    }


def score(nll_exe, a, lines, env):
    """The decoding_sweep_nll tool on JSON lines: one result dict per line."""
    groups = a.nll_groups if a.nll_groups > 0 else a.gen_length
    s = subprocess.run([nll_exe, a.model, str(groups)], input="".join(json.dumps(x) + "\n" for x in lines),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if s.returncode != 0:
        raise RuntimeError(s.stderr.strip())
    return [json.loads(x) for x in s.stdout.splitlines()]


def build_nll_tool(build):
    lib = os.path.join(build, "libtessera_lib.a")
    src = os.path.join(ROOT, "tools", "decoding_sweep_nll.cpp")
    exe = os.path.join(build, "decoding_sweep_nll")
    if not os.path.exists(lib):
        raise SystemExit(f"decoding_sweep: {lib} does not exist (build tessera first)")
    if os.path.exists(exe) and os.path.getmtime(exe) >= max(os.path.getmtime(lib), os.path.getmtime(src)):
        return exe
    cmd = ["g++", "-std=c++20", "-O2", "-I", os.path.join(ROOT, "src"), "-I", os.path.join(ROOT, "include"),
           src, lib, "-fopenmp", "-lpcre2-8", "-lutf8proc", "-ldnnl", "-lssl", "-lcrypto", "-lpthread",
           "-o", exe]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        raise SystemExit("decoding_sweep: could not build tools/decoding_sweep_nll.cpp:\n" + r.stdout[-3000:])
    return exe


def run_setting(a, exe, nll_exe, prompts_file, prompts, n_held, opts, env):
    """Generates for every prompt; the metrics are over the first n_held (the held-out prompts)."""
    opts = [str(a.gen_length // 2) if o == "HALF" else o for o in opts]
    sampling = "--temperature" in opts and float(opts[opts.index("--temperature") + 1]) > 0
    cmd = [exe, "generate", "-m", a.model, "--prompts-file", prompts_file, "--json", "--no-progress",
           "--gen-length", str(a.gen_length), "--threads", str(a.threads)] + opts
    if "--steps" not in opts:
        cmd += ["--steps", str(a.gen_length)]
    if sampling and "--seed" not in opts:
        cmd += ["--seed", "1"]
    t0 = time.time()
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}")
    gen_s = time.time() - t0
    res = sorted((json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")), key=lambda d: d["index"])
    if len(res) != len(prompts):
        raise RuntimeError(f"{len(res)} results for {len(prompts)} prompts")
    answers = [d["tokens"] for d in res[:n_held]]
    t0 = time.time()
    scores = score(nll_exe, a, [{"prompt": p, "answer": t, "eos": len(t) < a.gen_length}
                                for p, t in zip(prompts, answers)], env)
    nll_s = time.time() - t0
    for d, sc in zip(res, scores):  # the tool's tokenization of the prompt must be generate's
        if d["prompt_tokens"] != sc["prompt_tokens"]:
            raise RuntimeError(f"prompt {d['index']}: {sc['prompt_tokens']} tokens in the scorer, "
                               f"{d['prompt_tokens']} in generate")
    return dict(metrics(answers, [sc["nll"] for sc in scores]), options=opts, generate_seconds=gen_s,
                nll_seconds=nll_s,
                answers=[{"prompt": p, "text": d["text"], "tokens": len(d["tokens"])} for p, d in zip(prompts, res)])

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "tessera-tiny"))
    ap.add_argument("--heldout", default=os.path.join(ROOT, "models", "heldout.jsonl"))
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--prompts", type=int, default=60)
    ap.add_argument("--words", type=int, default=8)
    ap.add_argument("--seed", type=int, default=33)
    ap.add_argument("--gen-length", type=int, default=64)
    ap.add_argument("--nll-groups", type=int, default=0, help="0: mask one token at a time")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--only", nargs="*", help="labels of SETTINGS to run (default: all; none: only --extra)")
    ap.add_argument("--extra", action="append", default=[],
                    help="another setting: 'LABEL=--opt value ...' (repeatable)")
    ap.add_argument("--json", help="write every setting's metrics and answers here")
    a = ap.parse_args()

    exe = os.path.join(a.build, "tessera")
    if not os.access(exe, os.X_OK):
        raise SystemExit(f"decoding_sweep: {exe} is not built")
    nll_exe = build_nll_tool(a.build)
    settings = [s for s in SETTINGS if a.only is None or s[0] in a.only]
    for e in a.extra:
        label, _, opts = e.partition("=")
        settings.append((label.strip(), opts.split()))
    if a.only and len(settings) < len(set(a.only)) + len(a.extra):
        raise SystemExit("decoding_sweep: unknown label in --only; the labels: " +
                         "; ".join(s[0] for s in SETTINGS))
    heldout_prompts = pick_prompts(a.heldout, a.prompts, a.words, a.seed)
    prompts = [p for p, _ in heldout_prompts] + SHOWCASE
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), OMP_WAIT_POLICY="PASSIVE")
    out = {"model": a.model, "gen_length": a.gen_length, "prompts": prompts[:len(heldout_prompts)],
           "settings": []}
    print(f"{len(heldout_prompts)} held-out prompts of {a.words} words (seed {a.seed}), gen-length "
          f"{a.gen_length}; pNLL masks {'one token' if a.nll_groups <= 0 else str(a.nll_groups) + ' groups'}"
          " at a time\n")
    print("| setting | d2 | rep4 | loop | len | short | pNLL |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    # the row the settings are read against: the documents' own continuations, cut to gen-length tokens
    ref = score(nll_exe, a, [{"prompt": p, "answer_text": rest, "max_tokens": a.gen_length}
                             for p, rest in heldout_prompts], env)
    r = metrics([x["ids"] for x in ref], [x["nll"] for x in ref])
    out["reference"] = r
    print(f"| *held-out text (reference)* | {r['d2']:.3f} | {r['rep4']:.3f} | {r['loop']:.2f} | {r['len']:.1f} | "
          f"{r['short']:.2f} | {r['pnll']:.3f} |", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        pf = os.path.join(tmp, "prompts.txt")
        with open(pf, "w", encoding="utf-8") as f:  # JSON strings: prompts may start with a quote
            f.write("".join(json.dumps(p) + "\n" for p in prompts))
        n = len(heldout_prompts)
        for label, opts in settings:
            try:
                r = run_setting(a, exe, nll_exe, pf, prompts, n, opts, env)
            except RuntimeError as e:
                print(f"| {label} | error: {e} | | | | | |")
                out["settings"].append({"label": label, "options": opts, "error": str(e)})
                continue
            out["settings"].append(dict(r, label=label))
            print(f"| {label} | {r['d2']:.3f} | {r['rep4']:.3f} | {r['loop']:.2f} | {r['len']:.1f} | "
                  f"{r['short']:.2f} | {r['pnll']:.3f} |", flush=True)
            sys.stderr.write(f"  {label}: generate {r['generate_seconds']:.1f} s, pNLL {r['nll_seconds']:.1f} s;"
                             f" {r['answers'][n]['prompt']!r} ->{r['answers'][n]['text']!r}\n")
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1, ensure_ascii=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
