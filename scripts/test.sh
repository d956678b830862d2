#!/usr/bin/env bash
# Sets up a fresh Debian bookworm machine and runs every test:
#   1. g++ 12, warnings as errors, AddressSanitizer + UndefinedBehaviorSanitizer at -O1 with
#      line tables: all tests (unit, consumer packaging, benchmark smoke runs);
#   2. clang 14, warnings as errors, -O0: all tests again, every public header compiled
#      alone, and the libFuzzer targets (-O1, ASan + UBSan) for a short run each.
# Both link the tests to hivemesh::compiled, so the node, DHT and averaging templates are
# compiled once per suite rather than in every test file; the consumer tests and the fuzzers
# build header-only. -O1 -g1 and -O0 are what keep a cold build of both suites within the
# README's figure on two cores; clang's warnings do not depend on the optimisation level.
# Build trees go to build/ (override with HIVEMESH_BUILD_ROOT).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh

root=${HIVEMESH_BUILD_ROOT:-build}
jobs=${HIVEMESH_JOBS:-$(nproc)}
fuzz_seconds=${HIVEMESH_FUZZ_SECONDS:-20}

run_suite() { # name, build type, flags of that build type, then extra cmake arguments
  local name=$1 type=$2 flags=$3
  shift 3
  echo "=== ${name} ==="
  cmake -S . -B "${root}/${name}" -DCMAKE_BUILD_TYPE="${type}" \
    "-DCMAKE_CXX_FLAGS_${type^^}=${flags}" -DHIVEMESH_WERROR=ON "$@"
  cmake --build "${root}/${name}" -j "${jobs}"
  (cd "${root}/${name}" && ctest --output-on-failure -j "${jobs}")
}

# ccache keys on paths relative to the checkout, so a fresh clone elsewhere (CI) reuses
# what an earlier build of the same sources compiled.
export CCACHE_BASEDIR="${PWD}" CCACHE_NOHASHDIR=true
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export ASAN_OPTIONS=detect_leaks=1:strict_string_checks=1
run_suite gcc-asan RelWithDebInfo "-O1 -g1 -DNDEBUG" -DCMAKE_CXX_COMPILER=g++ \
  -DHIVEMESH_SANITIZE=address,undefined -DHIVEMESH_CHECK_HEADERS=OFF
run_suite clang Debug "-O0" -DCMAKE_CXX_COMPILER=clang++-14 -DHIVEMESH_BUILD_FUZZERS=ON \
  -DHIVEMESH_FUZZ_SECONDS="${fuzz_seconds}"
echo "all test suites passed"
