#!/usr/bin/env bash
# Runs web_canvas.mjs: tessera serve's web page (apps/tessera/web) in headless Chromium, driven by
# puppeteer-core, against servers of the bundled model.
#   web_canvas.sh TESSERA_BINARY SOURCE_DIR NODE_MODULES_PARENT OUT_DIR
# puppeteer-core comes from NODE_MODULES_PARENT/node_modules (.ci/run installs it with npm into the build
# directory, without a browser); the browser is Debian's chromium ($CHROMIUM to use another). Without
# node, chromium or the package the test skips (exit 77) and says why. The screenshot taken mid-generation
# is left in OUT_DIR (web_canvas_mid.png).
set -euo pipefail
bin="$1"; src="$2"; mods="$3"; out="$4"
command -v node >/dev/null || { echo "skip: node is not installed"; exit 77; }
chromium="${CHROMIUM:-$(command -v chromium || true)}"
[ -n "$chromium" ] && [ -x "$chromium" ] || { echo "skip: no chromium to run (apt-get install chromium, or set CHROMIUM to one)"; exit 77; }
[ -d "$mods/node_modules/puppeteer-core" ] || {
  echo "skip: the puppeteer-core npm package is not installed" \
       "(PUPPETEER_SKIP_DOWNLOAD=1 npm install --prefix $mods puppeteer-core@24)"; exit 77; }
mkdir -p "$out"
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
# serve NAME ARGS...: a server of the bundled model on a free port; sets port_NAME.
serve() {
  local name="$1"; shift
  "$bin" serve -m "$src/models/tessera-tiny" --port 0 "$@" >"$work/$name.log" 2>&1 &
  pids+=($!)
  local port=""
  for _ in $(seq 200); do
    port=$(grep -o '127.0.0.1:[0-9]*' "$work/$name.log" | head -1 | cut -d: -f2 || true)
    [ -n "$port" ] && break
    sleep 0.1
  done
  [ -n "$port" ] || { cat "$work/$name.log"; echo "the server $name did not start"; exit 1; }
  printf -v "port_$name" '%s' "$port"
}
serve keyed --api-key sk-web-test
serve open
serve noweb --no-web
# node resolves "puppeteer-core" from the script's folder up: the script runs beside $mods/node_modules
cp "$src/tests/web/web_canvas.mjs" "$mods/web_canvas.mjs"
node "$mods/web_canvas.mjs" --chromium "$chromium" --out "$out" --key sk-web-test \
  --keyed "http://127.0.0.1:$port_keyed" --open "http://127.0.0.1:$port_open" \
  --noweb "http://127.0.0.1:$port_noweb"
