#!/usr/bin/env bash
# distribute-train's command line: bad input gives a clear message and a
# non-zero exit (2 for usage, 1 for data), never a crash; a short run on the
# real dataset ends with the test accuracy and writes its metrics and plot.
# usage: cli_test.sh path/to/distribute-train
set -u
bin=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/../testing/expect_exit.sh"

expect 2 "unknown flag: --bogus" --bogus 1
expect 2 "unknown flag or missing value: --epochs" --epochs
expect 2 "--epochs needs a whole number from 1 to 2147483647, got 'ten'" --epochs ten
expect 2 "--global-batch must be >= 1, got 0" --global-batch 0
expect 2 "--strategy must be default, one_device, mirrored or multi_worker" --strategy tpu
expect 2 "--strategy default has exactly one replica" --strategy default --replicas 2
expect 2 "--learning-rate needs a finite number > 0" --learning-rate -1
# Numbers are range-checked before they are narrowed (4294967297 epochs ran one).
expect 2 "--epochs must be from 1 to 2147483647, got 4294967297" --epochs 4294967297
expect 2 "--epochs must be from 1 to 2147483647, got 2147483648" --epochs 2147483648
expect 2 "--replicas must be from 1 to 2147483647, got 4294967298" --replicas 4294967298
expect 2 "--global-batch must be >= 1, got 99999999999999999999" --global-batch 99999999999999999999
expect 2 "--epochs needs a whole number from 1 to 2147483647, got ' 3'" --epochs " 3"
expect 2 "--seed must be >= 0, got -1" --seed -1
expect 2 "--blas-threads must be from 1 to 1024, got 0" --blas-threads 0
expect 2 "--blas-core 'Pentium' is not an x86-64 OpenBLAS core known here \(Katmai, " --blas-core Pentium
# An output that cannot be written is found before the training.
expect 2 "--metrics $tmp/no/such/folder/m.json: cannot create it in $tmp/no/such/folder" \
  --metrics "$tmp/no/such/folder/m.json"
expect 2 "--plot $tmp/no/p.svg: cannot create it" --plot "$tmp/no/p.svg"
expect 2 "--metrics $tmp: is a folder, not a file" --metrics "$tmp"
# Too many replicas: what ran out (the threads' stacks, under this limit;
# a sanitizer's shadow memory cannot be mapped under it).
if ldd "$bin" | grep -q 'libasan\|libtsan'; then
  echo "ok (skipped under a sanitizer, which needs more address space than ulimit -v gives): --replicas 100000"
else
  ( ulimit -v 3000000 && expect 1 "could not start the threads of 100,000 replicas \(.*\): the system had no thread to give" \
    --replicas 100000 --epochs 1 ) || fails=$((fails + 1))
fi
expect 1 "global batch of 1 rows is smaller than the 2 replicas in sync" --replicas 2 --global-batch 1
expect 1 "does not exist \(Debian's dataset-fashion-mnist package" --data "$tmp/nowhere"
printf 'not gzip, not idx' >"$tmp/train-images-idx3-ubyte"
expect 1 "is not a valid IDX file" --data "$tmp"
expect 0 "usage: distribute-train" --help

# Data files checked whole: an IDX pair with no example, and gzip files cut
# before their trailer (CRC and length) or with a wrong CRC.
be32() { printf '\\x%02x\\x%02x\\x%02x\\x%02x' $(($1 >> 24 & 255)) $(($1 >> 16 & 255)) $(($1 >> 8 & 255)) $(($1 & 255)); }
idx_pair() {  # idx_pair DIR STEM N: N images of 28x28 and N labels, zeros, plain IDX
  { printf "$(be32 2051)$(be32 "$3")$(be32 28)$(be32 28)"; head -c $((784 * $3)) /dev/zero; } >"$1/$2-images-idx3-ubyte"
  { printf "$(be32 2049)$(be32 "$3")"; head -c "$3" /dev/zero; } >"$1/$2-labels-idx1-ubyte"
}
mkdir -p "$tmp/empty"
idx_pair "$tmp/empty" train 0
idx_pair "$tmp/empty" t10k 10
expect 1 "hold no example: there is nothing to train on" --data "$tmp/empty"
idx_pair "$tmp/empty" train 10
idx_pair "$tmp/empty" t10k 0
expect 1 "t10k-labels-idx1-ubyte hold no example" --data "$tmp/empty"
mkdir -p "$tmp/cut"
idx_pair "$tmp/cut" train 300
idx_pair "$tmp/cut" t10k 10
gzip -f "$tmp/cut/train-labels-idx1-ubyte"
size=$(stat -c %s "$tmp/cut/train-labels-idx1-ubyte.gz")
head -c $((size - 8)) "$tmp/cut/train-labels-idx1-ubyte.gz" >"$tmp/cut/cut.gz"
mv "$tmp/cut/cut.gz" "$tmp/cut/train-labels-idx1-ubyte.gz"
expect 1 "train-labels-idx1-ubyte.gz is corrupt: its gzip stream ends before its trailer" --data "$tmp/cut"
idx_pair "$tmp/cut" train 300
gzip -f "$tmp/cut/train-labels-idx1-ubyte"
# A wrong byte in the CRC (the trailer's first 4 bytes).
gz=$tmp/cut/train-labels-idx1-ubyte.gz
size=$(stat -c %s "$gz")
printf '\x5a' | dd of="$gz" bs=1 seek=$((size - 8)) conv=notrunc status=none
expect 1 "train-labels-idx1-ubyte.gz is corrupt: incorrect data check" --data "$tmp/cut"

if [ -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  # BLAS threads: the usable cores divided among the local replicas, unless asked.
  cores=$(nproc)
  threads() { if [ "$1" -le 1 ]; then echo "1 thread"; else echo "$1 threads"; fi; }
  expect 0 "kernels, $(threads "$cores")" --strategy default --epochs 1 --steps-per-epoch 2
  expect 0 "kernels, $(threads $((cores / 2 > 0 ? cores / 2 : 1)))" --replicas 2 --epochs 1 --steps-per-epoch 2
  expect 0 "kernels, 1 thread" --strategy default --blas-threads 1 --epochs 1 --steps-per-epoch 2
  expect 0 "^test accuracy 0\.[0-9]{4}$" --epochs 2 --steps-per-epoch 30 --replicas 2 \
    --metrics "$tmp/m.json" --plot "$tmp/p.svg"
  grep -q '"test_accuracy"' "$tmp/m.json" || { echo "FAIL: no metrics JSON"; fails=$((fails + 1)); }
  grep -q '<svg' "$tmp/p.svg" || { echo "FAIL: no SVG plot"; fails=$((fails + 1)); }
  expect 1 "--global-batch 60001 is more than the 60,000 training images" --global-batch 60001
  # A full disk: the tool says so and exits non-zero.
  expect 1 "could not write the metrics file /dev/full: No space left on device" --epochs 1 --steps-per-epoch 3 \
    --metrics /dev/full
  # A diverged run: valid JSON with null losses, a message, exit 3.
  expect 3 "the training diverged: the loss is not finite from epoch 1 on" --epochs 1 --steps-per-epoch 10 \
    --optimizer sgd --learning-rate 1e30 --metrics "$tmp/d.json" --plot "$tmp/d.svg"
  if grep -q '"diverged": true' "$tmp/d.json" && grep -q '"train_loss": null' "$tmp/d.json" &&
    ! grep -qi 'nan\|inf' "$tmp/d.json"; then
    echo "ok: a diverged run's metrics are valid JSON with null losses"
  else
    echo "FAIL: a diverged run's metrics: $(cat "$tmp/d.json")"
    fails=$((fails + 1))
  fi
  grep -q 'nan' "$tmp/d.svg" && { echo "FAIL: the diverged run's plot draws NaN"; fails=$((fails + 1)); }
  # expect_through "PREFIX..." CODE PATTERN ARGS...: `expect`, with the tool
  # started through PREFIX (taskset, env) by a wrapper script.
  expect_through() {
    local real=$bin prefix=$1
    shift
    bin=$(mktemp "$tmp/through.XXXX")
    printf '#!/bin/sh\nexec %s "%s" "$@"\n' "$prefix" "$real" >"$bin"
    chmod +x "$bin"
    expect "$@"
    bin=$real
  }
  # One replica per CPU this process may use (not per CPU of the machine).
  if command -v taskset >/dev/null && [ "$(nproc --all)" -ge 2 ]; then
    expect_through "taskset -c 0" 0 "MirroredStrategy\(1 replica: CPU:0\).*; 1 CPU of [0-9]+, [0-9]+ NUMA node" \
      --epochs 1 --steps-per-epoch 2
  fi
  # OpenBLAS's kernels fit the CPU: the widest the CPU runs, whatever
  # OpenBLAS picked by itself (0.3.21 picks Prescott on the device
  # machine's Xeon); a core the user asks for is kept.
  flags=$(grep -m1 '^flags' /proc/cpuinfo)
  has() { grep -qw "$1" <<<"$flags"; }
  if has avx512f && has avx512cd && has avx512bw && has avx512dq && has avx512vl; then
    want='(SkylakeX|Cooperlake|SapphireRapids) kernels'
  elif has avx2 && has fma; then
    want='(Haswell|Zen|Excavator) kernels'
  else
    want='kernels'
  fi
  expect_through "env -u OPENBLAS_CORETYPE" 0 \
    "$want, 1 thread(, chosen by OpenBLAS|; OPENBLAS_CORETYPE=[A-Za-z]+ set by distribute-train: OpenBLAS picked)" \
    --epochs 1 --steps-per-epoch 2 --replicas 1 --blas-threads 1 --blas-core auto
  # A core asked for runs the program again with it, and says so.
  expect 0 "\(Prescott kernels, 1 thread; OPENBLAS_CORETYPE=Prescott set by distribute-train for --blas-core" \
    --epochs 1 --steps-per-epoch 2 --replicas 1 --blas-threads 1 --blas-core prescott
  # OPENBLAS_CORETYPE set by the user is kept.
  expect_through "env OPENBLAS_CORETYPE=Prescott" 0 "\(Prescott kernels, 1 thread; OPENBLAS_CORETYPE=Prescott, as set\)" \
    --epochs 1 --steps-per-epoch 2 --replicas 1 --blas-threads 1
else
  echo "FAIL: the Fashion-MNIST files are missing (scripts/setup.sh installs dataset-fashion-mnist)"
  fails=$((fails + 1))
fi
exit $((fails > 0))
