#!/usr/bin/env bash
# The GPU-host session: build with the CUDA backend (sm_90a), run the whole test suite, check every
# operation on the cuda backend, run compute-sanitizer on a subset, and time the P1 benchmarks.
# Usage: bench/scripts/h100_session.sh OUTDIR [stages...]; stages: build test check sanitize bench
# chunks (default: all but chunks). Logs and bench results land in OUTDIR. `chunks` times
# power_attention with the automatic chunk size against every explicit one, over several shapes.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:?usage: h100_session.sh OUTDIR [stages...]}; shift
stages=${*:-build test check sanitize bench}
mkdir -p "$out"
if [ -x .gpu-deps/unpack.sh ]; then eval "$(.gpu-deps/unpack.sh /tmp/expanse-deps)"; fi
has() { [[ " $stages " == *" $1 "* ]]; }
exe=build-gpu/bin/expanse
if has build; then
  nvidia-smi > "$out/nvidia-smi.txt" 2>&1
  { cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DEXPANSE_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a &&
    cmake --build build-gpu -j 16; } > "$out/build.log" 2>&1 || { tail -50 "$out/build.log"; exit 1; }
  $exe info > "$out/info.txt" 2>&1; cat "$out/info.txt"
fi
if has test; then
  ctest --test-dir build-gpu --output-on-failure -j 4 > "$out/ctest.log" 2>&1; echo "ctest rc=$?"; tail -5 "$out/ctest.log"
  build-gpu/bin/expanse_tests -tc="case table*" -s 2>&1 | grep -E "backend|FAIL|ERROR|rel. error|repro|error:" | head -60 > "$out/case_table_cuda.txt"
  cat "$out/case_table_cuda.txt" | head -40
fi
if has check; then
  $exe check --full --backend cuda > "$out/check_cuda.txt" 2>&1; echo "check rc=$?"; grep -E "FAIL|passed" "$out/check_cuda.txt" | head -40
fi
if has sanitize; then
  for tool in memcheck racecheck; do
    for op in update_state query_state chunk_attention power_attention power_attention_step discumsum sympow_expand; do
      compute-sanitizer --tool $tool --error-exitcode 9 $exe check $op --backend cuda > "$out/sanitize_${tool}_${op}.txt" 2>&1
      echo "$tool $op rc=$? $(grep -E 'ERROR SUMMARY' "$out/sanitize_${tool}_${op}.txt" | tail -1)"
    done
  done
fi
if has bench; then
  # Results as bench/results/*.jsonl lines, each with the device (in the line), commit and date.
  commit=${EXPANSE_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}  # the copy may lack .git
  stamp() { python3 -c 'import json,sys; [print(json.dumps({**json.loads(l), "commit": sys.argv[1], "date": sys.argv[2]})) for l in sys.stdin if l.startswith("{")]' "$commit" "$(date -u +%F)"; }
  # Both feature-map layouts: exact sympow (D = 2080) and tiled:8 (D = 2304, the tensor-core layout).
  for layout in sympow tiled:8; do
    for c in 512 1024; do
      $exe bench power_attention --backend cuda --ts 4096,16384,65536 --chunk $c --layout $layout --reps 30 | stamp |
        tee -a "$out/p1_power_attention.jsonl"
    done
    for op in update_state query_state chunk_attention; do
      $exe bench $op --backend cuda --ts 4096,16384,65536 --chunk 1024 --layout $layout --reps 30 | stamp |
        tee -a "$out/p1_core_ops.jsonl"
    done
    # discumsum at P1 sums the [D, e] chunk states: its feature dim is the expanded D.
    D=$([ $layout = sympow ] && echo 2080 || echo 2304)
    $exe bench discumsum --backend cuda --ts 4096,16384,65536 --chunk 1024 --d $D --reps 30 | stamp |
      tee -a "$out/p1_core_ops.jsonl"
  done
  $exe bench power_attention_step --backend cuda --reps 30 | stamp | tee "$out/p1_power_attention_step.jsonl"
  for c in 256 2048; do
    $exe bench power_attention --backend cuda --ts 4096,16384,65536 --chunk $c --reps 20 | stamp | tee -a "$out/p1_chunk_sweep.jsonl"
  done
  $exe bench power_attention --backend cuda --ts 1024,4096 --chunk 0 --reps 20 | stamp | tee -a "$out/p1_chunk_sweep.jsonl"
fi
if has chunks; then
  commit=${EXPANSE_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
  stamp() { python3 -c 'import json,sys; [print(json.dumps({**json.loads(l), "commit": sys.argv[1], "date": sys.argv[2]})) for l in sys.stdin if l.startswith("{")]' "$commit" "$(date -u +%F)"; }
  # shape name | case options | sequence lengths (the quadratic form only up to 16384)
  while IFS='|' read -r name opts ts; do
    for c in auto 0 256 512 1024 2048; do
      t_list=$ts
      [ "$c" = 0 ] && t_list=$(echo "$ts" | tr ',' '\n' | awk '$1 <= 16384' | paste -sd, -)
      [ -z "$t_list" ] && continue
      $exe bench power_attention --backend cuda --ts "$t_list" --chunk $c $opts --warmup 2 --reps 10 2>/dev/null |
        stamp | python3 -c 'import json,sys; [print(json.dumps({**json.loads(l), "shape": sys.argv[1]})) for l in sys.stdin]' "$name" |
        tee -a "$out/chunk_choice.jsonl" | python3 -c 'import json,sys; [print(sys.argv[1], j["t"], j.get("chunk"), j.get("chunk_auto", 0), round(j["median_ms"], 4)) for j in map(json.loads, sys.stdin)]' "$name"
    done
  done <<'SHAPES'
p1-sympow|--layout sympow|4096,8192,16384,65536
p1-tiled8|--layout tiled:8|4096,8192,16384,65536
d128|--d 128 --e 128|4096,8192,16384,65536
d32|--d 32 --e 32|4096,8192,16384,65536
p3|--p 3|4096,8192,16384
p4-d32|--p 4 --d 32 --e 32|4096,8192,16384
SHAPES
fi
