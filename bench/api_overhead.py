#!/usr/bin/env python3
"""What the Python package (and under it the C API) costs over the engine: the wall time of
LLM.generate against the generation time the engine reports for the same call, with and without a step
callback, and a stream; beside them the same request through `tessera generate --json` (its process
start and model load excluded: its own "seconds"). Medians of --n runs, side by side in one process.

    PYTHONPATH=build/python python3 bench/api_overhead.py [--model models/tessera-tiny] [--n 20]
"""
import argparse
import json
import os
import statistics
import subprocess
import time

import tessera


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/tessera-tiny")
    ap.add_argument("--binary", default="build/tessera")
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--gen-length", type=int, default=64)
    ap.add_argument("--steps", type=int, default=64)
    a = ap.parse_args()
    prompt = "Once upon a time"
    params = tessera.SamplingParams(gen_length=a.gen_length, steps=a.steps, stop_at_eos=False)
    llm = tessera.LLM(a.model)
    llm.generate(prompt, params)  # warm up: the first steps plan
    rows = []

    def measure(name, call):
        wall, engine = [], []
        for _ in range(a.n):
            t0 = time.perf_counter()
            out = call()
            wall.append(time.perf_counter() - t0)
            engine.append(out.timings["seconds"])
        w, e = statistics.median(wall), statistics.median(engine)
        rows.append((name, w * 1e3, e * 1e3, (w - e) * 1e3))

    measure("generate", lambda: llm.generate(prompt, params)[0])
    measure("generate + on_step", lambda: llm.generate(prompt, params, on_step=lambda ev: False)[0])

    def streamed():
        s = llm.stream(prompt, params)
        for _ in s:
            pass
        return s.output
    measure("stream (events with text)", streamed)

    cli = []
    env = dict(os.environ, OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "PASSIVE"))
    for _ in range(max(3, a.n // 4)):
        out = subprocess.run([a.binary, "generate", "-m", a.model, "-p", prompt, "--raw", "--json", "--gen-length",
                              str(a.gen_length), "--steps", str(a.steps)], check=True, capture_output=True,
                             text=True, env=env).stdout
        cli.append(json.loads(out.strip().splitlines()[-1])["seconds"])
    print(f"{a.model}: {a.gen_length} tokens in {a.steps} steps, medians of {a.n}")
    print(f"{'path':28} {'wall ms':>9} {'engine ms':>10} {'overhead ms':>12}")
    for name, w, e, o in rows:
        print(f"{name:28} {w:9.2f} {e:10.2f} {o:12.2f}")
    print(f"{'tessera generate (CLI)':28} {'':9} {statistics.median(cli) * 1e3:10.2f}")


if __name__ == "__main__":
    main()
