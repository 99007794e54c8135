#!/usr/bin/env bash
# distribute-train's command line: bad input gives a clear message and a
# non-zero exit (2 for usage, 1 for data), never a crash; a short run on the
# real dataset ends with the test accuracy and writes its metrics and plot.
# usage: cli_test.sh path/to/distribute-train
set -u
bin=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0

expect() {  # expect CODE PATTERN ARGS...
  local code=$1 pattern=$2
  shift 2
  local out rc
  out=$("$bin" "$@" 2>&1)
  rc=$?
  if [ "$rc" -ne "$code" ] || ! grep -qE -- "$pattern" <<<"$out"; then
    echo "FAIL: distribute-train $* -> exit $rc (want $code), output:"
    echo "$out" | tail -5
    echo "  (wanted /$pattern/)"
    fails=$((fails + 1))
  else
    echo "ok: distribute-train $* -> exit $rc"
  fi
}

expect 2 "unknown flag: --bogus" --bogus 1
expect 2 "unknown flag or missing value: --epochs" --epochs
expect 2 "--epochs needs a whole number, got 'ten'" --epochs ten
expect 2 "--global-batch must be >= 1, got 0" --global-batch 0
expect 2 "--strategy must be default, one_device, mirrored or multi_worker" --strategy tpu
expect 2 "--strategy default has exactly one replica" --strategy default --replicas 2
expect 2 "--learning-rate needs a number > 0" --learning-rate -1
expect 1 "global batch of 1 rows is smaller than the 2 replicas in sync" --replicas 2 --global-batch 1
expect 1 "does not exist \(Debian's dataset-fashion-mnist package" --data "$tmp/nowhere"
printf 'not gzip, not idx' >"$tmp/train-images-idx3-ubyte"
expect 1 "is not a valid IDX file" --data "$tmp"
expect 0 "usage: distribute-train" --help

if [ -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  expect 0 "^test accuracy 0\.[0-9]{4}$" --epochs 2 --steps-per-epoch 30 --replicas 2 \
    --metrics "$tmp/m.json" --plot "$tmp/p.svg"
  grep -q '"test_accuracy"' "$tmp/m.json" || { echo "FAIL: no metrics JSON"; fails=$((fails + 1)); }
  grep -q '<svg' "$tmp/p.svg" || { echo "FAIL: no SVG plot"; fails=$((fails + 1)); }
else
  echo "FAIL: the Fashion-MNIST files are missing (scripts/setup.sh installs dataset-fashion-mnist)"
  fails=$((fails + 1))
fi
exit $((fails > 0))
