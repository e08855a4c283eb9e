#!/usr/bin/env python3
"""Latency of a running `tessera serve`: the HTTP overhead of a completion (wall time minus the
generation time the server reports), the time to the first streamed text event, and --clients
concurrent clients with their own prompts and seeds (batched by the server unless it runs with
--batch 1, which serves them one at a time). Standard library only.

    ./build/tessera serve --port 8080 &
    python3 bench/serve_latency.py --port 8080 [--n 20] [--max-tokens 64] [--block-length 16] [--clients 4]
"""
import argparse
import json
import statistics
import threading
import time
import urllib.request


def request(url, body, stream=False):
    r = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(r) as f:
        if stream:
            first = None
            for line in f:
                if first is None and line.startswith(b"data: {") and b'"text":""' not in line:
                    first = time.perf_counter() - t0
            return time.perf_counter() - t0, first
        reply = json.loads(f.read())
    return time.perf_counter() - t0, reply["tessera"]["seconds"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--block-length", type=int, default=16)
    ap.add_argument("--clients", type=int, default=4)
    a = ap.parse_args()
    url = f"http://127.0.0.1:{a.port}/v1/completions"
    body = {"prompt": "Once upon a time", "max_tokens": a.max_tokens, "block_length": a.block_length, "seed": 1}
    request(url, body)  # warm-up
    plain = [request(url, body) for _ in range(a.n)]
    streamed = [request(url, dict(body, stream=True), True) for _ in range(a.n)]
    ms = lambda x: f"{statistics.median(x) * 1e3:.1f} ms"
    print(f"completion: wall {ms([w for w, _ in plain])}, generation {ms([g for _, g in plain])}, "
          f"HTTP overhead {ms([w - g for w, g in plain])} (medians of {a.n})")
    print(f"streamed: wall {ms([w for w, _ in streamed])}, first text event {ms([f for _, f in streamed])}")
    walls = [None] * a.clients
    bodies = [dict(body, prompt=f"Once upon a time {i}", seed=i) for i in range(a.clients)]

    def client(i):
        walls[i] = request(url, bodies[i])[0]

    threads = [threading.Thread(target=client, args=(i,)) for i in range(a.clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    total = time.perf_counter() - t0
    with urllib.request.urlopen(f"http://127.0.0.1:{a.port}/health") as f:
        batch = json.loads(f.read()).get("batch", {})
    print(f"{a.clients} concurrent clients: done in {total * 1e3:.0f} ms, "
          f"each {sorted(round(w * 1e3) for w in walls)} ms; "
          f"{a.clients * a.max_tokens / total:.0f} tokens/s; server batch counts {batch}")


if __name__ == "__main__":
    main()
