# Sourced by scripts/install.sh and scripts/test.sh: sets kokkos_args to the CMake arguments that turn
# the Kokkos backend on wherever a Kokkos is found (Kokkos_ROOT, or a distribution's, which
# scripts/install-deps.sh installs: Debian's libtrilinos-kokkos-dev), and kokkos_skip to why it is
# not built ("" when it is). EXPANSE_NO_KOKKOS=1 leaves it out.
kokkos_args=()
kokkos_skip=""
if [ -n "${EXPANSE_NO_KOKKOS:-}" ]; then
  kokkos_skip="EXPANSE_NO_KOKKOS is set"
elif [ -n "${Kokkos_ROOT:-}" ] || compgen -G "/usr/lib/*/cmake/Kokkos/KokkosConfig.cmake" >/dev/null ||
     compgen -G "/usr/lib/cmake/Kokkos/KokkosConfig.cmake" >/dev/null; then
  kokkos_args=(-DEXPANSE_ENABLE_KOKKOS=ON)
else
  kokkos_skip="no Kokkos found (set Kokkos_ROOT, or apt-get install libtrilinos-kokkos-dev)"
fi
