#!/bin/bash
# Tensor parallelism on the same cores, side by side in one run (docs/PERF.md, "Tensor and expert
# parallelism over MPI"): for each binary given (e.g. two commits' builds), one process with 2 threads
# against `mpirun -np 2 --bind-to core` with --tp 2 and 1 thread per rank, on tessera-tiny and on llada-mid's
# geometry (synthetic weights). Prints seconds, collective bytes and calls, weights and activation peak.
# Usage: bash bench/tp_compare.sh [BINARY ...]   (default: ./build/tessera)
set -euo pipefail
cd "$(dirname "$0")/.."
bins=("$@")
[ ${#bins[@]} -eq 0 ] && bins=(./build/tessera)
py=/usr/bin/python3
summary='import json,sys
j = json.load(sys.stdin); r = j["rows"][0]
print("  %.3f s, collectives %.2f MiB in %d calls, weights %s B, activation peak %d B" % (r["seconds"],
      r["comm_bytes"] / 2**20, r["comm_calls"], r.get("weight_bytes", j.get("weight_bytes")), r["activation_peak_bytes"]))'
for model in "-m models/tessera-tiny --prompt-len 448" "--geometry llada-mid --prompt-len 480"; do
  args="bench $model --gen-length 32 --steps 32 --block-length 32 --reps 3 --json"
  echo "### $model"
  for bin in "${bins[@]}"; do
    echo "$bin, one process, 2 threads:"
    $bin $args --threads 2 2>/dev/null | $py -c "$summary"
    echo "$bin, mpirun -np 2 --tp 2, 1 thread each:"
    mpirun --allow-run-as-root --oversubscribe -np 2 --bind-to core $bin $args --tp 2 --threads 1 2>/dev/null |
      $py -c "$summary"
  done
done
