#!/usr/bin/env bash
# The many-core measurement of issue #36, in two steps (docs/benchmarks.md,
# "Many cores"):
#
#   bash scripts/many_cores_check.sh prepare   # here: build, then fill devbundle/
#                                              # (binaries, OpenMPI, OpenBLAS, data)
#   bash scripts/many_cores_check.sh run       # on the 16-core device machine, in
#                                              # one call: carry ["devbundle"]
#
# `run` writes every table to stdout and to $OUT/many_cores/ when OUT is set:
#   1. the machine: cores, NUMA nodes, the CPU's vector level, OpenBLAS's pick;
#   2. all_reduce in one process with 2, 4, 8 and 16 replicas, and 8 and 16
#      beside as many OpenMPI processes (bench/compare_mpi.sh); 16 through
#      the API beside the engine;
#   3. the small all_reduce of 8 and 16 replicas with one round, two rounds
#      and the default rule (DISTRIBUTE_ONE_ROUND_READ_BYTES);
#   4. MultiWorkerMirroredStrategy beside MPI_Allreduce, 16 x 1 and 4 x 4;
#   5. distribute-train with 1, 2, 4, 8 and 16 replicas at global batch 128
#      and 1024, and PyTorch (bench/pytorch_mlp.py) with 1 and 16 threads and
#      DDP over 4 and 16 processes, where python3 has torch.
# A step that fails is reported and the others go on; `run` exits non-zero
# if any failed. Every step has a time limit, and the whole run a budget
# (BUDGET_S, default 540 s, within the device tool's 600 s per call): a step
# that would start with less than 5 s left is skipped and counted as failed,
# so what ran is always written out.
set -uo pipefail
cd "$(dirname "$0")/.."

BUILD=${BUILD:-build/release}
BUNDLE=${BUNDLE:-devbundle}
BINS="tools/distribute-bench tools/distribute-train bench/distribute-mpi-bench"

# shellcheck source=scripts/bundle_prepare.sh
. scripts/bundle_prepare.sh

prepare() {
  set -e
  bundle_prepare many_cores_check || { echo "many_cores_check: is OpenMPI installed?" >&2; exit 1; }
  du -sh "$BUNDLE"
  echo "many_cores_check: ready; on the device machine: bash scripts/many_cores_check.sh run (carry [\"$BUNDLE\"])"
}

run() {
  [ -f "$BUNDLE/env.sh" ] || { echo "many_cores_check: no $BUNDLE/ here: run 'prepare' and carry it" >&2; exit 1; }
  # shellcheck disable=SC1090,SC1091
  . "$BUNDLE/env.sh"
  local logs=${OUT:-/tmp}/many_cores
  mkdir -p "$logs"
  local failed=()
  local deadline=$((SECONDS + ${BUDGET_S:-540}))
  step() {  # step NAME LIMIT COMMAND...: runs it within LIMIT s and the budget, shows and keeps its output
    local name=$1 limit=$2
    shift 2
    local left=$((deadline - SECONDS))
    if [ "$left" -le 5 ]; then
      echo "== $name: skipped, the run's budget is spent"
      failed+=("$name")
      return
    fi
    [ "$limit" -le "$left" ] || limit=$left
    echo "== $name"
    local start=$SECONDS
    if timeout "$limit" "$@" 2>&1 | tee "$logs/$name.log"; then
      echo "   ($name: $((SECONDS - start)) s)"
    else
      echo "   FAILED ($name, $((SECONDS - start)) s)"
      failed+=("$name")
    fi
  }
  local data=$BUNDLE/data
  step machine 30 sh -c "nproc; lscpu | grep -E 'Model name|Socket|NUMA|Flags' | cut -c1-200;
    ls -d /sys/devices/system/node/node* 2>/dev/null | wc -l | sed 's/^/NUMA nodes (sysfs): /';
    \"$X\" distribute-train --data $data --replicas 1 --epochs 1 --steps-per-epoch 1 --blas-core auto | head -1"
  for r in 2 4; do
    step "bench_${r}" 40 "$X" distribute-bench --op all_reduce --replicas "$r" -b 8 -e 256M -f 4 --iters 20
  done
  for r in 8 16; do
    step "vs_mpi_${r}" 90 bash bench/compare_mpi.sh --bundle "$BUNDLE" --replicas "$r" -b 8 -e 256M -f 4 --iters 20
  done
  # Through the API beside the engine, alternating (the shared outputs'
  # thresholds were measured with 2 and 4 replicas only).
  step api_16 40 "$X" distribute-bench --op all_reduce --replicas 16 --api both -b 8 -e 16M -f 4 --iters 20
  for r in 8 16; do
    for budget in 1048576 0 default; do
      local env_set=()
      [ "$budget" = default ] || env_set=(env DISTRIBUTE_ONE_ROUND_READ_BYTES="$budget")
      step "small_${r}_budget_${budget}" 30 ${env_set[@]+"${env_set[@]}"} "$X" distribute-bench --op all_reduce \
        --replicas "$r" -b 64 -e 4K -f 2 --iters 2000
    done
  done
  step workers_16x1 90 "${MPIRUN[@]}" -np 16 "$X" distribute-bench --op all_reduce --replicas 1 -b 8 -e 256M -f 4 \
    --iters 20
  step workers_4x4 90 "${MPIRUN[@]}" -np 4 "$X" distribute-bench --op all_reduce --replicas 4 -b 8 -e 256M -f 4 \
    --iters 20
  for batch in 128 1024; do
    for r in 1 2 4 8 16; do
      step "train_b${batch}_r${r}" 30 "$X" distribute-train --data "$data" --replicas "$r" --global-batch "$batch" \
        --epochs 1 --steps-per-epoch $((51200 / batch))
    done
  done
  if python3 -c 'import torch' 2>/dev/null; then
    for batch in 128 1024; do
      for cfg in "--threads 1" "--threads 16" "--ddp 4" "--ddp 16"; do
        # shellcheck disable=SC2086
        step "pytorch_b${batch}_${cfg// /}" 45 python3 bench/pytorch_mlp.py --data "$data" --global-batch "$batch" $cfg
      done
    done
  else
    echo "== pytorch: python3 has no torch here; skipped"
  fi
  echo "== summary (samples/s)"
  grep -H "samples/s" "$logs"/train_*.log "$logs"/pytorch_*.log 2>/dev/null | sed 's|.*/||' | cut -c1-160
  if [ ${#failed[@]} -gt 0 ]; then
    echo "many_cores_check: FAILED: ${failed[*]} (logs in $logs)"
    exit 1
  fi
  echo "many_cores_check: every step ran (logs in $logs)"
}

case "${1:-}" in
  prepare) prepare ;;
  run) run ;;
  *)
    echo "usage: bash scripts/many_cores_check.sh prepare|run" >&2
    exit 2
    ;;
esac
