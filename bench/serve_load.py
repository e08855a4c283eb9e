#!/usr/bin/env python3
"""Load test of `tessera serve` (issue #31), standard library only: it starts the server itself (port 0)
and sends streamed completions from C concurrent clients, each on its own keep-alive connection, for
each C of --concurrency; per level: requests, failures, p50 / p99 latency, p50 / p99 time to the first
text event, completion tokens/s, and the server's RSS after it. Then the same at --slow-concurrency with
--slowloris connections dribbling a header a byte at a time (each gets its 408 at --header-timeout and
reconnects). Every answer is checked whole (a 200, text events, [DONE]); a failure is counted, never
skipped.

    python3 bench/serve_load.py [--binary build/tessera] [--model models/tessera-tiny]
        [--concurrency 1,8,32,64] [--requests 2500] [--max-tokens 16] [--slowloris 30] [--json out.json]
"""
import argparse
import http.client
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def start_server(binary, args, log):
    """`BINARY serve --port 0 ARGS`, logging to the open file `log`: (process, port) once it listens."""
    server = subprocess.Popen([binary, "serve", "--port", "0"] + args, stderr=log, stdout=log)
    for _ in range(300):
        time.sleep(0.1)
        m = re.search(r"127\.0\.0\.1:(\d+)", open(log.name).read())
        if m:
            return server, int(m.group(1))
    server.terminate()
    sys.exit("the server did not start: " + open(log.name).read())


def one(conn, body):
    """One streamed completion on a keep-alive connection: (latency, first event, tokens) or None."""
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        r.read()
        return None
    first, tokens, done = None, 0, False
    for line in r:
        if line.startswith(b"data: [DONE]"):
            done = True
        elif line.startswith(b"data: {"):
            ev = json.loads(line[6:])
            if first is None and ev.get("choices") and ev["choices"][0].get("text"):
                first = time.perf_counter() - t0
            if ev.get("usage"):
                tokens = ev["usage"]["completion_tokens"]
            if "error" in ev:
                return None
    if not done:
        return None
    return time.perf_counter() - t0, first if first is not None else time.perf_counter() - t0, tokens


def level(port, clients, requests, body):
    lat, ttfe, toks = [], [], []
    failures = [0]
    lock = threading.Lock()
    left = [requests]

    def worker():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        while True:
            with lock:
                if left[0] == 0:
                    break
                left[0] -= 1
            try:
                res = one(conn, body)
            except (OSError, http.client.HTTPException):
                res = None
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
            with lock:
                if res is None:
                    failures[0] += 1
                else:
                    lat.append(res[0])
                    ttfe.append(res[1])
                    toks.append(res[2])
        conn.close()

    t0 = time.perf_counter()
    ts = [threading.Thread(target=worker) for _ in range(clients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.perf_counter() - t0
    return {
        "clients": clients,
        "requests": requests,
        "failures": failures[0],
        "p50_s": pct(lat, 50),
        "p99_s": pct(lat, 99),
        "first_event_p50_s": pct(ttfe, 50),
        "first_event_p99_s": pct(ttfe, 99),
        "tokens_per_s": sum(toks) / wall,
        "requests_per_s": len(lat) / wall,
        "wall_s": wall,
    }


def slowloris(port, n, stop, timeouts):
    """n connections that send a header a byte every 0.2 s; each reconnects when the server ends it."""

    def one_conn():
        while not stop.is_set():
            try:
                s = socket.create_connection(("127.0.0.1", port))
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
                s.settimeout(0.2)
                while not stop.is_set():
                    try:
                        if s.recv(4096).startswith(b"HTTP/1.1 408"):
                            timeouts[0] += 1
                        break
                    except socket.timeout:
                        s.sendall(b"X")
                s.close()
            except OSError:
                time.sleep(0.1)

    ts = [threading.Thread(target=one_conn, daemon=True) for _ in range(n)]
    for t in ts:
        t.start()
    return ts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default="build/tessera")
    ap.add_argument("--model", default="models/tessera-tiny")
    ap.add_argument("--concurrency", default="1,8,32,64")
    ap.add_argument("--requests", type=int, default=2500, help="requests per concurrency level")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--slowloris", type=int, default=30)
    ap.add_argument("--slow-concurrency", type=int, default=8)
    ap.add_argument("--slow-requests", type=int, default=500)
    ap.add_argument("--header-timeout", type=float, default=2.0)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    log = tempfile.NamedTemporaryFile(prefix="serve_load", suffix=".log", delete=False)
    server, port = start_server(a.binary, ["-m", a.model, "--batch", str(a.batch), "--max-queue", "256",
                                           "--header-timeout", str(a.header_timeout), "--access-log", "off"], log)
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": a.max_tokens, "steps": a.max_tokens,
                       "block_length": a.max_tokens, "stream": True, "stream_options": {"include_usage": True}})
    rows = []
    try:
        level(port, 1, 5, body)  # warm up: the first steps plan
        print(f"{'clients':>8} {'requests':>9} {'fail':>5} {'p50 s':>7} {'p99 s':>7} {'1st p50':>8} "
              f"{'1st p99':>8} {'tok/s':>7} {'req/s':>6} {'RSS MiB':>8}", flush=True)
        total = 0

        def show(r):
            print(f"{r['clients']:>8} {r['requests']:>9} {r['failures']:>5} {r['p50_s']:7.3f} {r['p99_s']:7.3f} "
                  f"{r['first_event_p50_s']:8.3f} {r['first_event_p99_s']:8.3f} {r['tokens_per_s']:7.0f} "
                  f"{r['requests_per_s']:6.1f} {r['rss_mib']:8.1f}{r.get('note', '')}", flush=True)

        for c in [int(x) for x in a.concurrency.split(",")]:
            r = level(port, c, a.requests, body)
            total += a.requests
            r["rss_mib"] = rss_mib(server.pid)
            rows.append(r)
            show(r)
        stop, timeouts = threading.Event(), [0]
        slow = slowloris(port, a.slowloris, stop, timeouts)
        time.sleep(0.5)
        r = level(port, a.slow_concurrency, a.slow_requests, body)
        stop.set()
        for t in slow:
            t.join(timeout=2)
        r["rss_mib"] = rss_mib(server.pid)
        r["slowloris"] = a.slowloris
        r["slowloris_408"] = timeouts[0]
        r["note"] = f"  (beside {a.slowloris} slowloris connections: {timeouts[0]} got 408)"
        rows.append(r)
        show(r)
        print(f"serve_load: {total + a.slow_requests} requests, RSS {rss_mib(server.pid):.1f} MiB after them",
              flush=True)
    finally:
        server.terminate()
        server.wait(timeout=60)
        os.unlink(log.name)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    if any(r["failures"] for r in rows):
        sys.exit("serve_load: some requests failed")


if __name__ == "__main__":
    main()
