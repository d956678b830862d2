// Moshpit averaging on the simulated network (issue 5, "Sim transport"). N peers, each with
// an RPC node and the real butterfly all-reduce (averaging::allreduce_service over
// net::sim: links of 10 ms, unlimited bandwidth, virtual clock, deterministic by seed),
// average float32 vectors round after round in groups chosen by one of three strategies:
//   moshpit    groups = peers sharing a Moshpit group key (averaging/group_key.hpp), keys of
//              log2(N/g) bits starting as a grid (peer i under key i mod N/g), rotated with
//              the group id after every round;
//   random     a fresh seeded random partition into groups of g every round;
//   allreduce  one group of all N peers every round.
// After each round it measures the variance across peers (the mean over elements of the
// population variance across all N peers) and reports the rounds until it falls below the
// threshold (1e-9), as a table and, with --json FILE, as JSON with every trajectory.
// Between rounds the peers idle for --gap virtual seconds (default 130, over twice the RPC
// idle timeout), so connections close and memory holds one round's connections at most.
//
// Failure model. Every round, after the groups are formed and before the all-reduce, every
// peer independently crashes with probability p (its simulated node crashes: listener and
// connections close, dials to it time out). Its group runs without it under the real
// failure semantics: the others drop it as a sender after sender_timeout and give up on it
// as a reducer, so its span stays at each member's local values; it keeps its own values.
// After the round it restarts with the same identity and listens at the same endpoint. A
// Moshpit peer that crashed still rotates its key with the group it was given. The crash
// draws come from a generator seeded by (seed, N), so every strategy sees the same crashes.
//
// Checks (exit status 1 when one fails): every all-reduce of a peer that was up completes
// in time and without error; with p = 0 every element is averaged (fraction 1) and every
// strategy reaches the threshold, Moshpit with N = g^d in exactly d rounds; at every p the
// global mean stays where it started (averaging a subset keeps its sum; a crashed peer
// keeps its values), within float rounding.
//
// Cost. Every peer of a group dials every other (both ends at once, so N(g - 1)
// connections per round), at about 0.8 ms of CPU and 60 KB of heap each on this stack; a
// configuration over --max-connections per round is skipped and says so (plain all-reduce
// of 1024 peers: 1,047,552 connections).
#include "averaging/moshpit_swarm.hpp"
#include "program.hpp"
#include "statistics.hpp"

#include <hivemesh/averaging/allreduce.hpp>
#include <hivemesh/averaging/group_key.hpp>
#include <hivemesh/core/log.hpp>
#include <hivemesh/core/random.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <istream>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace {

using namespace hivemesh;
using hivemesh::bench::median;
using hivemesh::test::moshpit_swarm;
using hivemesh::test::peer_groups;

enum class strategy { moshpit, random, allreduce };

const char* to_string(strategy s) {
    switch (s) {
    case strategy::moshpit:
        return "moshpit";
    case strategy::random:
        return "random";
    case strategy::allreduce:
        return "allreduce";
    }
    return "?";
}

struct swarm_size {
    std::size_t peers = 0;
    std::size_t group = 0;
};

struct options {
    std::vector<swarm_size> sizes{{256, 16}, {1024, 32}};
    std::vector<double> failure_rates{0, 0.001, 0.005, 0.01};
    std::vector<strategy> strategies{strategy::moshpit, strategy::random, strategy::allreduce};
    std::size_t elements = 4096;
    std::uint64_t seed = 1;
    std::size_t seeds = 3;
    std::size_t max_rounds = 50;
    double threshold = 1e-9;
    double gap_seconds = 130;
    std::size_t max_connections = 300'000;
    bool plaintext = false;
    bool verbose = false;
    std::string json_path;
};

/// "N:G", as --sizes lists them.
std::istream& operator>>(std::istream& in, swarm_size& s) {
    char colon = 0;
    if (in >> s.peers >> colon && colon != ':') in.setstate(std::ios::failbit);
    return in >> s.group;
}

bool is_power_of_two(std::size_t v) {
    return v != 0 && (v & (v - 1)) == 0;
}

options parse(int argc, char** argv) {
    CLI::App app{"Moshpit averaging on the simulated network: rounds until the variance across "
                 "peers falls below the threshold, for Moshpit, random and all-N groups under "
                 "per-round crashes.",
                 "bench_moshpit_sim"};
    app.option_defaults()->always_capture_default();
    options o;
    bool quick = false;
    std::vector<std::string> strategies{"moshpit", "random", "allreduce"};
    app.add_flag("--quick", quick,
                 "16:4, rates 0 and 0.05, 1024 elements, 1 seed (flags given explicitly win)");
    auto* sizes = app.add_option("--sizes", o.sizes,
                                 "swarms of N peers in groups of G; N/G must be a power of two "
                                 "(the Moshpit key has log2(N/G) bits)")
                      ->type_name("N:G")
                      ->delimiter(',')
                      ->default_str("256:16,1024:32");
    auto* rates = app.add_option("--failure-rates", o.failure_rates,
                                 "per-round crash probabilities of every peer, each in [0, 1)")
                      ->delimiter(',')
                      ->check(program::non_negative);
    app.add_option("--strategies", strategies, "how groups are chosen")
        ->delimiter(',')
        ->check(CLI::IsMember({"moshpit", "random", "allreduce"}));
    auto* elements =
        app.add_option("--elements", o.elements, "float32 per peer")->check(program::positive);
    app.add_option("--seed", o.seed, "the first seed")->check(program::non_negative);
    auto* seeds = app.add_option("--seeds", o.seeds, "seeds S..S+K-1, the median reported")
                      ->check(program::positive);
    app.add_option("--max-rounds", o.max_rounds, "rounds before giving up")
        ->check(program::positive);
    app.add_option("--threshold", o.threshold, "the variance across peers to reach")
        ->check(program::positive);
    app.add_option("--gap", o.gap_seconds,
                   "virtual seconds between rounds (over twice the RPC idle timeout, so "
                   "connections close and memory stays at one round's connections)")
        ->check(program::non_negative);
    app.add_option("--max-connections", o.max_connections,
                   "skip a configuration whose round opens more connections than this (N x "
                   "(group - 1); at ~68 KB each)")
        ->check(program::positive);
    app.add_flag("--plaintext", o.plaintext,
                 "authenticated but unencrypted sessions (less CPU, same virtual time)");
    app.add_flag("--verbose", o.verbose,
                 "print the library's warnings (a crashed peer causes many)");
    app.add_option("--json", o.json_path, "also write every trajectory as JSON to FILE")
        ->type_name("FILE");
    try {
        app.parse(argc, argv);
        if (quick) { // small enough for a sanitizer build; p = 0.05 so that 16 peers do crash
            if (!sizes->count()) o.sizes = {{16, 4}};
            if (!rates->count()) o.failure_rates = {0, 0.05};
            if (!elements->count()) o.elements = 1024;
            if (!seeds->count()) o.seeds = 1;
        }
        for (const auto& s : o.sizes)
            if (s.group < 2 || s.peers % s.group != 0 || !is_power_of_two(s.peers / s.group))
                throw CLI::ValidationError("--sizes", "N:G needs G >= 2 and N/G a power of two: " +
                                                          std::to_string(s.peers) + ":" +
                                                          std::to_string(s.group));
        for (const double p : o.failure_rates)
            if (p >= 1) throw CLI::ValidationError("--failure-rates", "rate not in [0, 1)");
        o.strategies.clear();
        for (const auto& name : strategies)
            for (const auto s : {strategy::moshpit, strategy::random, strategy::allreduce})
                if (name == to_string(s)) o.strategies.push_back(s);
    } catch (const CLI::ParseError& e) {
        program::exit_after(app, e);
    }
    return o;
}

/// One swarm run until the threshold or the cap.
struct run_record {
    swarm_size size;
    strategy how = strategy::moshpit;
    double rate = 0;
    std::uint64_t seed = 0;
    std::optional<std::size_t> rounds; ///< until variance < threshold; nullopt: not reached
    std::vector<double> variance;      ///< before round 1, then after each round
    std::vector<double> virtual_seconds;
    std::vector<double> wall_seconds;
    std::vector<double> cpu_seconds;
    std::vector<std::size_t> crashed;
    std::vector<double> min_fraction;
    double setup_wall_seconds = 0;
    double total_wall_seconds = 0; ///< set-up, rounds and the gaps between them
    double mean_drift = 0;         ///< largest |final mean - initial mean| over elements
    net::sim::network_statistics network;
    std::vector<std::string> failures;
};

/// d with peers = group^d, if there is one (then Moshpit is exact after d rounds).
std::optional<std::size_t> exact_depth(const swarm_size& s) {
    std::size_t n = 1;
    for (std::size_t d = 1; d < 64; ++d) {
        n *= s.group;
        if (n == s.peers) return d;
        if (n > s.peers) break;
    }
    return std::nullopt;
}

double seconds(duration d) {
    return std::chrono::duration<double>(d).count();
}

/// This process's CPU time: on a shared machine it says more than wall time.
double cpu_now() {
    return static_cast<double>(std::clock()) / CLOCKS_PER_SEC;
}

run_record run_one(const options& o, const swarm_size& size, strategy how, double rate,
                   std::uint64_t seed) {
    using wall_clock = std::chrono::steady_clock;
    run_record rec;
    rec.size = size;
    rec.how = how;
    rec.rate = rate;
    rec.seed = seed;

    const auto setup_start = wall_clock::now();
    averaging::allreduce_options allreduce;
    allreduce.part_size_bytes = 64 << 10; // a few thousand floats: one part per span
    net::node_options rpc;
    rpc.security.plaintext = o.plaintext;
    moshpit_swarm swarm(size.peers, o.elements, seed, allreduce, rpc);
    const std::size_t groups = size.peers / size.group;
    if (how == strategy::moshpit) {
        std::size_t bits = 0;
        while ((std::size_t{1} << bits) < groups)
            ++bits;
        for (std::size_t i = 0; i < size.peers; ++i) // a grid: g peers under each key
            swarm.peers[i].bits = averaging::group_bits(i % groups, bits);
    }
    // Crashes depend on (seed, N) only, so all strategies see the same ones.
    random_generator crash_rng(seed * 0x9E3779B97F4A7C15ULL + size.peers);
    random_generator group_rng(seed * 0xD1B54A32D192ED03ULL + size.peers);
    const auto gap =
        std::chrono::duration_cast<duration>(std::chrono::duration<double>(o.gap_seconds));
    const auto initial_mean = swarm.global_mean();
    rec.variance.push_back(swarm.variance());
    rec.setup_wall_seconds = std::chrono::duration<double>(wall_clock::now() - setup_start).count();

    for (std::size_t round = 0; round < o.max_rounds; ++round) {
        peer_groups members;
        switch (how) {
        case strategy::moshpit:
            members = swarm.key_groups();
            break;
        case strategy::random:
            members = test::random_partition(size.peers, size.group, group_rng);
            break;
        case strategy::allreduce:
            members.emplace_back(size.peers);
            for (std::size_t i = 0; i < size.peers; ++i)
                members.front()[i] = i;
            break;
        }
        std::vector<std::size_t> down;
        for (std::size_t i = 0; i < size.peers; ++i)
            if (crash_rng.uniform_real() < rate) down.push_back(i);
        for (const auto i : down)
            swarm.crash(i);

        const auto wall_start = wall_clock::now();
        const double cpu_start = cpu_now();
        const auto report = swarm.average(members, round);
        rec.cpu_seconds.push_back(cpu_now() - cpu_start);
        rec.wall_seconds.push_back(
            std::chrono::duration<double>(wall_clock::now() - wall_start).count());
        rec.virtual_seconds.push_back(seconds(report.elapsed));
        rec.crashed.push_back(down.size());
        rec.min_fraction.push_back(report.min_fraction);

        const std::string where = "round " + std::to_string(round + 1) + ": ";
        if (!report.finished) rec.failures.push_back(where + "an all-reduce did not complete");
        if (report.errors > 0)
            rec.failures.push_back(where + std::to_string(report.errors) +
                                   " all-reduces ended with an error");
        if (down.empty() && report.min_fraction != 1.0)
            rec.failures.push_back(where + "no crash, yet a peer averaged only " +
                                   std::to_string(report.min_fraction) + " of its vector");
        if (!rec.failures.empty()) break;

        if (how == strategy::moshpit) swarm.rotate(members, report.ids);
        for (const auto i : down)
            swarm.restart(i);
        // Time between averaging rounds (a trainer computing): idle connections close.
        swarm.world.network.time().run_for(gap);
        rec.variance.push_back(swarm.variance());
        if (rec.variance.back() < o.threshold) {
            rec.rounds = round + 1;
            break;
        }
    }

    rec.network = swarm.world.network.statistics();
    rec.total_wall_seconds = std::chrono::duration<double>(wall_clock::now() - setup_start).count();
    const auto final_mean = swarm.global_mean();
    for (std::size_t e = 0; e < final_mean.size(); ++e)
        rec.mean_drift = std::max(rec.mean_drift, std::abs(final_mean[e] - initial_mean[e]));
    if (rec.mean_drift > 1e-5) rec.failures.push_back("the global mean moved");
    if (rate == 0 && rec.failures.empty()) {
        if (!rec.rounds) rec.failures.push_back("p = 0 and the threshold was not reached");
        const auto depth = exact_depth(size);
        if (how == strategy::moshpit && depth && rec.rounds && *rec.rounds != *depth)
            rec.failures.push_back("p = 0, N = g^" + std::to_string(*depth) +
                                   ", yet Moshpit took " + std::to_string(*rec.rounds) + " rounds");
    }
    return rec;
}

// ---- summaries ---------------------------------------------------------------------------

double sum(const std::vector<double>& v) {
    double total = 0;
    for (const double x : v)
        total += x;
    return total;
}

/// The runs of one (size, strategy, rate) over the seeds.
struct summary {
    swarm_size size;
    strategy how = strategy::moshpit;
    double rate = 0;
    double median_rounds = 0; ///< infinity when the median run did not reach the threshold
    std::string per_seed;     ///< rounds of every seed, "-" for not reached
    double virtual_per_round = 0;
    double wall_per_round = 0;
    double cpu_per_round = 0;
    double wall_total = 0; ///< everything, all seeds
    std::string skipped;   ///< why it did not run, if it did not
    double crashes_per_round = 0;
    double final_variance = 0; ///< median over seeds
    bool ok = true;
};

summary summarize(const std::vector<const run_record*>& runs) {
    summary s;
    s.size = runs.front()->size;
    s.how = runs.front()->how;
    s.rate = runs.front()->rate;
    std::vector<double> rounds, virtual_time, wall_time, cpu_time, crashes, finals;
    for (const auto* r : runs) {
        rounds.push_back(r->rounds ? static_cast<double>(*r->rounds)
                                   : std::numeric_limits<double>::infinity());
        if (!s.per_seed.empty()) s.per_seed += ",";
        s.per_seed += r->rounds ? std::to_string(*r->rounds) : "-";
        for (const double v : r->virtual_seconds)
            virtual_time.push_back(v);
        for (const double w : r->wall_seconds)
            wall_time.push_back(w);
        for (const double c : r->cpu_seconds)
            cpu_time.push_back(c);
        for (const auto c : r->crashed)
            crashes.push_back(static_cast<double>(c));
        finals.push_back(r->variance.back());
        s.wall_total += r->total_wall_seconds;
        s.ok = s.ok && r->failures.empty();
    }
    s.median_rounds = median(rounds);
    s.virtual_per_round = median(virtual_time);
    s.wall_per_round = median(wall_time);
    s.cpu_per_round = median(cpu_time);
    s.crashes_per_round = crashes.empty() ? 0 : sum(crashes) / static_cast<double>(crashes.size());
    s.final_variance = median(finals);
    return s;
}

std::string rounds_text(double r) {
    if (std::isinf(r)) return "not reached";
    return program::format(r == std::floor(r) ? "%.0f" : "%.1f", r);
}

const char* const failure_model =
    "every round, after the groups are formed and before the all-reduce, each peer crashes "
    "independently with probability p (its sim node crashes); its group averages without it "
    "(its span stays local for the others, it keeps its own values); it restarts with the "
    "same identity before the next round and, under moshpit, rotates its key with the group "
    "it was given";

void write_json(const options& o, const std::vector<run_record>& runs,
                const std::vector<summary>& summaries, const std::string& path) {
    nlohmann::ordered_json report = {
        {"benchmark", "moshpit_sim"},
        {"elements", o.elements},
        {"threshold", o.threshold},
        {"max_rounds", o.max_rounds},
        {"first_seed", o.seed},
        {"gap_seconds", o.gap_seconds},
        {"max_connections", o.max_connections},
        {"seeds", o.seeds},
        {"security", o.plaintext ? "plaintext" : "encrypted"},
        {"failure_model", failure_model},
        {"variance", "mean over elements of the population variance across all peers"},
        {"summary", nlohmann::ordered_json::array()},
        {"runs", nlohmann::ordered_json::array()}};
    for (const auto& s : summaries) {
        nlohmann::ordered_json j = {{"peers", s.size.peers},
                                    {"group_size", s.size.group},
                                    {"strategy", to_string(s.how)},
                                    {"failure_rate", s.rate},
                                    {"median_rounds", s.median_rounds},
                                    {"virtual_seconds_per_round", s.virtual_per_round},
                                    {"wall_seconds_per_round", s.wall_per_round},
                                    {"cpu_seconds_per_round", s.cpu_per_round},
                                    {"wall_seconds_total", s.wall_total},
                                    {"crashes_per_round", s.crashes_per_round},
                                    {"final_variance", s.final_variance},
                                    {"ok", s.ok}};
        if (!s.skipped.empty()) j["skipped"] = s.skipped;
        report["summary"].push_back(std::move(j));
    }
    for (const auto& r : runs)
        report["runs"].push_back(
            {{"peers", r.size.peers},
             {"group_size", r.size.group},
             {"strategy", to_string(r.how)},
             {"failure_rate", r.rate},
             {"seed", r.seed},
             {"rounds_to_threshold", r.rounds ? nlohmann::ordered_json(*r.rounds) : nullptr},
             {"variance", r.variance},
             {"virtual_seconds", r.virtual_seconds},
             {"wall_seconds", r.wall_seconds},
             {"cpu_seconds", r.cpu_seconds},
             {"crashed", r.crashed},
             {"min_fraction_averaged", r.min_fraction},
             {"setup_wall_seconds", r.setup_wall_seconds},
             {"total_wall_seconds", r.total_wall_seconds},
             {"mean_drift", r.mean_drift},
             {"connections_established", r.network.connections_established},
             {"connections_refused", r.network.connections_refused},
             {"connect_timeouts", r.network.connect_timeouts},
             {"resets", r.network.resets},
             {"failures", r.failures}});
    program::write_json(path, report);
}

/// Library warnings so far (a crashed reducer or sender is dropped quietly; other faults warn).
std::atomic<std::uint64_t> library_warnings{0};

int run(const options& o) {
    log::set_sink(
        [verbose = o.verbose](log::level l, std::string_view component, std::string_view message) {
            if (l == log::level::warning) ++library_warnings;
            if (l >= log::level::error || verbose)
                std::fprintf(stderr, "[hivemesh %s] %.*s: %.*s\n", log::to_string(l),
                             static_cast<int>(component.size()), component.data(),
                             static_cast<int>(message.size()), message.data());
        });
    std::vector<run_record> runs;
    std::vector<summary> summaries;
    bool any_failure = false;
    std::fprintf(stderr,
                 "bench_moshpit_sim: %zu float32 per peer, threshold %g, at most %zu rounds, "
                 "%zu seed(s) from %llu\n",
                 o.elements, o.threshold, o.max_rounds, o.seeds,
                 static_cast<unsigned long long>(o.seed));
    for (const auto& size : o.sizes)
        for (const auto how : o.strategies)
            for (const double rate : o.failure_rates) {
                const std::size_t per_group = how == strategy::allreduce ? size.peers : size.group;
                const std::size_t connections = size.peers * (per_group - 1);
                if (connections > o.max_connections) {
                    summary skip;
                    skip.size = size;
                    skip.how = how;
                    skip.rate = rate;
                    skip.median_rounds = std::numeric_limits<double>::quiet_NaN();
                    skip.skipped = "a round opens " + std::to_string(connections) +
                                   " connections (about 60 KB each), over --max-connections " +
                                   std::to_string(o.max_connections);
                    std::fprintf(stderr, "  N=%zu g=%zu %-9s p=%-6g skipped: %s\n", size.peers,
                                 size.group, to_string(how), rate, skip.skipped.c_str());
                    summaries.push_back(std::move(skip));
                    continue;
                }
                std::vector<std::size_t> indices;
                for (std::size_t k = 0; k < o.seeds; ++k) {
                    const auto seed = o.seed + k;
                    std::fprintf(stderr, "  N=%zu g=%zu %-9s p=%-6g seed %llu ... ", size.peers,
                                 size.group, to_string(how), rate,
                                 static_cast<unsigned long long>(seed));
                    runs.push_back(run_one(o, size, how, rate, seed));
                    const auto& r = runs.back();
                    std::fprintf(stderr,
                                 "%s rounds, variance %.3g, wall %.1f s (connections %llu, "
                                 "refused %llu, connect timeouts %llu, resets %llu)\n",
                                 r.rounds ? std::to_string(*r.rounds).c_str() : "not reached",
                                 r.variance.back(), r.total_wall_seconds,
                                 static_cast<unsigned long long>(r.network.connections_established),
                                 static_cast<unsigned long long>(r.network.connections_refused),
                                 static_cast<unsigned long long>(r.network.connect_timeouts),
                                 static_cast<unsigned long long>(r.network.resets));
                    for (const auto& f : r.failures)
                        std::fprintf(stderr, "    FAILED: %s\n", f.c_str());
                    any_failure = any_failure || !r.failures.empty();
                    indices.push_back(runs.size() - 1);
                }
                std::vector<const run_record*> group;
                for (const auto i : indices)
                    group.push_back(&runs[i]);
                summaries.push_back(summarize(group));
            }

    std::printf("\nMoshpit averaging on the simulated network (real butterfly all-reduce, %s "
                "sessions, links of 10 ms, unlimited bandwidth): rounds until the variance "
                "across peers < %g; %zu float32 per peer from normal(0, 1); median of %zu "
                "seed(s) from %llu; at most %zu rounds, %g virtual s between rounds.\n",
                o.plaintext ? "plaintext" : "encrypted", o.threshold, o.elements, o.seeds,
                static_cast<unsigned long long>(o.seed), o.max_rounds, o.gap_seconds);
    std::printf("Failure model: %s.\n\n", failure_model);
    std::printf("%-12s %-10s", "peers/group", "strategy");
    for (const double rate : o.failure_rates)
        std::printf(" | p=%-11g", rate);
    std::printf("\n");
    std::size_t at = 0;
    for (const auto& size : o.sizes)
        for (const auto how : o.strategies) {
            const std::string label = std::to_string(size.peers) + "/" + std::to_string(size.group);
            std::printf("%-12s %-10s", label.c_str(), to_string(how));
            for (std::size_t k = 0; k < o.failure_rates.size(); ++k, ++at) {
                const auto& s = summaries[at];
                const std::string cell = !s.skipped.empty() ? "skipped"
                                         : s.ok             ? rounds_text(s.median_rounds)
                                                            : "FAILED";
                std::printf(" | %-13s", cell.c_str());
            }
            std::printf("\n");
        }

    std::printf("\n%-11s %-9s %-6s %-11s %-9s %-9s %-10s %-10s %-10s %-8s %s\n", "peers/group",
                "strategy", "p", "rounds", "per seed", "crash/rnd", "virt s/rnd", "cpu s/rnd",
                "wall s/rnd", "wall s", "final var");
    for (const auto& s : summaries) {
        const std::string label = std::to_string(s.size.peers) + "/" + std::to_string(s.size.group);
        if (!s.skipped.empty()) {
            std::printf("%-11s %-9s %-6g skipped: %s\n", label.c_str(), to_string(s.how), s.rate,
                        s.skipped.c_str());
            continue;
        }
        std::printf("%-11s %-9s %-6g %-11s %-9s %-9.2f %-10.3f %-10.3f %-10.3f %-8.1f %.2g%s\n",
                    label.c_str(), to_string(s.how), s.rate, rounds_text(s.median_rounds).c_str(),
                    s.per_seed.c_str(), s.crashes_per_round, s.virtual_per_round, s.cpu_per_round,
                    s.wall_per_round, s.wall_total, s.final_variance, s.ok ? "" : "  FAILED");
    }
    std::printf("\nrounds: median over seeds (\"-\" in per seed: not reached); crash/rnd: peers "
                "crashed per round (mean); virt s/rnd: median virtual seconds from the start of a "
                "round to its last completion; cpu s/rnd, wall s/rnd: median process CPU and wall "
                "seconds per round; wall s: all seeds, set-up and gaps included; final var: "
                "median over seeds.\n");
    std::printf("Library warnings (--verbose prints them): %llu\n",
                static_cast<unsigned long long>(library_warnings.load()));
    std::printf("Checks: %s\n", any_failure ? "FAILED (see above)" : "all passed");

    if (!o.json_path.empty()) write_json(o, runs, summaries, o.json_path);
    return any_failure ? 1 : 0;
}

} // namespace

int main(int argc, char** argv) {
    const auto o = parse(argc, argv);
    try {
        return run(o);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_moshpit_sim: %s\n", e.what());
        return 1;
    }
}
