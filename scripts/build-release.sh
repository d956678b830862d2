#!/usr/bin/env bash
# Sets up a fresh Debian bookworm machine and builds the named targets header-only in Release
# under ${HIVEMESH_BUILD_ROOT:-build}/release (no tests; hivemesh::compiled would build the sim
# instantiations too). For scripts/run.sh and scripts/thesis-matrix.sh.
# usage: build-release.sh TARGET...
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
build=${HIVEMESH_BUILD_ROOT:-build}/release
cmake -S . -B "${build}" -DCMAKE_BUILD_TYPE=Release -DHIVEMESH_BUILD_TESTS=OFF \
  -DHIVEMESH_BUILD_COMPILED=OFF
cmake --build "${build}" -j "$(nproc)" --target "$@"
