#!/usr/bin/env bash
# The GPU check, in two steps (docs/gpu.md):
#
#   bash scripts/device_check.sh prepare   # here: build, then fill devbundle/
#                                          # (binaries, libcudart, OpenMPI, ...)
#   bash scripts/device_check.sh run       # on the GPU machine, in one call:
#                                          # device tool, carry ["devbundle"]
#
# `run` prints each step's result and a summary, and copies the logs to $OUT
# when it is set (the device tool brings that folder back). It fails if any
# step fails, or if no GPU is visible there: a GPU check that skips its GPU
# tests has checked nothing.
set -uo pipefail
cd "$(dirname "$0")/.."

BUILD=${BUILD:-build/release}
BUNDLE=${BUNDLE:-devbundle}
BINS="tests/gpu_test tests/core_test tests/runtime_test tools/distribute-demo tools/distribute-bench"

# shellcheck source=scripts/bundle_prepare.sh
. scripts/bundle_prepare.sh

prepare() {
  set -e
  bundle_prepare device_check || { echo "device_check: is the CUDA toolkit installed?" >&2; exit 1; }
  # The CUDA runtime the binaries were linked with (the driver is the GPU
  # machine's own).
  cudart=$(ldd "$BUILD/tests/gpu_test" | awk '/libcudart/ {print $3}')
  [ -n "$cudart" ] || { echo "device_check: gpu_test does not link libcudart" >&2; exit 1; }
  cp -L "$cudart" "$BUNDLE/lib/"
  # Fashion-MNIST (30 MB) is for training, not this check: carry limits are 64 MiB.
  rm -rf "$BUNDLE/data"
  du -sh "$BUNDLE"
  echo "device_check: ready; on the GPU machine: bash scripts/device_check.sh run (carry [\"$BUNDLE\"])"
}

run() {
  [ -f "$BUNDLE/env.sh" ] || { echo "device_check: no $BUNDLE/ here: run 'prepare' and carry it" >&2; exit 1; }
  # shellcheck disable=SC1090,SC1091
  . "$BUNDLE/env.sh"
  local logs=${OUT:-/tmp}/device_check
  mkdir -p "$logs"
  local failed=()
  step() {  # step NAME COMMAND...: runs it, keeps its log, notes a failure
    local name=$1
    shift
    echo "== $name"
    local start=$SECONDS
    if "$@" > "$logs/$name.log" 2>&1; then
      echo "   ok ($((SECONDS - start)) s)"
    else
      echo "   FAILED ($((SECONDS - start)) s): last lines of $name.log:"
      tail -20 "$logs/$name.log" | sed 's/^/   | /'
      failed+=("$name")
    fi
  }
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$logs/gpus.txt"
  step list_devices "$X" distribute-demo --list-devices
  step list_logical_devices env DISTRIBUTE_LOGICAL_GPUS=2:4096 "$X" distribute-demo --list-devices
  # Every GPU test must run: a skip here means the GPU was not seen.
  step gpu_test sh -c "\"$X\" gpu_test > \"$logs/gpu_test.out\" 2>&1; rc=\$?; cat \"$logs/gpu_test.out\";
                       if grep -q SKIPPED \"$logs/gpu_test.out\"; then echo 'GPU tests skipped'; exit 1; fi; exit \$rc"
  step core_devices "$X" core_test --gtest_filter='*Device*'
  step runtime_devices "$X" runtime_test --gtest_filter='DeviceName*:MirroredStrategyTest.*:OneDevice*:ExtendedTest.*'
  cat "$logs/list_devices.log" "$logs/list_logical_devices.log"
  if [ ${#failed[@]} -gt 0 ]; then
    echo "device_check: FAILED: ${failed[*]} (logs in $logs)"
    exit 1
  fi
  echo "device_check: all steps passed (logs in $logs)"
}

case "${1:-}" in
  prepare) prepare ;;
  run) run ;;
  *)
    echo "usage: bash scripts/device_check.sh prepare|run" >&2
    exit 2
    ;;
esac
