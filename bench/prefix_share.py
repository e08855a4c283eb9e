#!/usr/bin/env python3
"""The cross-request prefix cache (issue #31) on a shared-system-prompt workload, side by side in one
run: `tessera serve` on a block-causal (LLaDA2) model with --prefix-cache 0 and with it on; C clients
send N completions whose prompts share --shared tokens (a system prompt) and end in --own tokens of
their own, with the KV cache on (`"cache": "prefix"`, blocks of --block). Per setting: p50 / p99
latency, p50 time to the first text event, requests/s, and the prompt blocks restored; the answers of
the two settings must be equal (the cache is exact). Standard library only; the model is made with
tools/make_tiny_checkpoint.py (its size by --hidden / --layers) unless --model names one.

    python3 bench/prefix_share.py [--binary build/tessera] [--hidden 256 --layers 4] [--shared 448]
        [--own 16] [--requests 48] [--clients 4] [--max-tokens 32] [--block 32]
"""
import argparse
import http.client
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time

from serve_load import pct, start_server  # bench/ is this script's directory


def one(port, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"status {r.status}: {r.read()[:300]}")
    first, text = None, ""
    for line in r:
        if line.startswith(b"data: {"):
            ev = json.loads(line[6:])
            t = ev["choices"][0].get("text", "") if ev.get("choices") else ""
            if t and first is None:
                first = time.perf_counter() - t0
            text += t
    c.close()
    return time.perf_counter() - t0, first if first is not None else time.perf_counter() - t0, text


def metric(port, name):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("GET", "/metrics")
    body = c.getresponse().read().decode()
    m = re.search(re.escape(name) + r" ([0-9.e+]+)", body)
    return float(m.group(1)) if m else 0.0


def run(port, bodies, clients):
    lat, first, texts = [], [], [None] * len(bodies)
    lock, nxt = threading.Lock(), [0]

    def worker():
        while True:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= len(bodies):
                return
            l, f, t = one(port, bodies[i])
            with lock:
                lat.append(l)
                first.append(f)
                texts[i] = t

    t0 = time.perf_counter()
    ts = [threading.Thread(target=worker) for _ in range(clients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return lat, first, texts, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default="build/tessera")
    ap.add_argument("--model", default="")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--shared", type=int, default=448)
    ap.add_argument("--own", type=int, default=16)
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--block", type=int, default=32)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="prefix_share")
    model = a.model
    if not model:
        model = os.path.join(tmp, "llada2")
        py = os.environ.get("TESSERA_PYTHON", "/usr/bin/python3")  # with numpy (tests/reference)
        subprocess.run([py, os.path.join(os.path.dirname(__file__), "..", "tools", "make_tiny_checkpoint.py"),
                        "--family", "llada2", "--out", model, "--hidden", str(a.hidden), "--layers", str(a.layers),
                        "--intermediate", str(4 * a.hidden), "--max-pos", "2048", "--vocab", "300"], check=True,
                       stdout=subprocess.DEVNULL)
    rng = random.Random(1)
    shared = [rng.randrange(0, 290) for _ in range(a.shared)]
    bodies = [{"prompt": shared + [rng.randrange(0, 290) for _ in range(a.own)], "max_tokens": a.max_tokens,
               "block_length": a.block, "steps": a.block, "cache": "prefix", "stream": True}
              for _ in range(a.requests)]
    print(f"model {model}: {a.requests} requests from {a.clients} clients, prompts of {a.shared} shared + "
          f"{a.own} own tokens, {a.max_tokens} generated in blocks of {a.block}", flush=True)
    print(f"{'prefix cache':>13} {'p50 s':>7} {'p99 s':>7} {'1st p50':>8} {'req/s':>6} {'blocks hit':>10}", flush=True)
    answers = {}
    for setting in ("0", "1G"):
        log = tempfile.NamedTemporaryFile(prefix="prefix_share", suffix=".log", delete=False)
        server, port = start_server(a.binary, ["-m", model, "--batch", "8", "--access-log", "off",
                                               "--prefix-cache", setting], log)
        try:
            one(port, dict(bodies[0], prompt=[1, 2, 3]))  # warm up: plans, with no shared prefix
            lat, first, texts, wall = run(port, bodies, a.clients)
            hits = metric(port, 'tessera_prefix_cache_blocks_total{event="hit"}')
        finally:
            server.terminate()
            server.wait(timeout=60)
            os.unlink(log.name)
        answers[setting] = texts
        print(f"{'off' if setting == '0' else setting:>13} {pct(lat, 50):7.3f} {pct(lat, 99):7.3f} "
              f"{pct(first, 50):8.3f} {len(lat) / wall:6.2f} {hits:10.0f}", flush=True)
    same = sum(x == y for x, y in zip(answers["0"], answers["1G"]))
    print(f"answers equal with and without the cache: {same} of {a.requests}")
    if same != a.requests:
        sys.exit("prefix_share: the prefix cache changed an answer")


if __name__ == "__main__":
    main()
