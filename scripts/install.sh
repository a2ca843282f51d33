#!/usr/bin/env bash
# One command on a new machine: install the dependencies, build into ./build, and show power attention
# running through the `expanse` command on one random problem: the values it computed, the reference
# checked against the independent naive f64 implementation on a problem of exactly that shape, and
# the time it takes; on the CUDA backend too when the machine has one, and on the Kokkos backend when a
# Kokkos is found (scripts/kokkos.sh).
#
# With nvcc and an NVIDIA GPU (one listed by `nvidia-smi -L`) the CUDA backend is built as well, for
# EXPANSE_CUDA_ARCH (default 90a, Hopper); EXPANSE_NO_CUDA=1 leaves it out. Extra arguments go to
# CMake's configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh

# Why the CUDA backend is not built here ("" when it is).
cuda_skip=""
if [ -n "${EXPANSE_NO_CUDA:-}" ]; then cuda_skip="EXPANSE_NO_CUDA is set"
elif ! command -v nvcc >/dev/null 2>&1; then cuda_skip="no CUDA compiler (nvcc) found"
elif ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then cuda_skip="nvidia-smi -L lists no NVIDIA GPU"
fi
cuda_args=()
if [ -z "$cuda_skip" ]; then
  cuda_args=(-DEXPANSE_ENABLE_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=${EXPANSE_CUDA_ARCH:-90a}")
  echo "building with the CUDA backend (sm_${EXPANSE_CUDA_ARCH:-90a}); this takes several minutes"
fi
source scripts/kokkos.sh  # the Kokkos backend too, wherever a Kokkos is found
scripts/build.sh "${cuda_args[@]}" "${kokkos_args[@]}" "$@"
exe=build/bin/expanse
info=$($exe info)
echo; echo "== expanse info"; echo "$info"

backends=(reference)
if [ -z "$cuda_skip" ]; then
  if grep -q '^  cuda: available' <<<"$info"; then backends+=(cuda)
  else cuda_skip="the CUDA backend was built but is not available (see 'expanse info' above)"; fi
fi
if [ -z "$kokkos_skip" ]; then
  if grep -q '^  kokkos: available' <<<"$info"; then backends+=(kokkos)
  else kokkos_skip="the Kokkos backend was built but is not available (see 'expanse info' above)"; fi
fi

# The demo problem: one sequence of 512 tokens, 4 heads of dimension 32, p = 2, gated, f32, computed
# by the chunked algorithm (chunks of 128) with the final state.
b=1 t=512 h=4 d=32 e=32 p=2 chunk=128
shape=(--b $b --t $t --hq $h --h $h --d $d --e $e --p $p --chunk $chunk --dtype f32 --gated 1 --final-state 1)
demo=$(mktemp -d)
trap 'rm -rf "$demo"' EXIT
python3 - "$demo" $b $t $h $d $e <<'PY'
import sys, numpy as np
out, (b, t, h, d, e) = sys.argv[1], map(int, sys.argv[2:])
rng = np.random.default_rng(0)
np.save(f"{out}/q.npy", rng.standard_normal((b, t, h, d)).astype(np.float32))
np.save(f"{out}/k.npy", rng.standard_normal((b, t, h, d)).astype(np.float32))
np.save(f"{out}/v.npy", rng.standard_normal((b, t, h, e)).astype(np.float32))
np.save(f"{out}/log_g.npy", -np.log1p(np.exp(-rng.standard_normal((b, t, h)))).astype(np.float32))  # log of decays in (0, 1)
PY

echo
echo "== the demo problem: b=$b t=$t h=hq=$h d=e=$d p=$p, gated, f32, chunks of $chunk"
echo "   inputs q, k, v, log_g: random normal (seed 0), in $demo"
for backend in "${backends[@]}"; do
  echo; echo "== expanse run power_attention on $backend"
  $exe run power_attention --backend "$backend" --inputs "$demo" --outputs "$demo/$backend" --p $p --chunk $chunk --final-state
  python3 - "$demo" "$backend" <<'PY'
import sys, numpy as np
demo, backend = sys.argv[1:]
o, S = np.load(f"{demo}/{backend}/o.npy"), np.load(f"{demo}/{backend}/final_S.npy")
print(f"o[0, :3, 0, :4] (first 3 tokens, head 0, first 4 values) on {backend}:")
print(np.array2string(o[0, :3, 0, :4], precision=4, suppress_small=True))
print("final state S[0, 0, :2, :4] (head 0, first 2 of D = 528 rows):")
print(np.array2string(S[0, 0, :2, :4], precision=4))
if backend != "reference":
    ref = np.load(f"{demo}/reference/o.npy")
    print(f"o vs the reference's o: relative error {np.linalg.norm(o - ref) / np.linalg.norm(ref):.2e}")
PY
done

echo
echo "== expanse check power_attention ${shape[*]} --backend reference"
echo "   a fresh random problem of exactly this shape, the reference against the independent token-by-token"
echo "   naive f64 implementation (tolerance 1e-12):"
$exe check power_attention "${shape[@]}" --backend reference
for backend in "${backends[@]:1}"; do
  echo; echo "== expanse check power_attention ${shape[*]} --backend $backend   ($backend against the reference)"
  $exe check power_attention "${shape[@]}" --backend "$backend"
done

for backend in "${backends[@]}"; do
  echo; echo "== expanse bench power_attention on $backend, the demo problem (3 timed runs after 1 warm-up)"
  timing=$($exe bench power_attention "${shape[@]}" --backend "$backend" --warmup 1 --reps 3)
  python3 - "$timing" <<'PY'
import json, sys
r = json.loads(sys.argv[1])
print(f"{r['backend']} ({r['device']}): median {r['median_ms']:.3f} ms, min {r['min_ms']:.3f} ms, "
      f"{r['tflops'] * 1e3:.2f} GFLOP/s by the FLOP count of docs/performance.md ({r['timer']})")
PY
done
if [ -n "$cuda_skip" ]; then echo; echo "== cuda: skipped: $cuda_skip"; fi
if [ -n "$kokkos_skip" ]; then echo; echo "== kokkos: skipped: $kokkos_skip"; fi

echo; echo "built: build/lib/libexpanse.so, build/bin/expanse. Tests: scripts/test.sh"
