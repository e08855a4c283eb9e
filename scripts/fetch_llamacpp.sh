#!/usr/bin/env bash
# Fetches the REAL llama.cpp (release v0.5.0, as shipped by the npm package node-llama-cpp 3.22.1) for
# checking tessera's GGUF support against it, and builds the oracle tools/llamacpp/oracle.cpp.
#
#   scripts/fetch_llamacpp.sh [DIR]        DIR defaults to <repo>/.llamacpp (git-ignored)
#
# Result:
#   DIR/lib/      libllama.v0.5.0.so, libggml.v0.5.0.so, libggml-base.so, libggml-cpu-<variant>.so (the CPU
#                 backend, dlopen'ed at run time: the variant that fits the CPU is chosen by ggml)
#                 from @node-llama-cpp/linux-x64@3.22.1 (prebuilt, CPU only)
#   DIR/include/  llama.h, llama-cpp.h and ggml/include/*.h of the exact source of those binaries (the git
#                 bundle llama/gitRelease.bundle inside node-llama-cpp@3.22.1)
#   DIR/gguf-py/  llama.cpp's official Python GGUF package (import with PYTHONPATH=DIR/gguf-py)
#   DIR/bin/llamacpp-oracle   built with g++ -std=c++17, rpath DIR/lib
#
# Needs npm (registry access), git, g++, tar. Idempotent: every step is skipped when its result exists
# (the oracle is rebuilt when oracle.cpp is newer than the binary). Linux x86-64 only (the prebuilt
# binaries of that npm package).
set -euo pipefail

NLC_VERSION=3.22.1
LLAMA_SO=libllama.v0.5.0.so
GGML_SO=libggml.v0.5.0.so

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${1:-$REPO/.llamacpp}"
mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"
ORACLE_SRC="$REPO/tools/llamacpp/oracle.cpp"

say() { echo "fetch_llamacpp: $*"; }
die() { echo "fetch_llamacpp: error: $*" >&2; exit 1; }

case "$(uname -s)-$(uname -m)" in
    Linux-x86_64) ;;
    *) die "only Linux x86-64 is supported (the prebuilt binaries of @node-llama-cpp/linux-x64); this is $(uname -s)-$(uname -m)" ;;
esac
for tool in git g++ tar; do
    command -v "$tool" >/dev/null 2>&1 || die "'$tool' is not installed"
done

TMP="$(mktemp -d)"
cleanup() { rm -rf "$TMP"; }
trap cleanup EXIT

# npm pack PACKAGE -> prints the path of the unpacked package directory
npm_unpack() {
    local spec="$1" sub="$2"
    command -v npm >/dev/null 2>&1 || die "npm is not installed (Debian: apt-get install npm)"
    mkdir -p "$TMP/$sub"
    say "npm pack $spec" >&2
    local tgz
    if ! tgz="$(cd "$TMP/$sub" && npm pack --loglevel=error "$spec" 2>"$TMP/$sub/npm.err" | tail -n 1)" || [ -z "$tgz" ] \
        || [ ! -f "$TMP/$sub/$tgz" ]; then
        cat "$TMP/$sub/npm.err" >&2 || true
        die "'npm pack $spec' failed (no registry access? check 'npm config get registry' and the network)"
    fi
    tar -xzf "$TMP/$sub/$tgz" -C "$TMP/$sub" || die "cannot unpack $tgz"
    [ -d "$TMP/$sub/package" ] || die "$tgz has no package/ directory"
    echo "$TMP/$sub/package"
}

# 1. shared libraries
if [ -f "$DIR/lib/$LLAMA_SO" ] && [ -f "$DIR/lib/$GGML_SO" ] && [ -f "$DIR/lib/libggml-base.so" ] \
    && ls "$DIR"/lib/libggml-cpu-*.so >/dev/null 2>&1; then
    say "libraries: present in $DIR/lib (skipped)"
else
    pkg="$(npm_unpack "@node-llama-cpp/linux-x64@$NLC_VERSION" bins)"
    bins="$pkg/bins/linux-x64"
    [ -f "$bins/$LLAMA_SO" ] || die "$LLAMA_SO not found in @node-llama-cpp/linux-x64@$NLC_VERSION"
    mkdir -p "$DIR/lib"
    cp -f "$bins"/*.so "$DIR/lib/"
    [ -f "$bins/_nlcBuildMetadata.json" ] && cp -f "$bins/_nlcBuildMetadata.json" "$DIR/lib/"
    say "libraries: copied $(ls "$bins"/*.so | wc -l) shared libraries to $DIR/lib"
fi

# 2. headers and gguf-py from the source bundle
if [ -f "$DIR/include/llama.h" ] && [ -f "$DIR/include/ggml.h" ] && [ -f "$DIR/gguf-py/gguf/__init__.py" ]; then
    say "headers + gguf-py: present in $DIR (skipped)"
else
    pkg="$(npm_unpack "node-llama-cpp@$NLC_VERSION" main)"
    bundle="$pkg/llama/gitRelease.bundle"
    [ -f "$bundle" ] || die "llama/gitRelease.bundle not found in node-llama-cpp@$NLC_VERSION"
    say "git clone $bundle"
    git -c advice.detachedHead=false clone --quiet "$bundle" "$TMP/llama.cpp" || die "cannot clone the llama.cpp git bundle"
    src="$TMP/llama.cpp"
    [ -f "$src/include/llama.h" ] || die "the bundle has no include/llama.h"
    mkdir -p "$DIR/include"
    cp -f "$src"/include/*.h "$DIR/include/"
    cp -f "$src"/ggml/include/*.h "$DIR/include/"
    rm -rf "$DIR/gguf-py"
    cp -r "$src/gguf-py" "$DIR/gguf-py"
    if [ -f "$pkg/llama/llama.cpp.info.json" ]; then cp -f "$pkg/llama/llama.cpp.info.json" "$DIR/"; fi
    git -C "$src" rev-parse HEAD > "$DIR/llama.cpp.commit"
    say "headers: copied $(ls "$DIR"/include/*.h | wc -l) headers to $DIR/include (llama.cpp commit $(cat "$DIR/llama.cpp.commit"))"
    say "gguf-py: copied to $DIR/gguf-py"
fi

# 3. the oracle
BIN="$DIR/bin/llamacpp-oracle"
[ -f "$ORACLE_SRC" ] || die "$ORACLE_SRC not found"
if [ -x "$BIN" ] && [ "$BIN" -nt "$ORACLE_SRC" ]; then
    say "oracle: $BIN is up to date (skipped)"
else
    mkdir -p "$DIR/bin"
    say "oracle: g++ -std=c++17 -O2 $ORACLE_SRC -> $BIN"
    g++ -std=c++17 -O2 -o "$BIN.tmp" "$ORACLE_SRC" -I"$DIR/include" -L"$DIR/lib" \
        -l:"$LLAMA_SO" -l:"$GGML_SO" -l:libggml-base.so -Wl,-rpath,"$DIR/lib" \
        || die "building the oracle failed"
    mv -f "$BIN.tmp" "$BIN"
fi

# smoke test: every shared library the oracle needs resolves
if ldd "$BIN" | grep -q "not found"; then
    ldd "$BIN" >&2
    die "$BIN has unresolved shared libraries"
fi
say "done: oracle $BIN, libraries $DIR/lib, headers $DIR/include, gguf-py $DIR/gguf-py"
