#!/usr/bin/env bash
# Quantized GGUF weights kept quantized (the CPU default) against the same file converted to bf16 at load
# (--dequantize): ms per denoising step and peak RSS of one generation each, side by side in one run; and,
# when scripts/fetch_llamacpp.sh has built the oracle, llama.cpp's own forward over a canvas of the same
# length (every row's logits) on the same file.
#   bash bench/quant_compare.sh MODEL.gguf [MODEL.gguf ...]
# Env: GEN (224), STEPS (32), THREADS (2), PROMPT ("Once upon a time").
set -euo pipefail
GEN=${GEN:-224}; STEPS=${STEPS:-32}; THREADS=${THREADS:-2}; PROMPT=${PROMPT:-Once upon a time}
cd "$(dirname "$0")/.."
oracle=.llamacpp/bin/llamacpp-oracle
printf "| file | canvas | kept: ms/step | peak RSS | --dequantize: ms/step | peak RSS | kept slower by | llama.cpp ms/forward |\n"
printf "|---|---|---|---|---|---|---|---|\n"
for m in "$@"; do
  declare -A ms rss
  for mode in kept dequantize; do
    flag=""; [ "$mode" = dequantize ] && flag="--dequantize"
    out=$(OMP_NUM_THREADS=$THREADS /usr/bin/time -f "RSS %M" ./build/tessera generate -m "$m" -p "$PROMPT" \
          --gen-length "$GEN" --steps "$STEPS" --block-length "$GEN" --json $flag 2>&1 >/tmp/quant_compare.json)
    rss[$mode]=$(echo "$out" | grep -o "RSS [0-9]*" | grep -o "[0-9]*")
    read -r P ms[$mode] < <(python3 -c 'import json,sys; j=json.load(open("/tmp/quant_compare.json")); print(j["prompt_tokens"], j["seconds"] * 1000 / int(sys.argv[1]))' "$STEPS")
  done
  L=$((P + GEN))
  llama="-"
  if [ -x "$oracle" ]; then
    llama=$("$oracle" bench "$m" "$L" 5 --threads "$THREADS" 2>/dev/null | grep -o "ms_per_forward_median [0-9.]*" | grep -o "[0-9.]*$" || echo "-")
  fi
  python3 -c 'import sys; m,L,a,ra,b,rb,l=sys.argv[1:]; print(f"| {m} | {L} | {float(a):.1f} | {int(ra)/1024:.0f} MiB | {float(b):.1f} | {int(rb)/1024:.0f} MiB | {float(a)/float(b):.2f}x | {l} |")' \
    "$(basename "$m")" "$L" "${ms[kept]}" "${rss[kept]}" "${ms[dequantize]}" "${rss[dequantize]}" "$llama"
done
