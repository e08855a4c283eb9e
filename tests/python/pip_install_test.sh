#!/usr/bin/env bash
# `pip install ./python` offline into a fresh virtual environment (no index: the build backend needs
# nothing from one), reusing an existing build directory of the project, then the installed package
# generates what the module of the build tree generates.
# usage: pip_install_test.sh PYTHON SOURCE_DIR BUILD_DIR
set -euo pipefail
py=$1 src=$2 build=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$py" -m venv "$work/venv"
# With build-dir the backend writes nothing into the checkout (the module is built in that directory).
PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 "$work/venv/bin/pip" install -q "$src/python" \
  --config-settings "build-dir=$build"
cd "$work"  # not the source tree: the installed package is the one imported
"$work/venv/bin/python" - "$src/models/tessera-tiny" <<'PY'
import sys, tessera
assert tessera.__file__.startswith(sys.prefix), tessera.__file__
llm = tessera.LLM(sys.argv[1])
out = llm.generate("Once upon a time", tessera.SamplingParams(gen_length=32, steps=16))[0]
assert out.token_ids and out.steps == 16, out
print(f"installed tessera {tessera.__version__} from {tessera.__file__}: {out.text!r}")
PY
