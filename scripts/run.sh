#!/usr/bin/env bash
# Sets up a fresh Debian bookworm machine, builds hivemesh in Release and runs the main
# job until the collaborative trainer exists: a local Moshpit swarm, 16 processes on
# loopback TCP in groups of 4, averaging a 16 MiB tensor for 3 rounds (rounds, throughput,
# distance from the global mean). Extra arguments go to the program, e.g. --peers 8
# --group 2, --codec blockwise_8bit or --json swarm.json.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
build=${HIVEMESH_BUILD_ROOT:-build}/release
# One program: header-only compiles only what it uses (hivemesh::compiled would build the
# sim instantiations too).
cmake -S . -B "${build}" -DCMAKE_BUILD_TYPE=Release -DHIVEMESH_BUILD_TESTS=OFF \
  -DHIVEMESH_BUILD_COMPILED=OFF
cmake --build "${build}" -j "$(nproc)" --target moshpit_swarm
"${build}/examples/moshpit_swarm" "$@"
