#!/usr/bin/env bash
# distribute-train --checkpoint-dir: a run killed with kill -9 at random
# moments and resumed ends with parameters bit-identical to a run that was
# never stopped (the same layout); a checkpoint restored under another
# layout holds bit-identical parameters; a resumed run must keep the
# settings that fix its data order and update rule.
#
#   resume_test.sh path/to/distribute-train [mpirun]
# With an mpirun, the runs are two workers (multi_worker, one replica each),
# and the kill -9 hits one worker.
set -u
bin=$1
mpirun=${2:-}
# shellcheck source=tests/train/common.sh
source "$(dirname "$0")/common.sh"

common=(--epochs 4 --steps-per-epoch 25 --global-batch 64 --checkpoint-every 6)

start=$(date +%s%N)
straight=$("${launch[@]}" "${common[@]}" --checkpoint-dir "$tmp/straight" 2>&1) || fail "the straight run: $straight"
run_ms=$((($(date +%s%N) - start) / 1000000))
want=$(digest "$straight")
[ -n "$want" ] || fail "no digest in: $straight"
echo "straight: $want"

# Killed at random moments (between 30% and 90% of a whole run's time, so
# mostly inside the training), then resumed to the end.
# Round 2 and the resumed run save in the background (--async-checkpoint):
# the same bits either way.
for round in 1 2 3; do
  async=()
  [ "$round" = 2 ] && async=(--async-checkpoint)
  "${launch[@]}" "${common[@]}" "${async[@]}" --checkpoint-dir "$tmp/killed" > "$tmp/log.$round" 2>&1 &
  pid=$!
  delay_ms=$((run_ms * (30 + RANDOM % 61) / 100))
  sleep "$((delay_ms / 1000)).$(printf '%03d' $((delay_ms % 1000)))"
  if [ -n "$mpirun" ]; then
    # One worker dies; the other notices and stops.
    victim=$(pgrep -f -- "^$bin --strategy multi_worker" | tail -1)
    [ -n "$victim" ] && kill -9 "$victim"
  else
    kill -9 "$pid" 2> /dev/null
  fi
  wait "$pid" 2> /dev/null
  echo "round $round: killed after ${delay_ms} ms"
done
resumed=$("${launch[@]}" "${common[@]}" --async-checkpoint --checkpoint-dir "$tmp/killed" 2>&1) ||
  fail "the resumed run: $resumed"
grep "restored" <<< "$resumed"
got=$(digest "$resumed")
echo "resumed: $got"
[ "$got" = "$want" ] || fail "the resumed run ends with $got, the straight run with $want"
grep -q "^test accuracy" <<< "$resumed" || fail "no accuracy: $resumed"

if [ -z "$mpirun" ]; then
  # Another layout restores the same bits (4 epochs done: nothing left to train).
  other=$("$bin" --strategy default "${common[@]}" --checkpoint-dir "$tmp/straight" 2>&1) || fail "default: $other"
  [ "$(digest "$other")" = "$want" ] || fail "under the default strategy: $(digest "$other"), saved $want"
  # ... and goes on training there.
  more=$("$bin" --strategy default --epochs 5 --steps-per-epoch 25 --global-batch 64 --checkpoint-dir "$tmp/straight" 2>&1)
  grep -q "^epoch 5/5" <<< "$more" || fail "no fifth epoch under the default strategy: $more"
  # The settings that fix the data order and the update rule must stay.
  out=$("$bin" --strategy default --epochs 5 --global-batch 64 --seed 2 --checkpoint-dir "$tmp/straight" 2>&1)
  [ $? = 1 ] && grep -q "was written with --seed 1 --global-batch 64 --optimizer adam" <<< "$out" ||
    fail "another --seed: $out"
  out=$("$bin" --checkpoint-every 5 2>&1)
  [ $? = 2 ] && grep -q "checkpoint-every needs --checkpoint-dir" <<< "$out" || fail "--checkpoint-every alone: $out"
  out=$("$bin" --async-checkpoint 2>&1)
  [ $? = 2 ] && grep -q "async-checkpoint needs --checkpoint-dir" <<< "$out" || fail "--async-checkpoint alone: $out"
fi
[ "$fails" = 0 ] && echo PASS
exit "$fails"
