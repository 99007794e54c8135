#!/usr/bin/env bash
# examples/resumable_training stopped after 15 epochs and run again to 40
# ends bit for bit where one run of 40 ends; its checkpoint reads back with
# a reader written from the safetensors format alone (read_checkpoint.py).
# A SIGTERM ends it with status 42 through the preemption handler's default
# exit (std::exit), with a checkpoint of the step it came in.
#
#   resumable_training_test.sh EXAMPLE PYTHON3
set -euo pipefail
example=$1
python=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

"$example" "$dir/resumed" 15 > /dev/null
resumed=$("$example" "$dir/resumed" 40)
straight=$("$example" "$dir/straight" 40)
echo "$resumed"
echo "$straight"
grep -q "^restored $dir/resumed/ckpt-15 at epoch 15, step 60$" <<< "$resumed"
if [ "$(tail -1 <<< "$resumed" | cut -d';' -f1)" != "$(tail -1 <<< "$straight" | cut -d';' -f1)" ]; then
  echo "FAIL: the resumed run ends elsewhere than the straight one"
  exit 1
fi
"$python" "$(dirname "$0")/read_checkpoint.py" "$dir/straight" "$(tail -1 <<< "$straight")"

# Stopped by a SIGTERM at some moment after its first checkpoint (of an
# endless run: the signal cannot come after the end).
timeout 60 "$example" "$dir/preempted" 1000000000 > "$dir/preempted.log" 2>&1 &
pid=$!
for _ in $(seq 1 2000); do
  compgen -G "$dir/preempted/ckpt-*" > /dev/null && break
  sleep 0.01
done
sleep "0.0$((RANDOM % 10))"
kill -TERM "$pid"
set +e
wait "$pid"
code=$?
set -e
cat "$dir/preempted.log"
if [ "$code" != 42 ]; then
  echo "FAIL: the preempted run exited with $code, not 42"
  exit 1
fi
step=$(grep -o 'stopped after step [0-9]*' "$dir/preempted.log" | grep -o '[0-9]*$')
# Run again with no epoch left to train: the checkpoint holds that step.
again=$("$example" "$dir/preempted" 1)
echo "$again"
if ! grep -q "^restored .*, step $step$" <<< "$again" || ! grep -q "after $step steps;" <<< "$again"; then
  echo "FAIL: the preemption's checkpoint does not hold step $step"
  exit 1
fi
# Stopped within the 40 epochs of the straight run (160 steps; mostly in the
# middle of an epoch): going on to 40 ends where the straight run ends.
if [ "$step" -lt 160 ]; then
  finished=$("$example" "$dir/preempted" 40)
  if [ "$(tail -1 <<< "$finished" | cut -d';' -f1)" != "$(tail -1 <<< "$straight" | cut -d';' -f1)" ]; then
    echo "FAIL: resumed after the SIGTERM at step $step, the run ends elsewhere: $finished"
    exit 1
  fi
  echo "resumed from step $step to the end of epoch 40: as the straight run"
fi
echo "PASS"
