# What the train_* scripts share; sourced, after `bin` and `mpirun` are set
# (mpirun empty: one process). Sets `tmp` (removed at exit), `fails` and
# fail(), `launch` (the training program on 2 replicas: mirrored in one
# process, or two workers of one replica under mpirun) and digest() (the
# `parameters CRC32C` line of a run's output).
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
if [ -n "$mpirun" ]; then
  launch=("$mpirun" --allow-run-as-root --oversubscribe -np 2 "$bin" --strategy multi_worker --replicas 1)
else
  launch=("$bin" --strategy mirrored --replicas 2)
fi
digest() { grep -o 'parameters CRC32C [0-9a-f]*' <<< "$1" | head -1; }
