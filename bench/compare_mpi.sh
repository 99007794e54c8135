#!/usr/bin/env bash
# Runs distribute-bench (threads in one process) and distribute-mpi-bench
# (OpenMPI processes on this host) over the same sizes, in one run, and prints
# the ratio of our bus bandwidth (and latency) to OpenMPI's per size.
#
#   bench/compare_mpi.sh [--op all_reduce|all_gather|broadcast|reduce_scatter] [--replicas N] [-b MIN] [-e MAX] [-f F] [--iters N]
#                        [--bundle DIR]
# Needs a release build (make build) with OpenMPI found at configure time, or,
# with --bundle, a device bundle (scripts/many_cores_check.sh) whose binaries
# and relocated OpenMPI run on a machine without Debian's packages.
set -euo pipefail
cd "$(dirname "$0")/.."
op=all_reduce replicas=2 min=8 max=256M factor=4 iters=20 api=raw build=build/release bundle=
while [ $# -gt 0 ]; do
  case "$1" in
    --op) op=$2; shift 2 ;;
    --replicas) replicas=$2; shift 2 ;;
    -b) min=$2; shift 2 ;;
    -e) max=$2; shift 2 ;;
    -f) factor=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --api) api=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --bundle) bundle=$2; shift 2 ;;
    *) echo "compare_mpi.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ -n "$bundle" ]; then
  # (env.sh probes a program that exits non-zero: not under set -e)
  set +e
  # shellcheck disable=SC1091
  . "$bundle/env.sh"
  set -e
  ours=("$X" distribute-bench) theirs=("$X" distribute-mpi-bench) launch=("${MPIRUN[@]}")
else
  ours=("$build/tools/distribute-bench") theirs=("$build/bench/distribute-mpi-bench") launch=(mpirun --oversubscribe)
  for b in "${ours[0]}" "${theirs[0]}"; do
    [ -x "$b" ] || { echo "compare_mpi.sh: $b not built (run make build; OpenMPI must be installed)" >&2; exit 1; }
  done
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# MPI_Bcast is in place: so is the engine's broadcast here (the API's is out
# of place, as its results are: --api tensor measures that).
form=()
[ "$op" = broadcast ] && [ "$api" = raw ] && form=(--in-place)
"${ours[@]}" --op "$op" --replicas "$replicas" --api "$api" -b "$min" -e "$max" -f "$factor" --iters "$iters" --check \
  ${form[@]+"${form[@]}"} --csv "$tmp/ours.csv" > "$tmp/ours.txt"
"${launch[@]}" -np "$replicas" "${theirs[@]}" --op "$op" -b "$min" -e "$max" -f "$factor" --iters "$iters" \
  --csv "$tmp/mpi.csv" > "$tmp/mpi.txt"
echo "# $op float32, $replicas replicas (distribute: threads, api=$api) vs $replicas OpenMPI processes, $(nproc) cores"
printf "# %12s %12s %12s %12s %12s %10s %10s %8s\n" "size(B)" "ours(us)" "mpi(us)" "ours(GB/s)" "mpi(GB/s)" \
  "bw ratio" "lat ratio" "#wrong"
join -t, -1 1 -2 1 \
  <(tail -n +2 "$tmp/ours.csv" | awk -F, '{print $6","$8","$11","$12}' | sort -t, -k1,1) \
  <(tail -n +2 "$tmp/mpi.csv" | awk -F, '{print $3","$5","$8}' | sort -t, -k1,1) |
  sort -t, -k1,1n |
  awk -F, '{printf "  %12d %12.2f %12.2f %12.3f %12.3f %10.2f %10.2f %8d\n", $1, $2, $5, $3, $6, ($6 > 0 ? $3 / $6 : 0), ($2 > 0 ? $5 / $2 : 0), $4}'
echo "# bw ratio = our busbw / OpenMPI's; lat ratio = OpenMPI's time / ours (above 1: we are faster)"
