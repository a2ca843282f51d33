#!/usr/bin/env bash
# Runs the whole test suite: installs missing dependencies, builds, then ctest. Extra arguments go to
# cmake's configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh "$@"
ctest --test-dir build --output-on-failure -j "$(nproc)"
