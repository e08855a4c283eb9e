#!/usr/bin/env bash
# Runs openai_tools.mjs (the official OpenAI Node client's tool-calling flow) against a tessera server.
#   openai_tools.sh TESSERA_BINARY SOURCE_DIR [NODE_MODULES_PARENT]
# The client package comes from NODE_MODULES_PARENT/node_modules/openai (.ci/run installs it with npm into
# the build directory); without node or the package the test skips (exit 77) and says why.
set -euo pipefail
bin="$1"; src="$2"; mods="${3:-$src/tests/node}"
command -v node >/dev/null || { echo "skip: node is not installed"; exit 77; }
[ -d "$mods/node_modules/openai" ] || {
  echo "skip: the openai npm package is not installed (npm install --prefix $mods openai@4)"; exit 77; }
work=$(mktemp -d)
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -rf "$work"' EXIT
model="$work/model"; mkdir "$model"
for f in config.json generation_config.json model.safetensors tokenizer.json; do
  ln -s "$src/models/tessera-tiny/$f" "$model/$f"
done
"${TESSERA_PYTHON:-/usr/bin/python3}" - "$src" "$model" <<'PY'
import json, sys
src, model = sys.argv[1], sys.argv[2]
tc = json.load(open(src + "/models/tessera-tiny/tokenizer_config.json"))
tc["chat_template"] = open(src + "/tests/data/chat_templates/Qwen-Qwen3-0.6B.jinja").read()
json.dump(tc, open(model + "/tokenizer_config.json", "w"))
PY
"$bin" serve -m "$model" --port 0 >"$work/log" 2>&1 &
pid=$!
for _ in $(seq 200); do grep -q '127.0.0.1:' "$work/log" && break; sleep 0.1; done
port=$(grep -o '127.0.0.1:[0-9]*' "$work/log" | head -1 | cut -d: -f2)
[ -n "$port" ] || { cat "$work/log"; echo "the server did not start"; exit 1; }
# node resolves "openai" from the script's folder up: the script runs beside $mods/node_modules
[ "$mods" -ef "$src/tests/node" ] || cp "$src/tests/node/openai_tools.mjs" "$mods/openai_tools.mjs"
node "$mods/openai_tools.mjs" "http://127.0.0.1:$port/v1"
