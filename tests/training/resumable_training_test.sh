#!/usr/bin/env bash
# examples/resumable_training stopped after 15 epochs and run again to 40
# ends bit for bit where one run of 40 ends; its checkpoint reads back with
# a reader written from the safetensors format alone (read_checkpoint.py).
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
grep -q "^restored $dir/resumed/ckpt-15 at epoch 15$" <<< "$resumed"
if [ "$(tail -1 <<< "$resumed" | cut -d';' -f1)" != "$(tail -1 <<< "$straight" | cut -d';' -f1)" ]; then
  echo "FAIL: the resumed run ends elsewhere than the straight one"
  exit 1
fi
"$python" "$(dirname "$0")/read_checkpoint.py" "$dir/straight" "$(tail -1 <<< "$straight")"
echo "PASS"
