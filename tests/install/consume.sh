#!/usr/bin/env bash
# consume.sh SOURCE_DIR BUILD_DIR: installs the build at BUILD_DIR into a
# fresh prefix (cmake --install), checks that its libraries carry no debug
# info, builds tests/install/consumer there with find_package(distribute
# CONFIG) (the core alone, with CUDA and MPI hidden, and then the mpi
# component) and runs it, then compiles its program again from pkg-config's
# flags alone, and imports the installed Python package where there is one.
# Passes if every step does. Static or shared (BUILD_SHARED_LIBS) builds.
set -eu
src=$1 build=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
echo "installed: $(cd "$work/prefix" && find . -type f | sort | tr '\n' ' ')"
# The installed libraries carry no debug info (DIST_INSTALL_DEBUG_INFO=OFF).
libdir=$(dirname "$(find "$work/prefix" -name 'libdistribute.a' -o -name 'libdistribute.so' | head -1)")
[ -d "$libdir" ] && [ "$libdir" != . ] || { echo "FAIL: no libdistribute installed"; exit 1; }
for lib in "$libdir"/libdistribute*.a "$libdir"/libdistribute*.so; do
  [ -e "$lib" ] || continue
  if readelf -S "$lib" | grep -q '\.debug_info'; then echo "FAIL: $lib carries debug info"; exit 1; fi
  echo "installed $(basename "$lib"): $(stat -c %s "$lib") bytes, no debug info"
done
# A CPU-only consumer: it needs neither the CUDA toolkit nor MPI to
# configure (both are hidden from it), nor libcudart to run.
cmake -S "$src/tests/install/consumer" -B "$work/build" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON >/dev/null
cmake --build "$work/build" >/dev/null
"$work/build/consumer"
if ldd "$work/build/consumer" | grep -q 'libcudart\|libmpi'; then
  echo "FAIL: the CPU-only consumer links $(ldd "$work/build/consumer" | grep -o 'libcudart[^ ]*\|libmpi[^ ]*' | tr '\n' ' ')"
  exit 1
fi
echo "consume.sh: the CPU-only consumer ($(stat -c %s "$work/build/consumer") bytes) needs neither libcudart nor MPI"
# The mpi component, where this build has it.
if [ -e "$libdir/libdistribute_mpi.a" ] || [ -e "$libdir/libdistribute_mpi.so" ]; then
  cmake -S "$src/tests/install/consumer" -B "$work/build_mpi" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" \
    -DCMAKE_BUILD_TYPE=Release -DCONSUMER_MPI=ON >/dev/null
  cmake --build "$work/build_mpi" >/dev/null
  "$work/build_mpi/consumer_mpi"
fi
# pkg-config: the flags it gives build the same program.
PKG_CONFIG_PATH=$(dirname "$(find "$work/prefix" -name distribute.pc)")
export PKG_CONFIG_PATH
flags=$(pkg-config --cflags --libs distribute)
rpath=-Wl,-rpath,$(pkg-config --variable=libdir distribute)  # (for a shared build)
c++ "$src/tests/install/consumer/consumer.cc" $flags "$rpath" -o "$work/consumer_pc"
if pkg-config --exists distribute-mpi; then
  c++ "$src/tests/install/consumer/consumer_mpi.cc" $(pkg-config --cflags --libs distribute-mpi) "$rpath" \
    -o "$work/consumer_mpi_pc"
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
