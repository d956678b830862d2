#!/usr/bin/env bash
# Sets up a fresh Debian bookworm machine, builds hivemesh in Release and runs the main
# job: every codec on the real Fashion-MNIST training set (size, error, throughput).
# Extra arguments go to the program, e.g. --images 1000 or --json results.json.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
build=${HIVEMESH_BUILD_ROOT:-build}/release
cmake -S . -B "${build}" -DCMAKE_BUILD_TYPE=Release -DHIVEMESH_BUILD_TESTS=OFF
cmake --build "${build}" -j "$(nproc)" --target compress_fashion_mnist
"${build}/examples/compress_fashion_mnist" "$@"
