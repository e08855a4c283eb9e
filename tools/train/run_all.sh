#!/usr/bin/env bash
# The whole pipeline of the bundled tiny dLLMs: corpus -> tokenizer -> encode -> tokenizer check ->
# train dense (tessera-tiny) -> train MoE (tessera-tiny-moe) -> fine-tune tri-mode (tessera-tiny-tri, from
# tessera-tiny's weights) -> export -> evaluate -> MODEL_CARD.md.
#
#   bash tools/train/run_all.sh                  everything (needs apt-get for the corpus packages)
#   bash tools/train/run_all.sh --train-only     from an existing tools/train/data/{tokens,tokenizer}
#                                                (what a GPU machine runs: carry those two folders)
#   bash tools/train/run_all.sh --data-only      corpus, tokenizer, encoding and check only
#   bash tools/train/run_all.sh --smoke          small models, 3 minutes each, into tools/train/runs/smoke/
#
# Environment: PYTHON (default /usr/bin/python3 when it has torch, else python3), DEVICE (cpu|cuda;
# default cuda when available), BUDGET (minutes per model, default 120), STEPS (optional step cap),
# MODELS (output dir, default models), RUNS (default tools/train/runs), TESSERA (a tessera binary for
# the tokenizer check and the sample generations; default build/tessera when present), SEED (0),
# TRAIN_ARGS (extra train.py arguments for every model), ONLY (tiny | moe | tri: train just one),
# TRI_BUDGET (minutes for the tri-mode fine-tune, default 50).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"

mode=all
for arg in "$@"; do
  case "$arg" in
    --train-only) mode=train ;;
    --data-only) mode=data ;;
    --smoke) mode=smoke ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "unknown argument $arg" >&2; exit 2 ;;
  esac
done

if [[ -z "${PYTHON:-}" ]]; then
  if /usr/bin/python3 -c "import torch" 2>/dev/null; then PYTHON=/usr/bin/python3; else PYTHON=python3; fi
fi
DATA="$here/data"
RUNS="${RUNS:-$here/runs}"
MODELS="${MODELS:-$root/models}"
BUDGET="${BUDGET:-120}"
SEED="${SEED:-0}"
TRAIN_ARGS="${TRAIN_ARGS:-}"
if [[ -z "${TESSERA:-}" && -x "$root/build/tessera" ]]; then TESSERA="$root/build/tessera"; fi
TESSERA="${TESSERA:-}"
dev_args=()
[[ -n "${DEVICE:-}" ]] && dev_args=(--device "$DEVICE")
step_args=()
[[ -n "${STEPS:-}" ]] && step_args=(--steps "$STEPS")

sudo_if_needed() { if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi; }

if [[ "$mode" == all || "$mode" == data || "$mode" == smoke ]]; then
  if [[ "$mode" != smoke || ! -f "$DATA/tokens/train.bin" ]]; then
    # python3-regex for the pre-tokenizer's \p{L}; python3-torch and numpy for training
    need=()
    /usr/bin/python3 -c "import regex" 2>/dev/null || need+=(python3-regex)
    /usr/bin/python3 -c "import numpy" 2>/dev/null || need+=(python3-numpy)
    "$PYTHON" -c "import torch" 2>/dev/null || need+=(python3-torch)
    if (( ${#need[@]} )); then
      sudo_if_needed apt-get update -qq
      sudo_if_needed apt-get install -y -qq "${need[@]}"
    fi
    /usr/bin/python3 "$here/corpus.py" --data "$DATA"
    /usr/bin/python3 "$here/bpe.py" train --data "$DATA" --vocab 4096
    /usr/bin/python3 "$here/bpe.py" encode --data "$DATA"
    if [[ -f "$root/build/libtessera_lib.a" ]]; then
      /usr/bin/python3 "$here/bpe.py" check --data "$DATA" --tessera-build "$root/build"
    else
      /usr/bin/python3 "$here/bpe.py" check --data "$DATA"
    fi
  fi
  [[ "$mode" == data ]] && exit 0
fi

[[ -f "$DATA/tokens/train.bin" ]] || { echo "no $DATA/tokens/train.bin: run without --train-only first" >&2; exit 1; }

train_one() {  # preset name outdir
  local preset="$1" name="$2" run="$RUNS/$2" out="$3"
  shift 3
  mkdir -p "$run"
  # shellcheck disable=SC2086
  "$PYTHON" "$here/train.py" --preset "$preset" --data "$DATA" --out "$run" --export "$out" --seed "$SEED" \
    "${dev_args[@]}" "${step_args[@]}" "$@" $TRAIN_ARGS 2>&1 | tee "$run/train.txt"
  local tes=()
  [[ -n "$TESSERA" ]] && tes=(--tessera "$TESSERA")
  "$PYTHON" "$here/evaluate.py" --model "$out" --run "$run" --data "$DATA" --card --name "$name" \
    "${dev_args[@]}" "${tes[@]}" 2>&1 | tee "$run/evaluate.txt"
}

if [[ "$mode" == smoke ]]; then
  RUNS="$here/runs/smoke"
  train_one smoke tessera-tiny "$RUNS/models/tessera-tiny" --time-budget-minutes 3 --eval-every 100 \
    --eval-windows 16 --warmup 50
  train_one smoke-moe tessera-tiny-moe "$RUNS/models/tessera-tiny-moe" --time-budget-minutes 3 \
    --eval-every 100 --eval-windows 16 --warmup 50
  train_one smoke-tri tessera-tiny-tri "$RUNS/models/tessera-tiny-tri" --init "$RUNS/models/tessera-tiny" \
    --time-budget-minutes 3 --seq-len 128 --eval-every 100 --eval-windows 16 --warmup 50
  exit 0
fi

if [[ -z "${ONLY:-}" || "${ONLY:-}" == tiny ]]; then
  train_one tessera-tiny tessera-tiny "$MODELS/tessera-tiny" --time-budget-minutes "$BUDGET"
fi
if [[ -z "${ONLY:-}" || "${ONLY:-}" == moe ]]; then
  train_one tessera-tiny-moe tessera-tiny-moe "$MODELS/tessera-tiny-moe" --time-budget-minutes "$BUDGET"
fi
if [[ -z "${ONLY:-}" || "${ONLY:-}" == tri ]]; then
  # joint AR + block-diffusion objective from tessera-tiny's weights (seq 256: the 2L-token joint sequence)
  train_one tessera-tiny-tri tessera-tiny-tri "$MODELS/tessera-tiny-tri" --init "$MODELS/tessera-tiny" \
    --seq-len 256 --batch-size 16 --lr 6e-4 --warmup 100 --eval-every 250 --eval-windows 32 \
    --time-budget-minutes "${TRI_BUDGET:-50}"
fi
du -ch "$MODELS"/tessera-tiny*/*.safetensors | tail -1
