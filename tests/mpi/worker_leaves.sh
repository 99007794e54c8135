#!/usr/bin/env bash
# worker_leaves.sh MPIEXEC BINARY NP LOCAL_REPLICAS MODE...: runs
# tests/mpi/worker_leaves_test.cc once per MODE under mpirun -np NP, and passes
# if every worker that should report printed an OK line, none printed BAD,
# and the job ended within 20 s (no wait in MPI_Finalize).
set -u
mpiexec=$1 binary=$2 np=$3 local_replicas=$4
shift 4
failures=0
for mode in "$@"; do
  case $mode in
    second | replace | sequence | renew) expected=$np ;;  # the leaver reports too (or nobody leaves)
    *) expected=$((np - 1)) ;;
  esac
  start=$(date +%s%N)
  output=$(timeout 60 "$mpiexec" --allow-run-as-root --oversubscribe -np "$np" "$binary" "$mode" "$local_replicas" 2>&1)
  status=$?
  millis=$((($(date +%s%N) - start) / 1000000))
  ok=$(grep -c '^RESULT rank [0-9]*: OK' <<<"$output")
  bad=$(grep -c '^RESULT rank [0-9]*: BAD' <<<"$output")
  if [[ $status -eq 124 || $ok -ne $expected || $bad -ne 0 || $millis -gt 20000 ]]; then
    failures=$((failures + 1))
    echo "worker_leaves.sh: $mode (np $np x $local_replicas): $ok of $expected OK, $bad BAD, exit $status after $millis ms; output:"
    echo "$output"
  else
    grep '^RESULT' <<<"$output" | sed "s/^/$mode: /"
    echo "worker_leaves.sh: $mode (np $np x $local_replicas): $ok of $expected OK; the job ended after $millis ms"
  fi
done
if [[ $failures -ne 0 ]]; then
  echo "worker_leaves.sh: $failures of $# ways of leaving failed"
  exit 1
fi
echo "worker_leaves.sh: all $# ways of leaving passed"
