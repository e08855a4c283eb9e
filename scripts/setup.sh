#!/usr/bin/env bash
# Sets tessera up on a fresh Debian 12 machine: dependencies and a Release build in build/. The
# default model, models/tessera-tiny, is part of the repository.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
