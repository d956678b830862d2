#!/usr/bin/env bash
# Sets up a fresh Debian bookworm machine and runs every test:
#   1. g++ 12, warnings as errors, AddressSanitizer + UndefinedBehaviorSanitizer at -O0 with
#      line tables: all tests (unit, consumer packaging, benchmark smoke runs). What the
#      swarm-scale simulations run (hivemesh::compiled and the test programs marked SWARM in
#      tests/CMakeLists.txt) is compiled at -O1, so those minutes-long cases run optimised;
#   2. clang 14, warnings as errors, -O0: every target again, every public header compiled
#      alone, the libFuzzer targets (-O1, ASan + UBSan) for a short run each, and every test
#      but the swarm-scale ones (label "swarm") and the long multi-process ones that test no
#      compiler-dependent code (label "once"), which suite 1 runs;
#   3. clang 14, warnings as errors, ThreadSanitizer at -O1 with line tables: only the test
#      programs that run threads (THREADS in tests/CMakeLists.txt: core, TCP, the all-reduce
#      and state sharing with compute pools, the peer, progress tracking, the collaborative
#      optimizer with trainer threads and its delayed modes).
# All three link the tests to hivemesh::compiled, so the node, DHT and averaging templates
# are compiled once per suite rather than in every test file; the consumer tests and the
# fuzzers build header-only. The optimisation levels are what keep a cold build of the
# suites within the README's figure on two cores: unoptimised code with the sanitizers
# compiles in half the time, and clang's warnings do not depend on the optimisation level.
# Build trees go to build/ (override with HIVEMESH_BUILD_ROOT). HIVEMESH_SUITES picks
# suites by name (default: "gcc-asan clang clang-tsan"), e.g. to rerun one of them.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh

root=${HIVEMESH_BUILD_ROOT:-build}
jobs=${HIVEMESH_JOBS:-$(nproc)}
fuzz_seconds=${HIVEMESH_FUZZ_SECONDS:-20}
suites=" ${HIVEMESH_SUITES:-gcc-asan clang clang-tsan} "

configure() { # name, build type, flags of that build type, then extra cmake arguments
  local name=$1 type=$2 flags=$3
  shift 3
  echo "=== ${name} ==="
  cmake -S . -B "${root}/${name}" -DCMAKE_BUILD_TYPE="${type}" \
    "-DCMAKE_CXX_FLAGS_${type^^}=${flags}" -DHIVEMESH_WERROR=ON "$@"
}

run_suite() { # as configure, then "--" and ctest's test selection; builds everything
  [[ ${suites} == *" $1 "* ]] || return 0
  local name=$1 configure_args=()
  while [[ $# -gt 0 && $1 != -- ]]; do
    configure_args+=("$1")
    shift
  done
  [[ $# -gt 0 ]] && shift
  configure "${configure_args[@]}"
  cmake --build "${root}/${name}" -j "${jobs}"
  (cd "${root}/${name}" && ctest --output-on-failure -j "${jobs}" "$@")
}

# ccache keys on paths relative to the checkout, so a fresh clone elsewhere (CI) reuses
# what an earlier build of the same sources compiled.
export CCACHE_BASEDIR="${PWD}" CCACHE_NOHASHDIR=true
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export ASAN_OPTIONS=detect_leaks=1:strict_string_checks=1
run_suite gcc-asan RelWithDebInfo "-O0 -g1 -DNDEBUG" -DCMAKE_CXX_COMPILER=g++ \
  -DHIVEMESH_SANITIZE=address,undefined -DHIVEMESH_SWARM_FLAGS=-O1 -DHIVEMESH_CHECK_HEADERS=OFF
run_suite clang Debug "-O0" -DCMAKE_CXX_COMPILER=clang++-14 -DHIVEMESH_BUILD_FUZZERS=ON \
  -DHIVEMESH_FUZZ_SECONDS="${fuzz_seconds}" -- -LE "swarm|once"

if [[ ${suites} == *" clang-tsan "* ]]; then
  # No -DNDEBUG: the asserts check the invariants the threads share.
  configure clang-tsan RelWithDebInfo "-O1 -g1" -DCMAKE_CXX_COMPILER=clang++-14 \
    -DHIVEMESH_SANITIZE=thread -DHIVEMESH_CHECK_HEADERS=OFF -DHIVEMESH_WITH_TORCH=OFF \
    -DHIVEMESH_BUILD_BENCHMARKS=OFF -DHIVEMESH_BUILD_EXAMPLES=OFF
  # clang 14's TSan runtime maps its shadow at fixed addresses and dies with "unexpected
  # memory mapping" where the kernel randomises mmap with more than 28 bits (newer
  # kernels' default); setarch -R turns address randomisation off for these processes
  # only (no root, no sysctl). The build needs it too: CTest's test discovery runs the
  # programs.
  no_aslr=(setarch "$(uname -m)" -R)
  # tests/tsan.supp: only third-party code TSan cannot see into, each entry with its reason.
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=${PWD}/tests/tsan.supp"
  # Only the test programs marked THREADS in tests/CMakeLists.txt: the others run on one
  # thread (the simulated network, or loopback TCP on one io thread), where TSan finds
  # nothing.
  "${no_aslr[@]}" cmake --build "${root}/clang-tsan" -j "${jobs}" --target hivemesh_threaded_tests
  (cd "${root}/clang-tsan" && "${no_aslr[@]}" ctest --output-on-failure -j "${jobs}" -L threads)
fi
echo "all test suites passed"
