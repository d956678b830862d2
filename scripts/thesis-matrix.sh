#!/usr/bin/env bash
# Sets up a fresh Debian bookworm machine, builds the example trainer and bench/thesis_matrix in
# Release, and runs the thesis' experiment grid: one collaborative_trainer run per cell, then
# docs/thesis-matrix.md and its charts in docs/thesis-matrix/. Arguments go to thesis_matrix:
# --quick (about 10 minutes on two cores), --factor NAME, --samples N (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build-release.sh collaborative_trainer thesis_matrix
build=${HIVEMESH_BUILD_ROOT:-build}/release
"${build}/bench/thesis_matrix" --trainer "${build}/examples/collaborative_trainer" "$@"
