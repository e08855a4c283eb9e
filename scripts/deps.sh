#!/usr/bin/env bash
# Installs tessera's Debian 12 build and test dependencies (needs root or sudo).
set -euo pipefail
PKGS="python3-jinja2 python3-jsonschema build-essential ccache cmake ninja-build pkg-config libdnnl-dev libpcre2-dev libutf8proc-dev
      nlohmann-json3-dev libcli11-dev libcpp-httplib-dev libboost-dev libssl-dev openssl curl libgtest-dev libgmock-dev libbenchmark-dev python3-numpy
      python3-dev python3-venv python3-pytest pybind11-dev libedit-dev tmux librsvg2-bin chromium libopenmpi-dev openmpi-bin"
missing=""
for p in $PKGS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing
fi
