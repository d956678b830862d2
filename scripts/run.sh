#!/usr/bin/env bash
# Sets up a fresh Debian bookworm machine, builds hivemesh's example trainer in Release and runs
# the main job: collaborative_trainer with its defaults (4 peer processes on loopback TCP train
# a small CNN on Fashion-MNIST together; a live view, then the test accuracy, a table of where
# the time went and the report in report/). Extra arguments go to the trainer, e.g. --peers 8,
# --single, --model mlp, --local-updates or --report DIR (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build-release.sh collaborative_trainer monitor
build=${HIVEMESH_BUILD_ROOT:-build}/release
"${build}/examples/collaborative_trainer" "$@"
