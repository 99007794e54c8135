#!/usr/bin/env bash
# distribute-ckpt on a checkpoint of examples/resumable_training: inspect
# lists every tensor and passes a sound checkpoint (exit 0), finds a flipped
# byte (exit 1, naming the tensor), and says there is no checkpoint where
# there is none (exit 2); list shows the kept ones.
#
#   ckpt_cli_test.sh EXAMPLE DISTRIBUTE_CKPT
set -euo pipefail
example=$1
tool=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$example" "$dir" 5 > /dev/null
out=$("$tool" inspect "$dir") || fail "inspect of a sound checkpoint exited $?"
grep -q "^checkpoint   $dir/ckpt-5$" <<< "$out" || fail "no prefix line: $out"
grep -q "^written by   MirroredStrategy, 1 worker x 2 replicas$" <<< "$out" || fail "no layout: $out"
grep -q "^model/w/.OPTIMIZER_SLOT/optimizer/m/.ATTRIBUTES/VARIABLE_VALUE  *float32  *\[\]  *4  0x" <<< "$out" ||
  fail "no slot row: $out"
grep -q "^10 tensors, 56 bytes$" <<< "$out" || fail "no total: $out"
grep -q "^verified" <<< "$out" || fail "not verified: $out"
out=$("$tool" inspect "$dir/ckpt-5" --tensor "optimizer/iter/.ATTRIBUTES/VARIABLE_VALUE")
grep -q "= 20$" <<< "$out" || fail "--tensor: $out"
out=$("$tool" list "$dir")
[ "$(wc -l <<< "$out")" = 3 ] || fail "list: $out"
grep -q "ckpt-5  save_counter 5  10 tensors  56 bytes  (latest)$" <<< "$out" || fail "list: $out"

# One byte of the data section changed: the CRC names the tensor.
shard=$(ls "$dir"/ckpt-5.data-*.safetensors)
size=$(stat -c %s "$shard")
printf '\x7f' | dd of="$shard" bs=1 seek=$((size - 3)) conv=notrunc status=none
set +e
out=$("$tool" inspect "$dir/ckpt-5")
rc=$?
set -e
[ "$rc" = 1 ] || fail "a corrupted checkpoint exited $rc: $out"
grep -q "^PROBLEM: .*are corrupted" <<< "$out" || fail "no problem named: $out"

set +e
out=$("$tool" inspect "$dir/ckpt-99" 2>&1)
rc=$?
set -e
[ "$rc" = 2 ] || fail "a missing checkpoint exited $rc"
grep -q "no checkpoint there" <<< "$out" || fail "missing: $out"
set +e
"$tool" frobnicate > /dev/null 2>&1
rc=$?
set -e
[ "$rc" = 2 ] || fail "a bad command exited $rc"
echo PASS
