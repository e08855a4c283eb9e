#!/usr/bin/env bash
# Sets tessera up on a fresh Debian 12 machine: dependencies, a Release build in build/, and the
# default model in models/_setup/default (see README: "The default model").
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
bash scripts/make_default_model.sh
