#!/usr/bin/env bash
# Installs what expanse builds and tests with, from Debian packages and PyPI only. Idempotent: does
# nothing when everything is already there.
set -euo pipefail
packages=(cmake ninja-build g++ ccache libtbb-dev libeigen3-dev doctest-dev python3 python3-pip)
missing=()
for p in "${packages[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "installing Debian packages: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if ! python3 -c "import numpy" >/dev/null 2>&1; then
  echo "installing numpy from PyPI"
  python3 -m pip install -q numpy 2>/dev/null || python3 -m pip install -q --break-system-packages numpy
fi
