#!/usr/bin/env sh
# The HIP backend as built: its module carries device code for each architecture asked for, and
# `expanse info` lists it, as available with its devices or as unavailable with "no HIP device"
# (every machine here has no AMD GPU: this path is what runs in CI). With a device it runs the whole
# case table against the reference. Usage: hip_module_test.sh EXPANSE_EXE MODULE ARCH...
exe=$1
module=$2
shift 2
for arch in "$@"; do
  if ! grep -a -q "amdgcn-amd-amdhsa--$arch" "$module"; then
    echo "FAIL: $module has no code object for $arch"
    exit 1
  fi
  echo "ok: $module has a code object for $arch"
done
line=$("$exe" info | grep "^  hip:")
case "$line" in
  *"hip: available"*)
    echo "$line"
    exec "$exe" check --full --backend hip ;;
  *"hip: not available: no HIP device"*)
    echo "ok: $line" ;;
  *)
    echo "FAIL: expanse info lists the hip backend as: '$line'"
    exit 1 ;;
esac
