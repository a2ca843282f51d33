#!/usr/bin/env sh
# `expanse check --full` on a GPU backend, then the inputs of tests/gpu_regressions.txt, or a visible
# skip (ctest exit code 77) on a machine without its device. Usage: gpu_check.sh EXPANSE_EXE BACKEND
exe=$1
backend=$2
if ! "$exe" info | grep -q "^  $backend: available"; then
  echo "skipped: no $backend device ($("$exe" info | grep "^  $backend:" | sed 's/^ *//'))"
  exit 77
fi
status=0
"$exe" check --full --backend "$backend" || status=1
grep -v '^#' "$(dirname "$0")/gpu_regressions.txt" | grep . | while read -r args; do
  # shellcheck disable=SC2086  # the line is an argument list
  "$exe" check $args --backend "$backend" || exit 1
done || status=1
exit $status
