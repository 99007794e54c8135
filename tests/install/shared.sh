#!/usr/bin/env bash
# shared.sh SOURCE_DIR: builds the libraries alone as shared libraries
# (BUILD_SHARED_LIBS=ON, Release, no tests, tools or Python) in a fresh
# folder, then runs consume.sh on that build: the package works shared too.
set -eu
src=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
  -DDIST_BUILD_TESTS=OFF -DDIST_BUILD_TOOLS=OFF -DDIST_PYTHON=OFF >/dev/null
cmake --build "$work/build" -j "$(nproc)" >/dev/null
ls "$work/build/src/"libdistribute*.so* >/dev/null
"$src/tests/install/consume.sh" "$src" "$work/build"
