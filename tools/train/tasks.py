#!/usr/bin/env python3
"""Generated tasks with exact answers, for training and scoring tessera-task.

  tasks.py sample  [--n 5] [--seed 0]                       print examples of every task
  tasks.py heldout --out models/tessera-task/tasks.jsonl    write the held-out set (seeded, disjoint from training)

Five tasks; every prompt ends with a newline and every target ends with "Answer: X", X being the exact answer
that `tessera eval --task` compares (the text after the last "Answer:" of the generation, to its first newline):
  add      two numbers of 2, 3 or 4 digits (both alike); the target works the columns right to left
           ("1+9=10 2+3+1=6 ...")
  sort     4-10 two-digit numbers in ascending order
  reverse  4-10 two-digit numbers in reverse order
  lookup   a needle among distractors: 4-150 "word number" records (prompts up to ~1000 tokens), one is asked for
  trace    a 3-6 statement program over a..d with + and -; the target traces every assignment

Training examples come from seed streams of the form 1000 + k, the held-out set from seed 7 (the generator
also drops any held-out prompt from the training stream, so the two never share a prompt).
"""
import argparse
import json
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TASKS = ("add", "sort", "reverse", "lookup", "trace")
MARK = "Answer:"


def _num(r, lo_digits, hi_digits):
    d = r.randint(lo_digits, hi_digits)
    return r.randint(10 ** (d - 1), 10 ** d - 1)


def gen_add(r):
    d = r.randint(2, 4)
    a, b = _num(r, d, d), _num(r, d, d)
    da, db = str(a)[::-1], str(b)[::-1]
    steps, carry = [], 0
    for i in range(max(len(da), len(db))):
        terms = [int(s[i]) for s in (da, db) if i < len(s)] + ([carry] if carry else [])
        s = sum(terms)
        steps.append("+".join(map(str, terms)) + "=" + str(s) if len(terms) > 1 else f"{terms[0]}={s}")
        carry = s // 10
    ans = str(a + b)
    return f"Add {a} and {b}.\n", " ".join(steps) + f" {MARK} {ans}", ans


def _list(r):
    return [r.randint(10, 99) for _ in range(r.randint(4, 10))]


def gen_sort(r):
    xs = _list(r)
    ans = " ".join(map(str, sorted(xs)))
    return "Sort: " + " ".join(map(str, xs)) + "\n", f"{MARK} {ans}", ans


def gen_reverse(r):
    xs = _list(r)
    ans = " ".join(map(str, xs[::-1]))
    return "Reverse: " + " ".join(map(str, xs)) + "\n", f"{MARK} {ans}", ans


_WORDS = None


def words():
    """Lower-case words of 4+ letters that the bundled tokenizer writes as one token with a leading space."""
    global _WORDS
    if _WORDS is None:
        with open(os.path.join(HERE, "..", "..", "models", "tessera-tiny", "tokenizer.json"), encoding="utf-8") as f:
            vocab = json.load(f)["model"]["vocab"]
        _WORDS = sorted(p[1:] for p in vocab if p.startswith("\u0120") and p[1:].isalpha() and p[1:].islower()
                        and p[1:].isascii() and len(p) >= 5)
    return _WORDS


def gen_lookup(r, max_records=150):
    # the length is spread over the context: two thirds of the prompts under ~250 tokens, the rest up to ~910
    n = r.randint(4, 36) if r.random() < 2 / 3 else r.randint(37, 150)
    if n > max_records:  # a training curriculum's shorter prompts (the held-out set never takes this branch)
        n = r.randint(4, max_records)
    keys = r.sample(words(), n)
    vals = [r.randint(100, 999) for _ in keys]
    q = r.randrange(n)
    recs = ",".join(f" {k} {v}" for k, v in zip(keys, vals))
    return f"Records:{recs}.\nFind {keys[q]}.\n", f"{MARK} {vals[q]}", str(vals[q])


def gen_trace(r):
    while True:
        env, stmts, trace = {}, [], []
        for _ in range(r.randint(3, 6)):
            var = r.choice("abcd")

            def operand():
                if env and r.random() < 0.6:
                    v = r.choice(sorted(env))
                    return v, env[v]
                k = r.randint(1, 9)
                return str(k), k

            if not env:
                k = r.randint(1, 20)
                stmts.append(f"{var}={k}")
                env[var] = k
            else:
                (x, xv), (y, yv) = operand(), operand()
                op = r.choice("+-")
                env[var] = xv + yv if op == "+" else xv - yv
                stmts.append(f"{var}={x}{op}{y}")
            trace.append(f"{var}={env[var]}")
        if all(0 <= v <= 99 for v in env.values()):
            last = stmts[-1].split("=")[0]
            ans = str(env[last])
            return "Run: " + "; ".join(stmts) + f". Print {last}.\n", ", ".join(trace) + f". {MARK} {ans}", ans


GEN = {"add": gen_add, "sort": gen_sort, "reverse": gen_reverse, "lookup": gen_lookup, "trace": gen_trace}


def example(r, task):
    prompt, target, answer = GEN[task](r)
    return {"task": task, "prompt": prompt, "target": target, "answer": answer}


def heldout(per_task, seed=7):
    r = random.Random(seed)
    out = []
    for task in TASKS:
        seen = set()
        while sum(1 for e in out if e["task"] == task) < per_task:
            e = example(r, task)
            if e["prompt"] not in seen:
                seen.add(e["prompt"])
                out.append(e)
    return out


def stream(seed, exclude, mix=None, lookup_max=150):
    """Endless training examples, never a held-out prompt: the tasks in turn, or drawn with the weights of mix
    ({task: weight}); lookup_max caps the lookup's records (a curriculum)."""
    r = random.Random(1000 + seed)
    while True:
        order = TASKS if mix is None else r.choices(list(mix), weights=list(mix.values()), k=len(TASKS))
        for task in order:
            if task == "lookup":
                prompt, target, answer = gen_lookup(r, lookup_max)
                e = {"task": task, "prompt": prompt, "target": target, "answer": answer}
            else:
                e = example(r, task)
            if e["prompt"] not in exclude:
                yield e


def extract(text):
    """The answer a generation gives: the text after the last "Answer:", to its first newline, stripped."""
    i = text.rfind(MARK)
    if i < 0:
        return None
    return text[i + len(MARK):].split("\n", 1)[0].strip()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sample")
    s.add_argument("--n", type=int, default=3)
    s.add_argument("--seed", type=int, default=0)
    h = sub.add_parser("heldout")
    h.add_argument("--out", required=True)
    h.add_argument("--per-task", type=int, default=200)
    a = ap.parse_args()
    if a.cmd == "sample":
        r = random.Random(a.seed)
        for task in TASKS:
            for _ in range(a.n):
                print(json.dumps(example(r, task)))
    else:
        with open(a.out, "w") as f:
            for e in heldout(a.per_task):
                f.write(json.dumps({k: e[k] for k in ("task", "prompt", "answer", "target")}) + "\n")
        print(f"wrote {a.out}: {a.per_task} per task x {len(TASKS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
