#!/usr/bin/env bash
# One command on a new machine: install the dependencies, build, and show power attention running
# through the `expanse` command (a random problem computed by the reference backend, checked
# against an independent implementation, and timed).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh "$@"
exe=build/bin/expanse
echo; echo "== expanse info"; $exe info
demo=$(mktemp -d)
python3 - "$demo" <<'PY'
import sys, numpy as np
rng = np.random.default_rng(0)
b, t, h, d, e = 1, 512, 4, 32, 32
np.save(f"{sys.argv[1]}/q.npy", rng.standard_normal((b, t, h, d)).astype(np.float32))
np.save(f"{sys.argv[1]}/k.npy", rng.standard_normal((b, t, h, d)).astype(np.float32))
np.save(f"{sys.argv[1]}/v.npy", rng.standard_normal((b, t, h, e)).astype(np.float32))
np.save(f"{sys.argv[1]}/log_g.npy", -np.log1p(np.exp(-rng.standard_normal((b, t, h)))).astype(np.float32))
PY
echo; echo "== expanse run power_attention (b=1 t=512 h=4 d=e=32 p=2, gated, chunk 128)"
$exe run power_attention --inputs "$demo" --outputs "$demo/out" --p 2 --chunk 128 --final-state
echo; echo "== expanse check power_attention --backend reference"
$exe check power_attention --backend reference
echo; echo "== expanse bench power_attention --backend reference (P1 shape at t=2048)"
$exe bench power_attention --backend reference --t 2048 --dtype f32 --warmup 0 --reps 1
rm -rf "$demo"
echo; echo "built: build/lib/libexpanse.so, build/bin/expanse. Tests: scripts/test.sh"
