#!/usr/bin/env bash
# Sets up a fresh Debian bookworm machine and builds the named targets header-only in Release
# under ${HIVEMESH_BUILD_ROOT:-build}/release (no tests; hivemesh::compiled would build the sim
# instantiations too). For scripts/run.sh, scripts/thesis-matrix.sh and scripts/soak.sh.
# HIVEMESH_JOBS caps the parallel compile jobs (default: nproc).
# usage: build-release.sh TARGET...
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
build=${HIVEMESH_BUILD_ROOT:-build}/release
cmake -S . -B "${build}" -DCMAKE_BUILD_TYPE=Release -DHIVEMESH_BUILD_TESTS=OFF \
  -DHIVEMESH_BUILD_COMPILED=OFF
cmake --build "${build}" -j "${HIVEMESH_JOBS:-$(nproc)}" --target "$@"
