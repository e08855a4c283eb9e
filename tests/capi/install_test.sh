#!/usr/bin/env bash
# Installs the build (cmake --install) into a temporary prefix, builds tests/capi/generate.c against the
# installed header and library twice (pkg-config, and find_package(tessera) in CMake), and checks that
# both generate the tokens `tessera generate --raw --json` generates with the same options; then that the
# library exports only the C API and carries its SONAME, and that the installed command finds its default
# model, web page and bash completion under the prefix.
# usage: install_test.sh BUILD_DIR SOURCE_DIR PYTHON
set -euo pipefail
build=$1 src=$2 py=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
lib=$(dirname "$(find "$work/prefix" -name 'libtessera.so' -print -quit)")
pc=$(dirname "$(find "$work/prefix" -name 'tessera.pc' -print -quit)")
test -f "$work/prefix/include/tessera/tessera.h"
version=$(PKG_CONFIG_PATH="$pc" pkg-config --modversion tessera)  # CMakeLists.txt's, as the header must say
grep -q "#define TESSERA_VERSION_STRING \"$version\"" "$work/prefix/include/tessera/tessera.h" ||
  { echo "the header's TESSERA_VERSION_STRING is not the project's version $version"; exit 1; }
# (read whole first: with pipefail, grep -q closing the pipe early could fail objdump with SIGPIPE)
headers=$(objdump -p "$lib/libtessera.so")
grep -q 'SONAME *libtessera.so.0$' <<<"$headers" || { echo "no SONAME libtessera.so.0"; echo "$headers" | head; exit 1; }
others=$(nm -D --defined-only "$lib/libtessera.so" | awk '{print $3}' | grep -v '^tessera_' | grep -v '^TESSERA_0$' || true)
[ -z "$others" ] || { echo "libtessera.so exports more than the C API:"; echo "$others" | head; exit 1; }

# The command with what it finds beside itself once installed: the default model (used from any
# directory), the web page's files and the bash completion.
test -x "$work/prefix/bin/tessera"
test -f "$work/prefix/share/tessera/models/tessera-tiny/config.json"
test -f "$work/prefix/share/tessera/web/index.html"
grep -q "complete -o default -F _tessera tessera" "$work/prefix/share/bash-completion/completions/tessera"
used=$(cd / && "$work/prefix/bin/tessera" generate -p hi -n 8 --json |
  "$py" -c 'import json,sys; print(json.loads(sys.stdin.readlines()[-1])["model"])')
[ "$used" = "$work/prefix/share/tessera/models/tessera-tiny" ] ||
  { echo "the installed tessera used $used, not the installed default model"; exit 1; }

# pkg-config
cc -std=c11 -Wall -Wextra -Werror "$src/tests/capi/generate.c" -o "$work/generate_pc" \
  $(PKG_CONFIG_PATH="$pc" pkg-config --cflags --libs tessera) -Wl,-rpath,"$lib"
# CMake package
cmake -S "$src/tests/capi" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_RPATH="$lib" >/dev/null
cmake --build "$work/consumer" >/dev/null

model="$src/models/tessera-tiny"
for prompt in "Once upon a time" "The little dog"; do
  want=$("$build/tessera" generate -m "$model" -p "$prompt" --raw --gen-length 32 --steps 16 --json \
    | "$py" -c 'import json,sys; print(" ".join(map(str, json.loads(sys.stdin.readlines()[-1])["tokens"])))')
  for exe in "$work/generate_pc" "$work/consumer/generate_cmake"; do
    out=$("$exe" "$model" "$prompt" 32 16)
    got=${out%%$'\n'*}  # the first line: the token ids
    if [ "$got" != "$want" ]; then
      echo "$exe \"$prompt\": $got"; echo "tessera generate:      $want"; exit 1
    fi
  done
  echo "\"$prompt\": the C program's tokens are tessera generate's ($want)"
done

# The README's C example, built and run as the README says (from the repository, where its model is).
"$py" - "$src/README.md" > "$work/hello.c" <<'PY'
import re, sys
m = re.search(r"<!-- readme-example: c -->\n```c\n(.*?)```", open(sys.argv[1]).read(), re.S)
sys.stdout.write(m.group(1))
PY
cc -std=c11 -Wall -Werror "$work/hello.c" $(PKG_CONFIG_PATH="$pc" pkg-config --cflags --libs tessera) \
  -Wl,-rpath,"$lib" -o "$work/hello"
text=$(cd "$src" && "$work/hello" 2>"$work/hello.err")
grep -q "step 16: " "$work/hello.err" || { echo "README example: no step events"; cat "$work/hello.err"; exit 1; }
[ -n "$(echo "$text" | tr -d '[:space:]')" ] || { echo "README example: no text"; exit 1; }
echo "README's C example ran:$text"
