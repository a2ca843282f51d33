#!/usr/bin/env sh
# `expanse check --full` on a GPU backend, or a visible skip (ctest exit code 77) on a machine
# without its device. Usage: gpu_check.sh EXPANSE_EXE BACKEND
exe=$1
backend=$2
if "$exe" info | grep -q "^  $backend: available"; then
  exec "$exe" check --full --backend "$backend"
fi
echo "skipped: no $backend device ($("$exe" info | grep "^  $backend:" | sed 's/^ *//'))"
exit 77
