#!/usr/bin/env bash
# Runs the whole test suite: installs missing dependencies, builds, then ctest. Extra arguments go to
# cmake's configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
# With a CUDA compiler on the machine the CUDA backend is built too (one architecture, sm_90a by
# default: EXPANSE_CUDA_ARCH), so that a build break shows without a GPU; its GPU tests then report
# "skipped: no CUDA device". EXPANSE_NO_CUDA=1 leaves it out.
cuda_args=()
if [ -z "${EXPANSE_NO_CUDA:-}" ] && command -v nvcc >/dev/null 2>&1; then
  cuda_args=(-DEXPANSE_ENABLE_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=${EXPANSE_CUDA_ARCH:-90a}")
fi
scripts/build.sh "${cuda_args[@]}" "$@"
ctest --test-dir build --output-on-failure -j "$(nproc)"

# The Python package (python_bindings/): built and installed by pip as the README shows (its own
# build of the core in build-python/, through ccache when available; the same extra CMake
# arguments), then its CPU tests. The build dependencies come from scripts/install-deps.sh.
pip_flags=(--no-build-isolation)
if python3 - <<'PY'
import os, sys, sysconfig  # Debian's own Python refuses pip installs outside a virtual environment
managed = os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"))
sys.exit(0 if managed and sys.prefix == sys.base_prefix else 1)
PY
then pip_flags+=(--break-system-packages); fi
command -v ccache >/dev/null 2>&1 && export CMAKE_CXX_COMPILER_LAUNCHER=ccache CMAKE_C_COMPILER_LAUNCHER=ccache
CMAKE_ARGS="$*" python3 -m pip install -q "${pip_flags[@]}" ./python_bindings -C build-dir="$PWD/build-python"
python3 -m pytest -q -rs python_bindings/tests
