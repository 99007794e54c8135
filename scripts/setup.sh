#!/usr/bin/env bash
# Installs the Debian 12 packages distribute needs to build, test and train
# (OpenBLAS, zlib, the Fashion-MNIST files; clang and its libFuzzer for
# `make fuzz`; clang-format and clang-tidy for `make lint`). Safe to run again: it installs
# only what is missing. Runs as root (or with sudo).
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  googletest libgtest-dev libgmock-dev
  libdlpack-dev
  libopenmpi-dev openmpi-bin
  libopenblas-dev zlib1g-dev dataset-fashion-mnist
  clang libclang-rt-14-dev clang-format clang-tidy
  python3-dev pybind11-dev python3-numpy python3-pytest python3-pytest-timeout
  python3-threadpoolctl nlohmann-json3-dev python3-crc32c
)
# `setup.sh --bench` adds what bench/ compares against: Debian's PyTorch
# (it runs on the OpenBLAS installed above).
if [ "${1:-}" = "--bench" ]; then
  packages+=(python3-torch python3-numpy)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all packages present"
  exit 0
fi

echo "setup: installing ${missing[*]}"
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -q
"${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
