#!/usr/bin/env bash
# Runs the whole test suite, as CI does (.ci/run): installs missing dependencies, then five stages,
# each in its own build folder and timed:
#   release  build/: Release (with the CUDA plugin when nvcc is there, the HIP one when hipcc is, the
#            Kokkos one when a Kokkos is found), ctest
#   python   build-python/: the Python package through pip, then its pytest suite
#   asan     build-asan/: AddressSanitizer + UndefinedBehaviorSanitizer (CUDA and Python off, Kokkos
#            as in release), ctest
#            (every test, the fuzz corpora replayed and the threads test included)
#   fuzz     build-fuzz/: clang with libFuzzer (and ASan + UBSan): fuzz_abi and fuzz_npy, each for
#            EXPANSE_FUZZ_SECONDS (60) from its corpus in tests/fuzz/corpus/
#   tsan     build-tsan/: ThreadSanitizer, tests/test_threads.cpp (library and test only)
# EXPANSE_TEST_STAGES (comma-separated, default all five) runs some of them, e.g.
# EXPANSE_TEST_STAGES=asan,tsan scripts/test.sh. Extra arguments go to cmake's configure step of the
# release and python stages.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh

stages=",${EXPANSE_TEST_STAGES:-release,python,asan,fuzz,tsan},"
want() { [[ "$stages" == *",$1,"* ]]; }
timings=()
stage_start=0
begin() { echo; echo "=== stage $1"; stage_start=$SECONDS; }
end() {
  timings+=("$(printf '%-8s %3dm%02ds' "$1" $(((SECONDS - stage_start) / 60)) $(((SECONDS - stage_start) % 60)))")
  echo "=== stage $1 passed in ${timings[-1]##* }"
}
jobs=$(nproc)
launcher=()
command -v ccache >/dev/null 2>&1 && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)

# The Kokkos backend wherever a Kokkos is found (scripts/kokkos.sh), in the release and sanitizer
# stages.
source scripts/kokkos.sh

if want release; then
  begin release
  # With a CUDA compiler on the machine the CUDA backend is built too (one architecture, sm_90a by
  # default: EXPANSE_CUDA_ARCH), so that a build break shows without a GPU; its GPU tests then report
  # "skipped: no CUDA device". EXPANSE_NO_CUDA=1 leaves it out.
  cuda_args=()
  if [ -z "${EXPANSE_NO_CUDA:-}" ] && command -v nvcc >/dev/null 2>&1; then
    cuda_args=(-DEXPANSE_ENABLE_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=${EXPANSE_CUDA_ARCH:-90a}")
  fi
  # Likewise the HIP backend with hipcc (scripts/install-deps.sh installs it): its device code is
  # built for gfx90a and gfx940, and its test checks the code objects and the "no HIP device" path.
  # EXPANSE_NO_HIP=1 leaves it out.
  if [ -z "${EXPANSE_NO_HIP:-}" ] && command -v hipcc >/dev/null 2>&1; then
    cuda_args+=(-DEXPANSE_ENABLE_HIP=ON)
  fi
  cuda_args+=("${kokkos_args[@]}")
  scripts/build.sh "${cuda_args[@]}" "$@"
  ctest --test-dir build --output-on-failure -j "$jobs"
  end release
fi

if want python; then
  begin python
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
  (
    command -v ccache >/dev/null 2>&1 && export CMAKE_CXX_COMPILER_LAUNCHER=ccache CMAKE_C_COMPILER_LAUNCHER=ccache
    CMAKE_ARGS="$*" python3 -m pip install -q "${pip_flags[@]}" ./python_bindings -C build-dir="$PWD/build-python"
  )
  python3 -m pytest -q -rs python_bindings/tests
  end python
fi

# The sanitizer builds: -O1 with line tables (useful stacks, quick to build and run), only the C and
# C++ targets each stage needs. Reports fail at once: -fno-sanitize-recover=all (cmake/sanitize.cmake)
# and halt_on_error for TSan.
san_args=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1"
          "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1" -DEXPANSE_ENABLE_CUDA=OFF -DEXPANSE_ENABLE_PYTHON=OFF
          "${launcher[@]}")
export UBSAN_OPTIONS=print_stacktrace=1

if want asan; then
  begin asan
  cmake -S . -B build-asan "${san_args[@]}" "${kokkos_args[@]}" -DEXPANSE_SANITIZE=address,undefined >/dev/null
  cmake --build build-asan -j "$jobs"
  ctest --test-dir build-asan --output-on-failure -j "$jobs"
  end asan
fi

if want fuzz; then
  begin fuzz
  # libFuzzer comes with clang. The library is instrumented for coverage (EXPANSE_ENABLE_FUZZ) and
  # built with ASan + UBSan; only the harnesses and what they link are built. ctest runs each
  # corpus once (<name>_corpus), then each fuzzer for EXPANSE_FUZZ_SECONDS; a crash fails the test,
  # its input is printed in base64 and kept in build-fuzz/tests/fuzz/artifacts/ (tests/fuzz/README.md).
  cmake -S . -B build-fuzz "${san_args[@]}" -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
        -DEXPANSE_SANITIZE=address,undefined -DEXPANSE_ENABLE_FUZZ=ON \
        "-DEXPANSE_FUZZ_SECONDS=${EXPANSE_FUZZ_SECONDS:-60}" >/dev/null
  cmake --build build-fuzz -j "$jobs" --target fuzz_abi fuzz_npy
  ctest --test-dir build-fuzz --output-on-failure -j "$jobs" -R '^fuzz_'
  end fuzz
fi

if want tsan; then
  begin tsan
  cmake -S . -B build-tsan "${san_args[@]}" -DEXPANSE_SANITIZE=thread >/dev/null
  cmake --build build-tsan -j "$jobs" --target expanse_test_threads
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 ${TSAN_OPTIONS:-}" build-tsan/bin/expanse_test_threads
  end tsan
fi

echo; echo "=== all stages passed:"
printf '  %s\n' "${timings[@]}"
