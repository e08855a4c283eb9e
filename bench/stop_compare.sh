#!/usr/bin/env bash
# Ending at an EOS or a stop sequence inside a block (the default, mid_block_stop) against ending only at
# block ends (--compare mid-block-stop=off), side by side in one `tessera bench` run per prompt; the
# answers are identical (agreement 1). Prompts: the first words of held-out texts (BOS first, as
# tessera generate --raw). Totals per setting: steps, seconds, and the speed-up of the sums.
#   bash bench/stop_compare.sh [N_PROMPTS]
# Env: MODEL (models/tessera-tiny), GEN (128), STOP ("."), TEMP (0.8), THREADS (2).
set -euo pipefail
N=${1:-16}; MODEL=${MODEL:-models/tessera-tiny}; GEN=${GEN:-128}; STOP=${STOP:-.}; TEMP=${TEMP:-0.8}
THREADS=${THREADS:-2}
cd "$(dirname "$0")/.."
mapfile -t prompts < <(python3 -c '
import json, sys
for line in list(open("models/heldout.jsonl"))[:int(sys.argv[1])]:
    print(" ".join(json.loads(line)["text"].split()[:6]))' "$N")
settings=(
  "LLaDA low_confidence, blocks of 32|--block-length 32 --steps $GEN"
  "LLaDA low_confidence, one block|--block-length $GEN --steps $GEN"
  "LLaDA, threshold 0.9, blocks of 32|--block-length 32 --steps $GEN --threshold 0.9"
  "Dream entropy, one block|--block-length $GEN --steps $GEN --alg entropy"
)
out=$(mktemp -d)
printf "| setting | prompts | answer tokens | steps (block ends) | steps (inside blocks) | seconds (block ends) | seconds (inside) | speed-up |\n"
printf "|---|---|---|---|---|---|---|---|\n"
for s in "${settings[@]}"; do
  name=${s%%|*}; args=${s#*|}
  i=0
  for p in "${prompts[@]}"; do
    # shellcheck disable=SC2086
    OMP_NUM_THREADS=$THREADS ./build/tessera bench -m "$MODEL" -p "$p" --gen-length "$GEN" $args \
      --temperature "$TEMP" --seed "$i" --eos --stop "$STOP" --compare mid-block-stop=off \
      --json "$out/$i.json" > /dev/null
    i=$((i + 1))
  done
  python3 - "$name" "$out" "$i" <<'PY'
import json, sys
name, d, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
tok = st_on = st_off = s_on = s_off = 0
for i in range(n):
    rows = json.load(open(f"{d}/{i}.json"))["rows"]
    on, off = rows[0], rows[1]
    assert on["agreement"] == 1.0 and off["agreement"] == 1.0 and on["tokens"] == off["tokens"], (i, on, off)
    tok += on["tokens"]; st_on += on["steps"]; st_off += off["steps"]; s_on += on["seconds"]; s_off += off["seconds"]
print(f"| {name} | {n} | {tok} | {st_off} | {st_on} | {s_off:.2f} | {s_on:.2f} | {s_off / s_on:.2f}x |")
PY
done
rm -rf "$out"
