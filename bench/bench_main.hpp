// What every hivemesh benchmark program shares: error reporting that makes the program exit
// nonzero (so CTest's smoke runs catch a broken benchmark without looking at speed), and a
// main() that also fails when the filter matches nothing.
#pragma once

#include <benchmark/benchmark.h>

#include <atomic>
#include <cstdio>
#include <string>

namespace hivemesh::bench {

inline std::atomic<bool> any_error{false};

/// Marks the benchmark as failed; the program then exits nonzero.
inline void fail(benchmark::State& state, const std::string& message) {
    any_error = true;
    state.SkipWithError(message.c_str());
}

/// Registers with `register_all`, runs what the command line selects.
inline int run_main(int argc, char** argv, const char* program, void (*register_all)()) {
    register_all();
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
    const std::size_t ran = benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    if (ran == 0) {
        std::fprintf(stderr, "%s: no benchmark matched the filter\n", program);
        return 1;
    }
    return any_error ? 1 : 0;
}

} // namespace hivemesh::bench
