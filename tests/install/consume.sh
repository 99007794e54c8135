#!/usr/bin/env bash
# consume.sh SOURCE_DIR BUILD_DIR: installs the build at BUILD_DIR into a
# fresh prefix (cmake --install), builds tests/install/consumer there with
# find_package(distribute CONFIG) and runs it, then compiles its program
# again from pkg-config's flags alone, and imports the installed Python
# package where there is one. Passes if every step does.
set -eu
src=$1 build=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
echo "installed: $(cd "$work/prefix" && find . -type f | sort | tr '\n' ' ')"
cmake -S "$src/tests/install/consumer" -B "$work/build" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$work/build" >/dev/null
"$work/build/consumer"
if [ -x "$work/build/consumer_mpi" ]; then "$work/build/consumer_mpi"; fi
# pkg-config: the flags it gives build the same program.
PKG_CONFIG_PATH=$(dirname "$(find "$work/prefix" -name distribute.pc)")
export PKG_CONFIG_PATH
flags=$(pkg-config --cflags --libs distribute)
c++ "$src/tests/install/consumer/consumer.cc" $flags -o "$work/consumer_pc"
if pkg-config --exists distribute-mpi; then
  c++ "$src/tests/install/consumer/consumer_mpi.cc" $(pkg-config --cflags --libs distribute-mpi) -o "$work/consumer_mpi_pc"
  "$work/consumer_mpi_pc"
fi
"$work/consumer_pc"
# The Python package, where this build made it: it imports from the prefix.
module=$(find "$work/prefix" -name '_distribute*.so' | head -1)
if [ -n "$module" ]; then
  python=/usr/bin/python3
  [ -x "$python" ] || python=python3
  PYTHONPATH=$(dirname "$(dirname "$module")") "$python" -c \
    'import distribute as ds; assert int(ds.MirroredStrategy(["CPU:0"]).run(lambda: ds.constant(2))) == 2'
  echo "consume.sh: the installed Python package imports and runs"
fi
echo "consume.sh: the installed package builds and runs a consumer (CMake and pkg-config)"
