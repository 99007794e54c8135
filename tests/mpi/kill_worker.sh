#!/usr/bin/env bash
# kill_worker.sh MPIEXEC NP BINARY: runs the kill-a-worker test and passes if
# every one of the NP-1 survivors printed a SURVIVED line.
set -u
mpiexec=$1 np=$2 binary=$3
output=$("$mpiexec" --allow-run-as-root --oversubscribe --enable-recovery -np "$np" "$binary" 2>&1)
echo "$output"
survived=$(grep -c '^SURVIVED' <<<"$output")
if [[ $survived -ne $((np - 1)) ]]; then
  echo "kill_worker.sh: $survived of $((np - 1)) survivors ended with an error in time" >&2
  exit 1
fi
echo "kill_worker.sh: all $survived survivors ended with an error in time"
