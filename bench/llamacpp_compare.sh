#!/usr/bin/env bash
# tessera vs llama.cpp's llama-diffusion-cli on the same GGUF files: one generation each, the same canvas
# (prompt + G masks, one block), the same number of denoising steps (all of them: tessera bench does not
# end at an EOS), greedy, the same threads. Both tools report their own generation time (model loading
# excluded); the table gives ms per step.
#   bash bench/llamacpp_compare.sh LLAMA_DIFFUSION_CLI MODEL.gguf [MODEL.gguf ...]
# Env: GEN (224: masks; a list such as "250 1018 2042" gives one row per canvas), STEPS (32), THREADS (2),
# PROMPT ("Once upon a time"), ATTN ("": tessera's default CPU attention kernel; "f32 auto" adds a
# column per TESSERA_CPU_ATTN value, measured in the same run). tessera runs with --profile: the last
# column is its whole generation's FLOP rate (GEMMs, masked LM head, attention) over the bf16 GEMM rate
# that the same bench measures (issue #34's 75% target).
# llama-diffusion-cli is not in the npm package: build it from the llama.cpp source that
# scripts/fetch_llamacpp.sh clones (cmake -S SRC -B SRC/build -DLLAMA_CURL=OFF && ninja -C SRC/build
# llama-diffusion-cli). Its block-based schedule needs the whole canvas (-ub) to be a multiple of the
# block: the block is the whole canvas here, so its prompt positions (never masked) count in it.
set -euo pipefail
cli=$1; shift
GEN=${GEN:-224}; STEPS=${STEPS:-32}; THREADS=${THREADS:-2}; PROMPT=${PROMPT:-Once upon a time}
ATTN=${ATTN:-}
cd "$(dirname "$0")/.."
variants=${ATTN:-default}
head="| model | canvas | steps |"
for v in $variants; do head+=" tessera ms/step ($v) |"; done
printf "%s llama.cpp ms/step | speed-up | tessera, share of the GEMM rate |\n|---|---|---|%s---|---|---|\n" "$head" \
  "$(for v in $variants; do printf -- '---|'; done)"
for m in "$@"; do
  for g in $GEN; do
    row="" S="" P="" R=""
    for v in $variants; do
      # tessera bench: every step runs (no early end at an EOS, as llama-diffusion-cli runs them all).
      j=$(env ${ATTN:+TESSERA_CPU_ATTN=$v} OMP_NUM_THREADS=$THREADS ./build/tessera bench -m "$m" -p "$PROMPT" \
          --gen-length "$g" --steps "$STEPS" --block-length "$g" --threads "$THREADS" --profile --json 2>/dev/null)
      read -r P S R < <(python3 -c 'import json,sys; j=json.loads(sys.argv[1]); r=j["rows"][0]
assert r["steps"] == j["steps"], "tessera ran %d of %d steps" % (r["steps"], j["steps"])
print(j["prompt_tokens"], r["seconds"], r["counted_flops_per_second"] / j["gemm_rate_flops_per_second"])' "$j")
      row+=$(python3 -c 'import sys; print(f" {float(sys.argv[1])*1000/int(sys.argv[2]):.1f} |")' "$S" "$STEPS")
    done
    L=$((P + g))
    t=$("$cli" -m "$m" -p "$PROMPT" --diffusion-steps "$STEPS" --diffusion-block-length "$L" --temp 0 \
        -t "$THREADS" -ub "$L" -b "$L" -c "$L" 2>&1 | grep -a "total time" | grep -o "per step: [0-9.]*" | head -1 | grep -o "[0-9.]*$")
    # The speed-up is the last tessera column's (the last ATTN variant) against llama.cpp.
    python3 -c 'import sys; m,L,st,row,S,t,R=sys.argv[1:]; a=float(S)*1000/int(st); print(f"| {m} | {L} | {st} |{row} {float(t):.1f} | {float(t)/a:.2f}x | {100*float(R):.0f}% |")' \
      "$(basename "$m")" "$L" "$STEPS" "$row" "$S" "$t" "$R"
  done
done
