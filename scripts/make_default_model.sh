#!/usr/bin/env bash
# The default model until the trained tessera-tiny lands: llama2.c's stories260K (a real trained
# model from ../shared, converted to a causal checkpoint decoded one token per step), or, where
# ../shared is absent, a tiny random LLaDA checkpoint (its text is noise: it only shows the path).
set -euo pipefail
cd "$(dirname "$0")/.."
out=models/_setup/default
[ -f "$out/config.json" ] && exit 0
mkdir -p models/_setup
if [ -f ../shared/models/stories260K/stories260K.bin ]; then
  ./build/tessera convert-llama2c ../shared/models/stories260K/stories260K.bin \
    ../shared/models/stories260K/tok512.bin "$out" >/dev/null
else
  /usr/bin/python3 tools/make_tiny_checkpoint.py --family llada --out "$out" --hidden 128 --layers 2 >/dev/null
fi
