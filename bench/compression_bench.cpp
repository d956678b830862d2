// Micro benchmarks of the tensor codecs: compress and decompress throughput of every codec
// on N(0,1) data (fixed seed) at 1M and 16M floats, next to a memcpy baseline of the same
// sizes.
//
// Names:  compress/<codec>/n:<floats>/threads:<t>, decompress/<codec>/..., memcpy/n:<floats>
//   "threads" is the codec's own options::threads / limits::threads (work split inside one
//   call), not Google Benchmark's ->Threads(). Times are wall clock (UseRealTime), so the
//   threads:2 rows are comparable with the threads:1 rows.
// bytes_per_second counts float32 input bytes (4 per element) for every codec and for
// memcpy, so all rows compare directly. Counters: ratio = float32 bytes / compressed bytes,
// compressed_bytes = the size of one compressed buffer.
//
// Run a Release build; JSON goes to the file named by --benchmark_out:
//   bench_compression --benchmark_out=compression.json --benchmark_out_format=json
// The process exits nonzero if a codec reports an error or the filter matches nothing, so
// the CTest smoke run catches a broken benchmark without looking at speed.
#include <hivemesh/compression.hpp>
#include <hivemesh/core.hpp>

#include "bench_main.hpp"

#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace {

using hivemesh::bench::fail;

namespace hc = hivemesh::compression;

constexpr std::int64_t size_1m = std::int64_t{1} << 20;
constexpr std::int64_t size_16m = std::int64_t{1} << 24;
constexpr std::uint64_t data_seed = 20240611;

/// N(0,1) floats, generated on first use: a filtered run never pays for the 16M tensor.
const std::vector<float>& normal_data(std::size_t n) {
    static std::mutex mutex;
    static std::map<std::size_t, std::vector<float>> cache;
    const std::lock_guard lock(mutex);
    auto& values = cache[n];
    if (values.size() != n) {
        hivemesh::random_generator rng(data_seed);
        values.resize(n);
        for (float& v : values)
            v = static_cast<float>(rng.normal());
    }
    return values;
}

void set_throughput(benchmark::State& state, std::size_t n) {
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                            static_cast<std::int64_t>(n * sizeof(float)));
}

void set_ratio(benchmark::State& state, std::size_t n, std::size_t compressed) {
    state.counters["ratio"] =
        static_cast<double>(n * sizeof(float)) / static_cast<double>(compressed);
    state.counters["compressed_bytes"] = static_cast<double>(compressed);
}

void bm_compress(benchmark::State& state, hc::kind codec) {
    const auto n = static_cast<std::size_t>(state.range(0));
    const auto& values = normal_data(n);
    hc::options opts;
    opts.threads = static_cast<unsigned>(state.range(1));
    // Reused and pre-sized, so the loop measures encoding rather than allocation.
    hivemesh::byte_buffer out;
    out.reserve(hc::compressed_size(codec, n, opts));
    for (auto _ : state) {
        out.clear();
        if (const auto ec = hc::compress_into(codec, values, out, opts)) {
            fail(state, "compress_into: " + ec.message());
            break;
        }
        benchmark::DoNotOptimize(out.data());
        benchmark::ClobberMemory();
    }
    if (out.size() != hc::compressed_size(codec, n, opts))
        return fail(state, "compressed size differs from compressed_size()");
    set_throughput(state, n);
    set_ratio(state, n, out.size());
}

void bm_decompress(benchmark::State& state, hc::kind codec) {
    const auto n = static_cast<std::size_t>(state.range(0));
    const auto& values = normal_data(n);
    hivemesh::byte_buffer compressed;
    if (const auto ec = hc::compress_into(codec, values, compressed, {}))
        return fail(state, "compress_into: " + ec.message());
    hc::limits lim;
    lim.threads = static_cast<unsigned>(state.range(1));
    std::vector<float> out(n);
    for (auto _ : state) {
        if (const auto ec = hc::decompress_into(compressed, out, lim)) {
            fail(state, "decompress_into: " + ec.message());
            break;
        }
        benchmark::DoNotOptimize(out.data());
        benchmark::ClobberMemory();
    }
    set_throughput(state, n);
    set_ratio(state, n, compressed.size());
}

void bm_memcpy(benchmark::State& state) {
    const auto n = static_cast<std::size_t>(state.range(0));
    const auto& values = normal_data(n);
    std::vector<float> out(n);
    for (auto _ : state) {
        std::memcpy(out.data(), values.data(), n * sizeof(float));
        benchmark::DoNotOptimize(out.data());
        benchmark::ClobberMemory();
    }
    set_throughput(state, n);
}

/// The finite check every value leaving or entering a tensor gets (compression::all_finite):
/// at 128K values (512 KiB, the all-reduce's part) from L2, at 16M from memory.
void bm_all_finite(benchmark::State& state) {
    const auto n = static_cast<std::size_t>(state.range(0));
    const auto& values = normal_data(n);
    for (auto _ : state) {
        bool finite = hc::all_finite(values);
        benchmark::DoNotOptimize(finite);
        if (!finite) {
            fail(state, "all_finite: false on finite values");
            break;
        }
    }
    set_throughput(state, n);
}

/// Codecs that split work across threads get an extra threads:2 row per size.
bool is_threaded(hc::kind codec) {
    return codec == hc::kind::none || codec == hc::kind::float16 ||
           codec == hc::kind::blockwise_8bit;
}

void register_benchmarks() {
    benchmark::RegisterBenchmark("memcpy", bm_memcpy)
        ->ArgName("n")
        ->Arg(size_1m)
        ->Arg(size_16m)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark("all_finite", bm_all_finite)
        ->ArgName("n")
        ->Arg(std::int64_t{1} << 17)
        ->Arg(size_16m)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
    for (const hc::kind codec : hc::all_kinds) {
        const std::string name(hc::to_string(codec));
        for (const bool decode : {false, true}) {
            auto* bench = benchmark::RegisterBenchmark(
                ((decode ? "decompress/" : "compress/") + name).c_str(),
                decode ? bm_decompress : bm_compress, codec);
            bench->ArgNames({"n", "threads"})->UseRealTime()->Unit(benchmark::kMicrosecond);
            for (const std::int64_t n : {size_1m, size_16m}) {
                bench->Args({n, 1});
                if (is_threaded(codec)) bench->Args({n, 2});
            }
        }
    }
}

} // namespace

int main(int argc, char** argv) {
    return hivemesh::bench::run_main(argc, argv, "bench_compression", register_benchmarks);
}
