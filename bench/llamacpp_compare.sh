#!/usr/bin/env bash
# tessera vs llama.cpp's llama-diffusion-cli on the same GGUF files: one generation each, the same canvas
# (prompt + G masks, one block), the same number of denoising steps, greedy, the same threads. Both
# tools report their own generation time (model loading excluded); the table gives ms per step.
#   bash bench/llamacpp_compare.sh LLAMA_DIFFUSION_CLI MODEL.gguf [MODEL.gguf ...]
# Env: GEN (224), STEPS (32), THREADS (2), PROMPT ("Once upon a time").
# llama-diffusion-cli is not in the npm package: build it from the llama.cpp source that
# scripts/fetch_llamacpp.sh clones (cmake -S SRC -B SRC/build -DLLAMA_CURL=OFF && ninja -C SRC/build
# llama-diffusion-cli). Its block-based schedule needs the whole canvas (-ub) to be a multiple of the
# block: the block is the whole canvas here, so its prompt positions (never masked) count in it.
set -euo pipefail
cli=$1; shift
GEN=${GEN:-224}; STEPS=${STEPS:-32}; THREADS=${THREADS:-2}; PROMPT=${PROMPT:-Once upon a time}
cd "$(dirname "$0")/.."
printf "| model | canvas | steps | tessera ms/step | llama.cpp ms/step | speed-up |\n|---|---|---|---|---|---|\n"
for m in "$@"; do
  j=$(OMP_NUM_THREADS=$THREADS ./build/tessera generate -m "$m" -p "$PROMPT" --gen-length "$GEN" \
      --steps "$STEPS" --block-length "$GEN" --json 2>/dev/null)
  read -r P S < <(python3 -c 'import json,sys; j=json.loads(sys.argv[1]); print(j["prompt_tokens"], j["seconds"])' "$j")
  L=$((P + GEN))
  t=$("$cli" -m "$m" -p "$PROMPT" --diffusion-steps "$STEPS" --diffusion-block-length "$L" --temp 0 \
      -t "$THREADS" -ub "$L" -b "$L" -c "$L" 2>&1 | grep -a "total time" | grep -o "per step: [0-9.]*" | head -1 | grep -o "[0-9.]*$")
  python3 -c 'import sys; m,L,st,S,t=sys.argv[1:]; a=float(S)*1000/int(st); print(f"| {m} | {L} | {st} | {a:.1f} | {float(t):.1f} | {float(t)/a:.2f}x |")' \
    "$(basename "$m")" "$L" "$STEPS" "$S" "$t"
done
