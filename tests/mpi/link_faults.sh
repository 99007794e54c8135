#!/usr/bin/env bash
# link_faults.sh MPIEXEC BINARY CASES [FIRST_SEED]: runs CASES randomized
# link-closing faults (tests/mpi/link_faults_test.cc), one mpirun each, over
# 2 and 3 workers with 1 and 2 local replicas, and passes if every surviving
# worker of every case printed PASS.
set -u
mpiexec=$1 binary=$2 cases=$3 first=${4:-1}
failures=0
declare -A tried passed
for ((i = 0; i < cases; i++)); do
  seed=$((first + i))
  kind=$((seed % 4))  # as the test draws it: 0 throws, 1 returns early (2 local replicas), 2 is killed, 3 leaves
  # Every kind on 2 and 3 workers, with 1 and 2 local replicas, every 12
  # cases (an early return needs 2: another local replica left waiting).
  np=$((2 + (i / 4) % 2))
  local_replicas=$((1 + (i / 8) % 2))
  [[ $kind -eq 1 ]] && local_replicas=2
  survivors=$np       # (one that leaves reports too, before it goes)
  [[ $kind -eq 2 ]] && survivors=$((np - 1))
  output=$(timeout 120 "$mpiexec" --allow-run-as-root --oversubscribe --enable-recovery -np "$np" \
           "$binary" "$seed" "$local_replicas" 2>&1)
  pass=$(grep -c "^CASE $seed rank [0-9]*: PASS" <<<"$output")
  # The fault as the case reports it ("throws", "returns early", "is killed", "leaves").
  fault=$(grep -m1 -o "(worker [0-9]*) [a-z ]* at collective" <<<"$output" | sed -E 's/^\(worker [0-9]+\) //; s/ at collective$//')
  fault=${fault:-unknown}
  label="np $np x $local_replicas local, a replica that $fault"
  tried[$fault]=$(( ${tried[$fault]:-0} + 1 ))
  if [[ $pass -eq $survivors ]]; then
    passed[$fault]=$(( ${passed[$fault]:-0} + 1 ))
    grep "^CASE $seed rank" <<<"$output"
  else
    failures=$((failures + 1))
    echo "link_faults.sh: seed $seed ($label): $pass of $survivors survivors passed; output:"
    echo "$output"
  fi
done
for fault in "${!tried[@]}"; do
  echo "link_faults.sh: a replica that $fault: ${passed[$fault]:-0} of ${tried[$fault]} cases passed"
done
if [[ $failures -ne 0 ]]; then
  echo "link_faults.sh: $failures of $cases cases failed"
  exit 1
fi
echo "link_faults.sh: all $cases cases passed"
