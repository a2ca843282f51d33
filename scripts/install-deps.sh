#!/usr/bin/env bash
# Installs what expanse builds and tests with, from Debian packages and PyPI only. Idempotent: does
# nothing when everything is already there.
set -euo pipefail
packages=(cmake ninja-build g++ ccache libtbb-dev libeigen3-dev doctest-dev python3 python3-pip
          python3-dev python3-venv  # these two: the Python package (python_bindings/) builds against them
          libcli11-dev nlohmann-json3-dev  # the expanse command: options and help (CLI11), JSON output
          clang                     # libFuzzer and its sanitizer runtimes: the fuzz stage of scripts/test.sh
          hipcc libamdhip64-dev     # the HIP backend (built and its no-device path tested; no AMD GPU here)
          libtrilinos-kokkos-dev)   # the Kokkos backend (Kokkos 3.4.1 with its Serial space)
missing=()
for p in "${packages[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing Debian packages: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# clang's runtime libraries (libFuzzer, the sanitizers) come with clang on older releases; newer ones
# package them apart (libclang-rt-dev), as a recommendation of clang that installs without
# recommends leave out.
if [ ! -e "$(clang -print-file-name="libclang_rt.fuzzer-$(uname -m).a")" ]; then
  echo "installing Debian package: libclang-rt-dev (libFuzzer)"
  [ ${#missing[@]} -gt 0 ] || $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq libclang-rt-dev >/dev/null
fi
# From PyPI: numpy (tests, demo), and what the Python package builds and tests with (pip module name:
# import name), so that scripts/test.sh can build it without fetching anything.
for dep in numpy:numpy nanobind:nanobind scikit-build-core:scikit_build_core pytest:pytest; do
  if ! python3 -c "import ${dep#*:}" >/dev/null 2>&1; then
    echo "installing ${dep%%:*} from PyPI"
    python3 -m pip install -q "${dep%%:*}" 2>/dev/null || python3 -m pip install -q --break-system-packages "${dep%%:*}"
  fi
done
