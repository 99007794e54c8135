#!/usr/bin/env bash
# distribute-train --checkpoint-dir under a SIGTERM (a preemption): every
# worker finishes the same step, saves a checkpoint of it and exits with
# 42; resumed, the run ends with parameters bit-identical to a run that was
# never stopped.
#
#   preempt_test.sh path/to/distribute-train [mpirun]
# With an mpirun, the runs are two workers (multi_worker, one replica each)
# and the SIGTERM reaches one of them only.
set -u
bin=$1
mpirun=${2:-}
# shellcheck source=tests/train/common.sh
source "$(dirname "$0")/common.sh"

common=(--epochs 2 --steps-per-epoch 300 --global-batch 64 --checkpoint-every 50)
now_ms() { echo $(($(date +%s%N) / 1000000)); }
# Starts a run into $1 (log $1.log) and waits for its first checkpoint
# (step 50 of 600: the handler is in place by then); sets pid and since.
start_run() {
  "${launch[@]}" "${common[@]}" --checkpoint-dir "$1" > "$1.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 3000); do
    compgen -G "$1/ckpt-*" > /dev/null && break
    kill -0 "$pid" 2> /dev/null || break
    sleep 0.01
  done
  since=$(now_ms)
  compgen -G "$1/ckpt-*" > /dev/null
}

start_run "$tmp/straight" || fail "no checkpoint from the straight run"
wait "$pid" || fail "the straight run: $(cat "$tmp/straight.log")"
window_ms=$(($(now_ms) - since))
straight=$(cat "$tmp/straight.log")
want=$(digest "$straight")
[ -n "$want" ] || fail "no digest in: $straight"
echo "straight: $want (${window_ms} ms from its first checkpoint to its end)"

# The signal comes at a random moment of the first 30% of that window (the
# window also holds the evaluations and the end); a run that ended before
# it (a noisy machine) is tried again, sooner.
for attempt in 1 2 3; do
  rm -rf "$tmp/run" "$tmp/run.log"
  start_run "$tmp/run" || {
    fail "no checkpoint from the run to preempt: $(cat "$tmp/run.log")"
    break
  }
  delay_ms=$((window_ms * (RANDOM % 30) / 100 / attempt))
  sleep "$((delay_ms / 1000)).$(printf '%03d' $((delay_ms % 1000)))"
  if [ -n "$mpirun" ]; then
    victim=$(pgrep -f -- "^$bin .*--checkpoint-dir $tmp/run" | tail -1)
    [ -n "$victim" ] && kill -TERM "$victim"
  else
    kill -TERM "$pid"
  fi
  wait "$pid"
  code=$?
  log=$(cat "$tmp/run.log")
  echo "SIGTERM ${delay_ms} ms after the first checkpoint: exit status $code"
  [ "$code" = 0 ] && ! grep -q "stopped after step" <<< "$log" && [ "$attempt" -lt 3 ] && continue
  break
done
[ "$code" = 42 ] || fail "the preempted run exited with $code, not 42: $log"
# Every line printed names one step. (Under mpirun the worker that returns
# last may be ended by mpirun before it prints; the checkpoint both wrote
# together, restored below, holds the step.)
steps=$(grep -o 'every worker stopped after step [0-9]*' <<< "$log" | grep -o '[0-9]*$' | sort -u)
[ -n "$steps" ] && [ "$(wc -w <<< "$steps")" = 1 ] || fail "not one step: '$steps' in $log"
grep "stopped after step" <<< "$log"

resumed=$("${launch[@]}" "${common[@]}" --checkpoint-dir "$tmp/run" 2>&1) || fail "the resumed run: $resumed"
restored=$(grep -o 'steps into the next; [0-9]* steps in all' <<< "$resumed" | grep -o '[0-9]* steps in all')
echo "resumed from: $restored"
[ "$restored" = "$steps steps in all" ] || fail "resumed from '$restored', stopped after step $steps"
got=$(digest "$resumed")
echo "resumed: $got"
[ "$got" = "$want" ] || fail "the resumed run ends with $got, the straight run with $want"
[ "$fails" = 0 ] && echo PASS
exit "$fails"
