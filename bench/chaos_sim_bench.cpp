// Chaos training at scale (issue 22 §2): the scenario of tests/support/chaos_training.hpp —
// peers training with the collaborative optimizer on the simulated network under churn, loss,
// 20-200 ms links and a partition that heals — with 256 peers by default (the CI test runs 64).
// Reports the gradient rounds by outcome and why they failed, the samples lost, the time to
// recover from the partition, the final round's agreement and the loss; exits 1 when a live
// peer's step failed, the run did not finish or the final round did not gather every live peer.
#include "program.hpp"
#include "support/chaos_training.hpp"

#include <hivemesh/core/log.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>

namespace {

using namespace hivemesh;

duration from_seconds(double s) {
    return std::chrono::duration_cast<duration>(std::chrono::duration<double>(s));
}

double seconds(duration d) {
    return std::chrono::duration<double>(d).count();
}

struct options {
    test::chaos_options chaos;
    std::string json_path;
    bool verbose = false;
};

options parse(int argc, char** argv) {
    CLI::App app{"Chaos training on a simulated swarm: peers train with the collaborative "
                 "optimizer under churn, loss, latency and a partition; rounds, samples lost "
                 "and the recovery from the partition.",
                 "bench_chaos_sim"};
    app.option_defaults()->always_capture_default();
    options o;
    auto& c = o.chaos;
    c.peers = 256;
    c.target = 16384; // about as many virtual seconds per epoch as the 64-peer test
    double min_interval = seconds(c.min_interval), max_interval = seconds(c.max_interval);
    double min_latency = seconds(c.min_latency), max_latency = seconds(c.max_latency);
    double churn_every = seconds(c.churn_every), churn_until = seconds(c.churn_until);
    double partition_at = seconds(c.partition_at), partition_for = seconds(c.partition_for);
    double max_virtual = seconds(c.max_virtual);
    double matchmaking_time = seconds(c.matchmaking_time);
    app.add_option("--peers", c.peers, "peers at any time")->check(CLI::Range(4, 4096));
    app.add_option("--seed", c.seed, "the swarm's seed")->check(program::non_negative);
    app.add_option("--elements", c.elements, "float32 in the model")->check(program::positive);
    app.add_option("--batch", c.batch, "samples per step")->check(program::positive);
    app.add_option("--target", c.target, "target_batch_size")->check(program::positive);
    app.add_option("--epochs", c.epochs, "epochs every live peer trains")->check(program::positive);
    app.add_option("--min-interval", min_interval, "fastest time between batches (s)")
        ->check(program::positive);
    app.add_option("--max-interval", max_interval, "slowest time between batches (s)")
        ->check(program::positive);
    app.add_option("--min-latency", min_latency, "shortest one-way link latency (s)")
        ->check(program::non_negative);
    app.add_option("--max-latency", max_latency, "longest one-way link latency (s)")
        ->check(program::non_negative);
    app.add_option("--loss", c.loss, "loss probability per transmission")
        ->check(CLI::Range(0.0, 0.5));
    app.add_option("--churn-every", churn_every,
                   "a peer crashes and one joins this often (s, 0: "
                   "never)")
        ->check(program::non_negative);
    app.add_option("--churn-until", churn_until, "churn stops this long after the start (s)")
        ->check(program::non_negative);
    app.add_option("--partition-at", partition_at, "the partition starts then (s)")
        ->check(program::non_negative);
    app.add_option("--partition-for", partition_for, "and heals after this long (s, 0: none)")
        ->check(program::non_negative);
    app.add_option("--matchmaking-time", matchmaking_time,
                   "collaborative_options::"
                   "matchmaking_time (s)")
        ->check(program::positive);
    app.add_option("--max-virtual", max_virtual, "virtual time the run may take (s)")
        ->check(program::positive);
    app.add_flag("--verbose", o.verbose, "print the library's warnings");
    app.add_option("--json", o.json_path, "also write the figures as JSON to FILE")
        ->type_name("FILE");
    try {
        app.parse(argc, argv);
        if (max_interval < min_interval || max_latency < min_latency)
            throw CLI::ValidationError("--max-*", "must be at least the matching --min-*");
    } catch (const CLI::ParseError& e) {
        program::exit_after(app, e);
    }
    c.min_interval = from_seconds(min_interval);
    c.max_interval = from_seconds(max_interval);
    c.min_latency = from_seconds(min_latency);
    c.max_latency = from_seconds(max_latency);
    c.churn_every = from_seconds(churn_every);
    c.churn_until = from_seconds(churn_until);
    c.partition_at = from_seconds(partition_at);
    c.partition_for = from_seconds(partition_for);
    c.max_virtual = from_seconds(max_virtual);
    c.matchmaking_time = from_seconds(matchmaking_time);
    return o;
}

nlohmann::ordered_json to_json(const options& o, const test::chaos_result& r) {
    const auto& c = o.chaos;
    return {{"benchmark", "chaos_sim"},
            {"peers", c.peers},
            {"seed", c.seed},
            {"elements", c.elements},
            {"target_batch_size", c.target},
            {"epochs", c.epochs},
            {"loss", c.loss},
            {"latency_seconds", {seconds(c.min_latency), seconds(c.max_latency)}},
            {"churn_every_seconds", seconds(c.churn_every)},
            {"partition_seconds", {seconds(c.partition_at), seconds(c.partition_for)}},
            {"finished", r.finished},
            {"failures", r.failures},
            {"crashes", r.crashes},
            {"joins", r.joins},
            {"live", r.live},
            {"epochs_of_live_peers", {r.min_live_epoch, r.global_epoch}},
            {"state_loads", r.state_loads},
            {"gradient_rounds", r.rounds},
            {"mean_group_size_by_epoch", r.group_size_by_epoch},
            {"samples", r.samples},
            {"samples_averaged", r.samples_averaged},
            {"samples_partial", r.samples_partial},
            {"samples_in_failed_or_alone_rounds", r.samples_alone},
            {"samples_discarded", r.samples_discarded},
            {"samples_of_crashed_peers", r.samples_crashed},
            {"samples_lost", r.samples_lost()},
            {"partition_recovery_seconds", r.partition_recovery},
            {"final_group_min", r.final_group_min},
            {"final_disagreement", r.final_disagreement},
            {"initial_loss", r.initial_loss},
            {"final_loss", r.final_loss},
            {"trace_hash", r.trace_hash},
            {"segments_lost", r.network.segments_lost},
            {"virtual_seconds", r.virtual_seconds},
            {"wall_seconds", r.wall_seconds}};
}

} // namespace

int main(int argc, char** argv) {
    const auto o = parse(argc, argv);
    if (!o.verbose) log::set_level(log::level::error);
    auto chaos = o.chaos;
    const auto wall_start = std::chrono::steady_clock::now();
    chaos.progress = [&](double virtual_seconds, const std::string& event) {
        const std::chrono::duration<double> wall = std::chrono::steady_clock::now() - wall_start;
        std::printf("[%7.1f s virtual, %6.1f s wall] %s\n", virtual_seconds, wall.count(),
                    event.c_str());
        std::fflush(stdout);
    };
    const auto r = test::run_chaos_training(chaos);
    const auto percent = [&](std::uint64_t n) {
        return r.samples == 0 ? 0.0 : 100.0 * static_cast<double>(n) / r.samples;
    };
    std::printf("chaos: %zu peers, %zu crashed and %zu joined, %zu live at epochs %llu..%llu, "
                "%llu state downloads\n",
                o.chaos.peers, r.crashes, r.joins, r.live,
                static_cast<unsigned long long>(r.min_live_epoch),
                static_cast<unsigned long long>(r.global_epoch),
                static_cast<unsigned long long>(r.state_loads));
    std::printf("gradient rounds at epoch ends (one per peer and epoch):\n");
    for (const auto& [outcome, count] : r.rounds)
        std::printf("  %-60s %6zu\n", outcome.c_str(), count);
    std::printf("mean group size by epoch:");
    for (const double size : r.group_size_by_epoch)
        std::printf(" %.1f", size);
    std::printf("\n");
    std::printf("samples: %llu computed; averaged %.1f%%, partly %.1f%%; lost %.1f%% "
                "(failed or alone rounds %.1f%%, discarded by state downloads %.1f%%, "
                "crashed peers' %.1f%%)\n",
                static_cast<unsigned long long>(r.samples), percent(r.samples_averaged),
                percent(r.samples_partial), percent(r.samples_lost()), percent(r.samples_alone),
                percent(r.samples_discarded), percent(r.samples_crashed));
    std::printf("partition recovery: %.2f virtual s from the heal to the first round larger "
                "than either side\n",
                r.partition_recovery);
    std::printf("final round: smallest group %zu of %zu live, largest disagreement %.3g; loss "
                "%.4g -> %.4g\n",
                r.final_group_min, r.live, r.final_disagreement, r.initial_loss, r.final_loss);
    std::printf("%.1f virtual s in %.1f wall s; trace %016llx\n", r.virtual_seconds, r.wall_seconds,
                static_cast<unsigned long long>(r.trace_hash));
    for (const auto& f : r.failures)
        std::printf("FAILED: %s\n", f.c_str());
    if (!o.json_path.empty()) std::ofstream(o.json_path) << to_json(o, r).dump(2) << "\n";
    const bool ok = r.finished && r.failures.empty() && r.final_group_min == r.live;
    return ok ? 0 : 1;
}
