// The collaborative optimizer's cost per step between epochs (issue 19): step() of a
// collaborative optimizer whose peer is alone on loopback TCP, next to a plain
// local_optimizer::step(), for a raw model of n float32 parameters (one std::vector<float>)
// and SGD with momentum 0.9. target_batch_size is so large that no epoch ends while measuring,
// so a collaborative step is what a trainer pays between epochs:
//   gradients      (the default mode) adds 32 · grad to the accumulator on the caller's
//                  thread, then reports the samples to the progress tracker on the peer's
//                  executor and waits for it (asio::use_future);
//   local_updates  takes the local optimizer step, then reports the samples the same way.
//
// Names: collaborative/<mode>/n:<floats>: pairs of one plain local step and one collaborative
//     step, alternating which goes first, each timed on its own; the plain step is the
//     collaborative optimizer's own local optimizer (optimizer()) stepping its parameters
//     directly, so both run the same code on the same memory. The row's time is the
//     collaborative step's. Counters, medians over the pairs: local_ms, collaborative_ms,
//     overhead_pct = 100 · median(collaborative − local) / median(local); accumulate_ms
//     (gradients) or local_step_ms (local_updates): the part of the collaborative step the
//     optimizer times itself (statistics().accumulating or optimizer_step); added_ms the
//     remainder (handing the step to the peer's executor, the progress report, the future)
//     and added_pct = 100 · added_ms / local_ms. In local-update mode both steps do the same
//     work, so overhead_pct and added_pct measure the same cost, but only added_pct is
//     steady: the SGD step's speed depends on where its stack scratch block lies relative to
//     the parameters (clang -O3 runs it about 1.8 times slower when that block falls in one
//     quarter of the addresses modulo 1 KiB), the collaborative step calls it from another
//     stack depth than the plain call, and the stack's address changes from one process to
//     the next: overhead_pct moves by ±10% and more from run to run, added_pct does not;
//   floor/accumulate/n:<floats>: sum += 32 · grad in a loop g++ vectorises at -O2, the memory
//     traffic an accumulating step cannot avoid;
//   floor/handoff: asio::post to the peer's executor and wait on a std::future, the thread
//     round trip every blocking step() makes (added_ms above includes one).
// Pairing keeps the comparison fair on a loaded machine: both steps of a pair see the same
// load, and medians keep out the pairs that a burst of other work hit. The paired rows fail
// (exit status 1) if an epoch ended or a step did not report its samples.
//
//   bench_optim --benchmark_out=optim.json --benchmark_out_format=json
#include <hivemesh/core/log.hpp>
#include <hivemesh/core/random.hpp>
#include <hivemesh/optim/collaborative.hpp>
#include <hivemesh/optim/sgd.hpp>
#include <hivemesh/peer.hpp>

#include <asio/post.hpp>
#include <asio/use_future.hpp>

#include "bench_main.hpp"
#include "statistics.hpp"

#include <benchmark/benchmark.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace {

using hivemesh::bench::fail;
using hivemesh::bench::median;

using namespace hivemesh;
using namespace std::chrono_literals;
using wall_clock = std::chrono::steady_clock;

constexpr std::int64_t size_1m = std::int64_t{1} << 20;
constexpr std::int64_t size_10m = 10'000'000;
constexpr std::uint64_t batch = 32;
constexpr std::uint64_t data_seed = 20240719;

/// A raw model: one parameter of n floats and its gradient, N(0, 1) (fixed seed).
struct raw_model {
    explicit raw_model(std::size_t n)
        : value(n)
        , grad(n) {
        random_generator rng(data_seed);
        for (std::size_t j = 0; j < n; ++j) {
            value[j] = static_cast<float>(rng.normal());
            grad[j] = static_cast<float>(rng.normal());
        }
    }
    std::vector<optim::parameter> parameters() { return {optim::parameter{value, grad}}; }

    std::vector<float> value;
    std::vector<float> grad;
};

optim::local_optimizer sgd_with_momentum() {
    optim::sgd_options o;
    o.lr = 1e-3;
    o.momentum = 0.9;
    return optim::sgd(o);
}

/// The one peer of these benchmarks, alone on loopback TCP, made on first use.
peer& lone_peer() {
    static peer p = [] {
        peer_options o;
        o.listen = {"/ip4/127.0.0.1/tcp/0"};
        o.dht.maintenance_period = 0s;
        return peer(o);
    }();
    return p;
}

template <class Duration>
double milliseconds(Duration d) {
    return std::chrono::duration<double, std::milli>(d).count();
}

void bm_collaborative(benchmark::State& state, bool local_updates) {
    raw_model model(static_cast<std::size_t>(state.range(0)));
    optim::collaborative_options o;
    o.run_id = local_updates ? "bench_optim_local" : "bench_optim_gradients";
    o.target_batch_size = std::numeric_limits<std::uint64_t>::max() / 2; // no epoch ends
    o.batch_size_per_step = batch;
    o.use_local_updates = local_updates;
    optim::collaborative_optimizer collaborative(lone_peer(), model.parameters(),
                                                 sgd_with_momentum(), o);
    // The baseline is the collaborative optimizer's own local optimizer on the same
    // parameters: the same code on the same memory (two models in different buffers differ
    // by several percent on this machine from where their pages lie).
    auto& local = collaborative.optimizer();
    const auto& params = collaborative.parameters();
    // The first step waits for the tracker's first read of the DHT, and the first local step
    // allocates the momentum buffer.
    for (int i = 0; i < 2; ++i) {
        collaborative.step();
        local.step(params);
    }
    const auto before = collaborative.statistics();

    // Per pair: the plain step, the collaborative step, and the part of it the optimizer timed
    // itself (the accumulation, or the local step).
    std::vector<double> local_ms, collaborative_ms, inner_ms, differences, added_ms;
    bool local_first = true;
    for (auto _ : state) {
        const auto take_local = [&] {
            const auto start = wall_clock::now();
            local.step(params);
            local_ms.push_back(milliseconds(wall_clock::now() - start));
        };
        if (local_first) take_local();
        const auto inner_before = local_updates ? collaborative.statistics().optimizer_step
                                                : collaborative.statistics().accumulating;
        const auto start = wall_clock::now();
        const auto report = collaborative.step();
        const auto spent = wall_clock::now() - start;
        const auto inner = (local_updates ? collaborative.statistics().optimizer_step
                                          : collaborative.statistics().accumulating) -
                           inner_before;
        if (!local_first) take_local();
        local_first = !local_first;
        state.SetIterationTime(std::chrono::duration<double>(spent).count());
        collaborative_ms.push_back(milliseconds(spent));
        inner_ms.push_back(milliseconds(inner));
        differences.push_back(collaborative_ms.back() - local_ms.back());
        added_ms.push_back(collaborative_ms.back() - inner_ms.back());
        if (report.epoch_ended) return fail(state, "an epoch ended while measuring");
    }
    const auto after = collaborative.statistics();
    if (after.samples - before.samples != state.iterations() * batch)
        return fail(state, "the steps did not report their samples");
    const double local_median = median(local_ms);
    state.counters["local_ms"] = local_median;
    state.counters["collaborative_ms"] = median(collaborative_ms);
    state.counters["overhead_pct"] = 100 * median(differences) / local_median;
    state.counters[local_updates ? "local_step_ms" : "accumulate_ms"] = median(inner_ms);
    state.counters["added_ms"] = median(added_ms);
    state.counters["added_pct"] = 100 * median(added_ms) / local_median;
    collaborative.close();
}

constexpr std::size_t block_elements = 256;

/// sum += weight · g over one block: a constant trip count and restrict pointers, so that g++
/// vectorises it at -O2 without a runtime alias check or a remainder loop.
void add_scaled_block(float* __restrict sum, const float* __restrict g, float weight) {
    for (std::size_t j = 0; j < block_elements; ++j)
        sum[j] += weight * g[j];
}

/// sum += weight · g over [0, n).
void add_scaled(float* sum, const float* g, float weight, std::size_t n) {
    std::size_t at = 0;
    for (; n - at >= block_elements; at += block_elements)
        add_scaled_block(sum + at, g + at, weight);
    for (; at < n; ++at)
        sum[at] += weight * g[at];
}

void bm_accumulate_floor(benchmark::State& state) {
    raw_model model(static_cast<std::size_t>(state.range(0)));
    std::vector<float> sum(model.grad.size(), 0.0f);
    const auto weight = static_cast<float>(batch);
    for (auto _ : state) {
        add_scaled(sum.data(), model.grad.data(), weight, sum.size());
        benchmark::DoNotOptimize(sum.data());
        benchmark::ClobberMemory();
    }
}

void bm_handoff_floor(benchmark::State& state) {
    const auto executor = lone_peer().get_executor();
    for (auto _ : state)
        asio::post(executor, asio::use_future).get();
}

void register_benchmarks() {
    // The peer's progress tracker logs nothing worth a benchmark's output.
    log::set_sink([](log::level l, std::string_view component, std::string_view message) {
        if (l >= log::level::error)
            std::fprintf(stderr, "[hivemesh %s] %.*s: %.*s\n", log::to_string(l),
                         static_cast<int>(component.size()), component.data(),
                         static_cast<int>(message.size()), message.data());
    });
    const auto sizes = [](benchmark::internal::Benchmark* b) {
        b->ArgName("n")->Arg(size_1m)->Arg(size_10m)->Unit(benchmark::kMillisecond);
    };
    sizes(benchmark::RegisterBenchmark("collaborative/gradients", bm_collaborative, false)
              ->UseManualTime());
    sizes(benchmark::RegisterBenchmark("collaborative/local_updates", bm_collaborative, true)
              ->UseManualTime());
    sizes(benchmark::RegisterBenchmark("floor/accumulate", bm_accumulate_floor)->UseRealTime());
    benchmark::RegisterBenchmark("floor/handoff", bm_handoff_floor)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
}

} // namespace

int main(int argc, char** argv) {
    return hivemesh::bench::run_main(argc, argv, "bench_optim", register_benchmarks);
}
