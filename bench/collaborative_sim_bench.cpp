// The collaborative optimizer on a simulated swarm (issue 19): N peers (hivemesh::basic_peer on
// one net::sim network: links of 10 ms, unlimited bandwidth, virtual clock, deterministic by
// seed) train one raw model in gradient mode for a number of epochs, each peer at its own
// speed, and the program measures what the swarm loses and how long an epoch takes to end.
//
// Workload. Peer i computes a batch of --batch samples every interval_i, the intervals spread
// geometrically from --min-interval to --max-interval (defaults 100 ms and 1 s: a 10x spread of
// samples/s), then calls async_step() and waits for it. Its model is one parameter of
// --elements floats with the quadratic loss ½‖w − c_i‖² (gradient w − c_i, a target of its own),
// the local optimizer plain SGD. Every peer's averager asks for one group of all N peers
// (averaging.target_group_size = N, no Moshpit key): a round averages the whole swarm.
// The swarm runs twice from the same seed: with matchmaking scheduled ahead of the estimated
// end of the epoch (schedule_ahead, the default), and with matchmaking started only when the
// epoch ended.
//
// Figures, per configuration:
//   lost      samples computed but in no averaged gradient: statistics().samples_discarded
//             (batches dropped by a state download) plus samples_contributed of the epoch ends
//             whose gradient round failed or ran alone, over all samples computed; samples
//             in partial rounds are counted apart (partly averaged).
//   latency   per epoch e, from the moment the swarm reached the target (the virtual time of
//             the step at which the sum of the samples reported in e, steps in time order,
//             reached target_batch_size) to the end of the round (the latest completion of a
//             step that ended e); median and max over the epochs.
//   overshoot samples contributed per epoch over target_batch_size (mean).
// Also the mean group size and outcomes of the gradient rounds, the waiting for a group
// (statistics().waiting_for_group per peer and epoch) and the virtual and wall time.
//
// Cost. With 64 peers most of the CPU goes to checking the Ed25519 signatures of progress
// records: every tracker read is a DHT lookup (get latest) whose every answering node sends
// the whole dictionary of N records, each verified again. So the trackers read at most every
// 2 s (min_refresh; the library's default is 0.5 s) and the DHT caches no value on get
// (cache_on_get, by default on), which keeps the answering nodes to the replicas: 64 peers
// over 5 epochs then take 2.5 minutes for both schedules instead of 24 (2 shared cores).
// With the library's defaults (seed 1) the schedule ahead comes out the same, per epoch:
// samples lost, overshoot, latencies, group sizes, and 0.00 + 0.68 s per peer and epoch
// waiting for the group and averaging.
//
// Checks (exit status 1 when one fails): every step completes without an error, every peer
// reaches the last epoch within the virtual time limit, and every sample computed is either
// contributed at an epoch end or discarded.
#include "program.hpp"
#include "statistics.hpp"
#include "support/sim_peers.hpp"

#include <hivemesh/core/log.hpp>
#include <hivemesh/net/sim.hpp>
#include <hivemesh/optim/collaborative.hpp>
#include <hivemesh/optim/sgd.hpp>
#include <hivemesh/peer.hpp>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/this_coro.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace {

using namespace hivemesh;
using namespace std::chrono_literals;
using hivemesh::bench::median;
using sim_optimizer = optim::collaborative_optimizer<net::sim::transport>;

struct options {
    std::size_t peers = 64;
    std::uint64_t target = 4096;
    std::uint64_t epochs = 5;
    std::uint64_t batch = 2;
    double min_interval = 0.1; ///< seconds
    double max_interval = 1.0;
    std::size_t elements = 4096;
    double matchmaking_time = 5;
    double averaging_timeout = 60;
    std::uint64_t average_state_every = 1;
    double max_virtual = 1800; ///< seconds per run
    // Two settings that cost much CPU here and change none of the figures (see the file
    // comment): the library's defaults are true and 0.5 s.
    bool cache_on_get = false; ///< dht::node_options::cache_on_get
    double min_refresh = 2;    ///< progress::tracker_options::min_refresh, seconds
    std::size_t dht_k = 20;    ///< dht::routing_options::k
    std::uint64_t seed = 1;
    std::vector<bool> schedules{true, false};
    bool verbose = false;
    std::string json_path;
};

options parse(int argc, char** argv) {
    CLI::App app{"The collaborative optimizer on a simulated swarm: N peers of uneven speed train "
                 "in gradient mode for some epochs, with matchmaking scheduled ahead and not; "
                 "samples lost and the latency of each epoch's end.",
                 "bench_collaborative_sim"};
    app.option_defaults()->always_capture_default();
    app.footer("--min-refresh and --cache-on-get differ from the library's defaults (0.5 s and "
               "on) only to save CPU here: the figures stay the same (see the file comment).");
    options o;
    bool quick = false;
    std::vector<std::string> schedules{"ahead", "at-end"};
    const auto add_count = [&](const std::string& name, auto& value, const std::string& help) {
        return app.add_option(name, value, help)->check(program::positive);
    };
    const auto add_seconds = [&](const std::string& name, double& value, const std::string& help) {
        return app.add_option(name, value, help + " (seconds)")->check(program::positive);
    };
    app.add_flag("--quick", quick,
                 "8 peers, target 256, 2 epochs, 1024 elements (flags given explicitly win)");
    // sim_peers' identities are identity_of(1..255).
    auto* peers =
        app.add_option("--peers", o.peers, "peers, all in one group")->check(CLI::Range(2, 255));
    auto* target = add_count("--target", o.target, "target_batch_size: samples per epoch");
    auto* epochs = add_count("--epochs", o.epochs, "epochs to train");
    add_count("--batch", o.batch, "samples per step of every peer");
    add_seconds("--min-interval", o.min_interval,
                "time between the fastest peer's batches; the others' spread geometrically "
                "up to --max-interval");
    add_seconds("--max-interval", o.max_interval, "time between the slowest peer's batches");
    auto* elements = add_count("--elements", o.elements, "float32 in the model");
    add_seconds("--matchmaking-time", o.matchmaking_time, "matchmaking_time");
    add_seconds("--averaging-timeout", o.averaging_timeout, "averaging_timeout");
    app.add_option("--average-state-every", o.average_state_every,
                   "average_state_every: epochs between state rounds, 0 for none")
        ->check(program::non_negative);
    app.add_option("--schedule", schedules,
                   "matchmaking before the estimated end of the epoch (ahead), or at it")
        ->delimiter(',')
        ->check(CLI::IsMember({"ahead", "at-end"}));
    add_seconds("--min-refresh", o.min_refresh, "the trackers' least time between reads");
    app.add_flag("--cache-on-get", o.cache_on_get, "cache DHT values on get");
    add_count("--dht-k", o.dht_k, "the DHT's k");
    add_seconds("--max-virtual", o.max_virtual, "virtual time a run may take");
    app.add_option("--seed", o.seed, "the swarm's seed")->check(program::non_negative);
    app.add_flag("--verbose", o.verbose, "print the library's warnings (failed rounds warn)");
    app.add_option("--json", o.json_path, "also write the runs as JSON to FILE")->type_name("FILE");
    try {
        app.parse(argc, argv);
        if (quick) {
            if (!peers->count()) o.peers = 8;
            if (!target->count()) o.target = 256;
            if (!epochs->count()) o.epochs = 2;
            if (!elements->count()) o.elements = 1024;
        }
        if (o.max_interval < o.min_interval)
            throw CLI::ValidationError("--max-interval", "must be at least --min-interval");
        o.schedules.clear();
        for (const auto& name : schedules)
            o.schedules.push_back(name == "ahead");
    } catch (const CLI::ParseError& e) {
        program::exit_after(app, e);
    }
    return o;
}

const char* schedule_name(bool ahead) {
    return ahead ? "ahead" : "at-end";
}

double seconds(duration d) {
    return std::chrono::duration<double>(d).count();
}

duration from_seconds(double s) {
    return std::chrono::duration_cast<duration>(std::chrono::duration<double>(s));
}

/// One peer's model: one parameter with the loss ½‖w − c‖², c its own.
struct quadratic_model {
    quadratic_model(std::size_t elements, std::size_t peer)
        : value(elements, 0.0f)
        , grad(elements, 0.0f)
        , target(elements) {
        for (std::size_t j = 0; j < elements; ++j)
            target[j] = static_cast<float>(peer + 1) * std::sin(0.01f * static_cast<float>(j));
    }
    void compute_gradient() {
        for (std::size_t j = 0; j < value.size(); ++j)
            grad[j] = value[j] - target[j];
    }
    std::vector<float> value, grad, target;
};

/// One step as the trainer saw it.
struct step_record {
    std::size_t peer = 0;
    std::uint64_t epoch = 0; ///< the local epoch when the step began
    std::uint64_t samples = 0;
    time_point started{}, finished{};
    bool epoch_ended = false;
    bool state_loaded = false;
    optim::round_report averaging;
    std::uint64_t samples_contributed = 0;
};

struct trainer {
    trainer(std::size_t elements, std::size_t peer)
        : model(elements, peer) {}
    std::unique_ptr<sim_optimizer> optimizer;
    quadratic_model model;
    duration interval{};
    bool running = false;
};

struct run_state {
    std::uint64_t epochs = 0;
    std::vector<step_record> steps;
    std::vector<std::string> failures;
};

asio::awaitable<void> train(run_state* run, trainer* t, std::size_t peer, std::uint64_t batch) {
    auto executor = co_await asio::this_coro::executor;
    net::sim::timer timer(executor);
    while (t->optimizer->local_epoch() < run->epochs) {
        timer.expires_after(t->interval);
        co_await timer.async_wait(default_token_t{});
        t->model.compute_gradient();
        step_record r;
        r.peer = peer;
        r.epoch = t->optimizer->local_epoch();
        r.samples = batch;
        r.started = net::transport_now<net::sim::transport>(executor);
        auto [ec, report] = co_await t->optimizer->async_step(0, default_token_t{});
        r.finished = net::transport_now<net::sim::transport>(executor);
        if (ec) {
            run->failures.push_back("peer " + std::to_string(peer) +
                                    ": a step failed: " + ec.message());
            break;
        }
        r.epoch_ended = report.epoch_ended;
        r.state_loaded = report.state_loaded;
        r.averaging = report.averaging;
        r.samples_contributed = report.samples_contributed;
        run->steps.push_back(r);
    }
    t->running = false;
}

/// One epoch of one run.
struct epoch_record {
    std::uint64_t epoch = 0;
    std::optional<double> target_reached; ///< virtual seconds since the trainers started
    std::optional<double> round_ended;
    std::size_t peers_ended = 0; ///< peers whose step ended this epoch
    std::uint64_t samples_contributed = 0;
    double mean_group_size = 0;
    std::map<std::string, std::size_t> outcomes; ///< of the gradient rounds
    double latency() const {
        return target_reached && round_ended ? *round_ended - *target_reached
                                             : std::numeric_limits<double>::quiet_NaN();
    }
};

struct run_record {
    bool schedule_ahead = true;
    std::vector<epoch_record> epochs;
    std::uint64_t samples = 0;
    std::uint64_t samples_discarded = 0;
    std::uint64_t samples_in_failed_rounds = 0; ///< failed or alone
    std::uint64_t samples_in_partial_rounds = 0;
    std::uint64_t samples_contributed = 0;
    optim::optimizer_statistics totals; ///< summed over the peers
    double mean_waiting_for_group = 0;  ///< seconds per peer and epoch
    double mean_averaging = 0;          ///< seconds per peer and epoch
    std::size_t steps = 0;
    double virtual_seconds = 0;
    double setup_wall_seconds = 0;
    double wall_seconds = 0;
    std::vector<std::string> failures;

    double lost_fraction() const {
        return samples == 0 ? 0
                            : static_cast<double>(samples_discarded + samples_in_failed_rounds) /
                                  static_cast<double>(samples);
    }
    std::vector<double> latencies() const {
        std::vector<double> out;
        for (const auto& e : epochs)
            if (!std::isnan(e.latency())) out.push_back(e.latency());
        return out;
    }
};

optim::optimizer_statistics& operator+=(optim::optimizer_statistics& a,
                                        const optim::optimizer_statistics& b) {
    a.steps += b.steps;
    a.epochs += b.epochs;
    a.samples += b.samples;
    a.samples_discarded += b.samples_discarded;
    a.rounds_averaged += b.rounds_averaged;
    a.rounds_partial += b.rounds_partial;
    a.rounds_failed += b.rounds_failed;
    a.rounds_alone += b.rounds_alone;
    a.state_loads += b.state_loads;
    a.state_load_failures += b.state_load_failures;
    a.members_excluded += b.members_excluded;
    a.parts_refused += b.parts_refused;
    a.accumulating += b.accumulating;
    a.waiting_for_group += b.waiting_for_group;
    a.averaging += b.averaging;
    a.optimizer_step += b.optimizer_step;
    a.state_download += b.state_download;
    a.bytes_sent += b.bytes_sent;
    a.bytes_received += b.bytes_received;
    a.state_bytes_downloaded += b.state_bytes_downloaded;
    return a;
}

/// The epochs' figures from the steps (see the file comment).
std::vector<epoch_record> epochs_of(const options& o, std::vector<step_record> steps,
                                    time_point start) {
    std::stable_sort(steps.begin(), steps.end(), [](const step_record& a, const step_record& b) {
        return a.started < b.started;
    });
    std::vector<epoch_record> out(o.epochs);
    std::vector<std::uint64_t> reported(o.epochs, 0);
    std::vector<double> group_sizes(o.epochs, 0);
    for (const auto& s : steps) {
        if (s.epoch >= o.epochs) continue;
        auto& e = out[s.epoch];
        if (!s.state_loaded) {
            reported[s.epoch] += s.samples;
            if (!e.target_reached && reported[s.epoch] >= o.target)
                e.target_reached = seconds(s.started - start);
        }
        if (s.epoch_ended) {
            const double ended = seconds(s.finished - start);
            e.round_ended = std::max(e.round_ended.value_or(ended), ended);
            ++e.peers_ended;
            e.samples_contributed += s.samples_contributed;
            group_sizes[s.epoch] += static_cast<double>(s.averaging.group_size);
            ++e.outcomes[std::string(optim::to_string(s.averaging.outcome))];
        }
    }
    for (std::uint64_t k = 0; k < o.epochs; ++k) {
        out[k].epoch = k;
        if (out[k].peers_ended > 0)
            out[k].mean_group_size = group_sizes[k] / static_cast<double>(out[k].peers_ended);
    }
    return out;
}

/// Library warnings so far (a failed round warns).
std::atomic<std::uint64_t> library_warnings{0};

run_record run_one(const options& o, bool schedule_ahead) {
    using wall_clock = std::chrono::steady_clock;
    run_record rec;
    rec.schedule_ahead = schedule_ahead;
    const auto setup_start = wall_clock::now();

    test::sim_peers peers(o.seed);
    peers.dht_options.routing.k = o.dht_k;
    peers.dht_options.cache_on_get = o.cache_on_get;
    std::deque<trainer> trainers;
    run_state run;
    run.epochs = o.epochs;
    // Every peer first, then the optimizers: the trackers do not read while peers bootstrap.
    for (std::size_t i = 0; i < o.peers; ++i)
        peers.add_peer();
    for (std::size_t i = 0; i < o.peers; ++i) {
        auto& p = peers.peers[i];
        auto& t = trainers.emplace_back(o.elements, i);
        // Geometric: peer i's samples/s is max_interval/min_interval times peer 0's at most.
        const double share = o.peers == 1 ? 0 : static_cast<double>(i) / (o.peers - 1);
        t.interval =
            from_seconds(o.min_interval * std::pow(o.max_interval / o.min_interval, share));
        optim::collaborative_options c;
        c.run_id = "bench";
        c.target_batch_size = o.target;
        c.batch_size_per_step = o.batch;
        c.matchmaking_time = from_seconds(o.matchmaking_time);
        c.averaging_timeout = from_seconds(o.averaging_timeout);
        c.schedule_ahead = schedule_ahead;
        c.average_state_every = o.average_state_every;
        c.averaging.target_group_size = o.peers;
        c.tracking.min_refresh = from_seconds(o.min_refresh);
        optim::sgd_options sgd;
        sgd.lr = 0.5;
        t.optimizer = std::make_unique<sim_optimizer>(
            p, std::vector<optim::parameter>{{t.model.value, t.model.grad}}, optim::sgd(sgd), c);
    }
    // Nobody starts alone: every tracker counts every peer first.
    const bool all_seen = peers.run_until(
        [&] {
            return std::all_of(trainers.begin(), trainers.end(), [&](const trainer& t) {
                return t.optimizer->global_progress().num_peers == o.peers;
            });
        },
        120s);
    if (!all_seen) rec.failures.push_back("the trackers did not all see every peer in 120 s");
    rec.setup_wall_seconds = std::chrono::duration<double>(wall_clock::now() - setup_start).count();

    const auto wall_start = wall_clock::now();
    const time_point start = peers.now();
    for (std::size_t i = 0; i < trainers.size(); ++i) {
        trainers[i].running = true;
        asio::co_spawn(peers.network.get_executor(), train(&run, &trainers[i], i, o.batch),
                       asio::detached);
    }
    const bool finished = peers.run_until(
        [&] {
            return std::none_of(trainers.begin(), trainers.end(),
                                [](const trainer& t) { return t.running; });
        },
        from_seconds(o.max_virtual));
    rec.wall_seconds = std::chrono::duration<double>(wall_clock::now() - wall_start).count();
    rec.virtual_seconds = seconds(peers.now() - start);
    if (!finished) {
        rec.failures.push_back("not every peer reached epoch " + std::to_string(o.epochs) +
                               " within " + program::format("%g", o.max_virtual) +
                               " virtual seconds");
    }

    for (const auto& t : trainers) {
        const auto s = t.optimizer->statistics();
        rec.totals += s;
    }
    rec.samples = rec.totals.samples;
    rec.samples_discarded = rec.totals.samples_discarded;
    for (const auto& s : run.steps) {
        if (!s.epoch_ended) continue;
        rec.samples_contributed += s.samples_contributed;
        switch (s.averaging.outcome) {
        case optim::round_outcome::failed:
        case optim::round_outcome::alone:
            rec.samples_in_failed_rounds += s.samples_contributed;
            break;
        case optim::round_outcome::partial:
            rec.samples_in_partial_rounds += s.samples_contributed;
            break;
        default:
            break;
        }
    }
    if (finished && rec.samples_contributed + rec.samples_discarded != rec.samples)
        rec.failures.push_back("samples computed " + std::to_string(rec.samples) +
                               " != contributed " + std::to_string(rec.samples_contributed) +
                               " + discarded " + std::to_string(rec.samples_discarded));
    const double peer_epochs = static_cast<double>(std::max<std::uint64_t>(rec.totals.epochs, 1));
    rec.mean_waiting_for_group = seconds(rec.totals.waiting_for_group) / peer_epochs;
    rec.mean_averaging = seconds(rec.totals.averaging) / peer_epochs;
    rec.steps = run.steps.size();
    rec.epochs = epochs_of(o, run.steps, start);
    for (auto& f : run.failures)
        rec.failures.push_back(std::move(f));

    // Withdraw the records before the peers go, as the tests do.
    for (auto& t : trainers)
        t.optimizer->close();
    peers.run_for(1s);
    for (auto& t : trainers)
        t.optimizer.reset();
    return rec;
}

std::string outcomes_text(const std::map<std::string, std::size_t>& outcomes) {
    std::string out;
    for (const auto& [name, count] : outcomes)
        out += (out.empty() ? "" : " ") + name + ":" + std::to_string(count);
    return out;
}

void write_json(const options& o, const std::vector<run_record>& runs, const std::string& path) {
    nlohmann::ordered_json report = {{"benchmark", "collaborative_sim"},
                                     {"peers", o.peers},
                                     {"target_batch_size", o.target},
                                     {"epochs", o.epochs},
                                     {"batch_size_per_step", o.batch},
                                     {"min_interval_seconds", o.min_interval},
                                     {"max_interval_seconds", o.max_interval},
                                     {"elements", o.elements},
                                     {"matchmaking_time_seconds", o.matchmaking_time},
                                     {"averaging_timeout_seconds", o.averaging_timeout},
                                     {"average_state_every", o.average_state_every},
                                     {"target_group_size", o.peers},
                                     {"seed", o.seed},
                                     {"network", "net::sim, links of 10 ms, unlimited bandwidth"},
                                     {"runs", nlohmann::ordered_json::array()}};
    const auto optional = [](const std::optional<double>& v) {
        return v ? nlohmann::ordered_json(*v) : nlohmann::ordered_json();
    };
    for (const auto& r : runs) {
        const auto lat = r.latencies();
        nlohmann::ordered_json epochs = nlohmann::ordered_json::array();
        for (const auto& e : r.epochs)
            epochs.push_back({{"epoch", e.epoch},
                              {"target_reached_seconds", optional(e.target_reached)},
                              {"round_ended_seconds", optional(e.round_ended)},
                              {"latency_seconds", e.latency()},
                              {"peers_ended", e.peers_ended},
                              {"samples_contributed", e.samples_contributed},
                              {"mean_group_size", e.mean_group_size},
                              {"outcomes", e.outcomes}});
        report["runs"].push_back(
            {{"schedule", schedule_name(r.schedule_ahead)},
             {"samples", r.samples},
             {"samples_discarded", r.samples_discarded},
             {"samples_in_failed_rounds", r.samples_in_failed_rounds},
             {"samples_in_partial_rounds", r.samples_in_partial_rounds},
             {"lost_fraction", r.lost_fraction()},
             {"median_latency_seconds", median(lat)},
             {"max_latency_seconds", lat.empty() ? std::numeric_limits<double>::quiet_NaN()
                                                 : *std::max_element(lat.begin(), lat.end())},
             {"rounds_averaged", r.totals.rounds_averaged},
             {"rounds_partial", r.totals.rounds_partial},
             {"rounds_failed", r.totals.rounds_failed},
             {"rounds_alone", r.totals.rounds_alone},
             {"state_loads", r.totals.state_loads},
             {"mean_waiting_for_group_seconds", r.mean_waiting_for_group},
             {"mean_averaging_seconds", r.mean_averaging},
             {"steps", r.steps},
             {"virtual_seconds", r.virtual_seconds},
             {"setup_wall_seconds", r.setup_wall_seconds},
             {"wall_seconds", r.wall_seconds},
             {"epochs", std::move(epochs)},
             {"failures", r.failures}});
    }
    program::write_json(path, report);
}

int run(const options& o) {
    log::set_sink(
        [verbose = o.verbose](log::level l, std::string_view component, std::string_view message) {
            if (l == log::level::warning) ++library_warnings;
            if (l >= log::level::error || verbose)
                std::fprintf(stderr, "[hivemesh %s] %.*s: %.*s\n", log::to_string(l),
                             static_cast<int>(component.size()), component.data(),
                             static_cast<int>(message.size()), message.data());
        });
    std::fprintf(stderr,
                 "bench_collaborative_sim: %zu peers, target %llu, %llu epochs, %llu samples "
                 "per batch every %g..%g s, %zu float32, seed %llu\n",
                 o.peers, static_cast<unsigned long long>(o.target),
                 static_cast<unsigned long long>(o.epochs),
                 static_cast<unsigned long long>(o.batch), o.min_interval, o.max_interval,
                 o.elements, static_cast<unsigned long long>(o.seed));
    const auto wall_start = std::chrono::steady_clock::now();
    std::vector<run_record> runs;
    bool any_failure = false;
    for (const bool ahead : o.schedules) {
        std::fprintf(stderr, "  schedule %-6s ... ", schedule_name(ahead));
        runs.push_back(run_one(o, ahead));
        const auto& r = runs.back();
        std::fprintf(stderr, "%.1f virtual s, wall %.1f s (set-up %.1f s)\n", r.virtual_seconds,
                     r.wall_seconds, r.setup_wall_seconds);
        for (const auto& f : r.failures)
            std::fprintf(stderr, "    FAILED: %s\n", f.c_str());
        any_failure = any_failure || !r.failures.empty();
    }
    const double wall_total =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();

    std::printf("\nCollaborative optimizer on the simulated network (links of 10 ms, unlimited "
                "bandwidth): %zu peers in gradient mode, one group of all of them, target_batch_"
                "size %llu, %llu epochs; peer i computes %llu samples every %g..%g s "
                "(geometric spread), %zu float32, plain SGD; matchmaking_time %g s, "
                "average_state_every %llu; seed %llu.\n\n",
                o.peers, static_cast<unsigned long long>(o.target),
                static_cast<unsigned long long>(o.epochs), static_cast<unsigned long long>(o.batch),
                o.min_interval, o.max_interval, o.elements, o.matchmaking_time,
                static_cast<unsigned long long>(o.average_state_every),
                static_cast<unsigned long long>(o.seed));
    std::printf("%-8s %-9s %-9s %-9s %-11s %-11s %-10s %-9s %-8s %-9s %s\n", "schedule", "lost",
                "partial", "overshoot", "latency med", "latency max", "wait/epoch", "avg/epoch",
                "group", "virtual s", "wall s");
    for (const auto& r : runs) {
        const auto lat = r.latencies();
        double group = 0, overshoot = 0;
        for (const auto& e : r.epochs) {
            group += e.mean_group_size;
            overshoot += static_cast<double>(e.samples_contributed) / static_cast<double>(o.target);
        }
        const auto epochs = static_cast<double>(std::max<std::size_t>(r.epochs.size(), 1));
        const auto lost = program::format("%.2f%%", 100 * r.lost_fraction());
        const auto partial = program::format(
            "%.2f%%", r.samples == 0 ? 0.0
                                     : 100.0 * static_cast<double>(r.samples_in_partial_rounds) /
                                           static_cast<double>(r.samples));
        std::printf("%-8s %-9s %-9s %-9.3f %-11.2f %-11.2f %-10.2f %-9.3f %-8.1f %-9.1f %.1f%s\n",
                    schedule_name(r.schedule_ahead), lost.c_str(), partial.c_str(),
                    overshoot / epochs, median(lat),
                    lat.empty() ? std::numeric_limits<double>::quiet_NaN()
                                : *std::max_element(lat.begin(), lat.end()),
                    r.mean_waiting_for_group, r.mean_averaging, group / epochs, r.virtual_seconds,
                    r.wall_seconds, r.failures.empty() ? "" : "  FAILED");
    }
    std::printf("\nPer epoch (virtual seconds since the trainers started):\n");
    std::printf("%-8s %-5s %-10s %-10s %-8s %-6s %-8s %s\n", "schedule", "epoch", "target at",
                "ended at", "latency", "peers", "samples", "gradient rounds");
    for (const auto& r : runs)
        for (const auto& e : r.epochs)
            std::printf("%-8s %-5llu %-10.2f %-10.2f %-8.2f %-6zu %-8llu %s\n",
                        schedule_name(r.schedule_ahead), static_cast<unsigned long long>(e.epoch),
                        e.target_reached.value_or(std::numeric_limits<double>::quiet_NaN()),
                        e.round_ended.value_or(std::numeric_limits<double>::quiet_NaN()),
                        e.latency(), e.peers_ended,
                        static_cast<unsigned long long>(e.samples_contributed),
                        outcomes_text(e.outcomes).c_str());
    std::printf(
        "\nlost: samples discarded by state downloads or contributed to a failed or lone "
        "gradient round, over all samples computed; partial: samples contributed to a partial "
        "round; overshoot: samples contributed per epoch / target; latency: from the swarm "
        "reaching the target (the step at which the epoch's reported samples summed to it) "
        "to the last peer's epoch-ending step completing, median and max over epochs; "
        "wait/epoch, avg/epoch: statistics().waiting_for_group and averaging per peer and "
        "epoch (gradient and state rounds); group: mean group size of the gradient rounds.\n");
    std::printf("Library warnings (--verbose prints them): %llu\n",
                static_cast<unsigned long long>(library_warnings.load()));
    std::printf("Wall time: %.1f s\n", wall_total);
    std::printf("Checks: %s\n", any_failure ? "FAILED (see above)" : "all passed");
    if (!o.json_path.empty()) write_json(o, runs, o.json_path);
    return any_failure ? 1 : 0;
}

} // namespace

int main(int argc, char** argv) {
    const auto o = parse(argc, argv);
    try {
        return run(o);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_collaborative_sim: %s\n", e.what());
        return 1;
    }
}
