#!/usr/bin/env bash
# Installs the Debian bookworm packages hivemesh builds, tests and runs with; skips the
# ones already installed. Needs root (uses sudo when not root).
set -euo pipefail

packages=(
  build-essential cmake pkg-config ccache clang-14 libclang-rt-14-dev
  libasio-dev libsodium-dev libxxhash-dev libzstd-dev zlib1g-dev
  catch2 libbenchmark-dev libeigen3-dev libtorch-dev
  libcli11-dev nlohmann-json3-dev gnuplot-nox dataset-fashion-mnist
  iproute2
)

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

as_root=()
[ "$(id -u)" -ne 0 ] && as_root=(sudo)
echo "installing: ${missing[*]}"
"${as_root[@]}" apt-get update -q
DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
