// The swarm monitor: joins a swarm as a client, reads the progress records of one run and
// shows the swarm's progress (peers, clients, global epoch, samples toward the target,
// samples/s, ETA), live or as one JSON snapshot (--once --json) for scripts.
//
//   monitor --join /ip4/127.0.0.1/tcp/31337/p2p/<PeerId> [--run-id fashion-mnist]
//           [--target-batch-size 1024] [--once] [--json] [--interval 1] [--swarm-key KEY]
#include <hivemesh/peer.hpp>
#include <hivemesh/progress/tracker.hpp>

#include "program.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace hivemesh;
using namespace std::chrono_literals;
using seconds_f = std::chrono::duration<double>;

struct monitor_options {
    std::vector<std::string> join;
    std::string run_id = "fashion-mnist";
    std::uint64_t target_batch_size = 1024;
    bool once = false;
    bool json = false;
    double interval = 1;
    double timeout = 30;
    std::string swarm_key;
    bool plaintext = false;
};

/// Seconds from now until `t`; null when there is no estimate.
nlohmann::ordered_json seconds_until(time_point t) {
    if (t == time_point::max()) return nullptr;
    return std::max(0.0, seconds_f(t - wall_clock().now()).count());
}

nlohmann::ordered_json snapshot(const monitor_options& o,
                                const progress::global_training_progress& g) {
    return {{"run_id", o.run_id},
            {"peers", g.num_peers - g.num_clients},
            {"clients", g.num_clients},
            {"global_epoch", g.epoch},
            {"samples_accumulated", g.samples_accumulated},
            {"estimated_samples", g.estimated_samples},
            {"target_batch_size", g.target_batch_size},
            {"samples_per_second", g.samples_per_second},
            {"eta_seconds", seconds_until(g.eta)}};
}

void print_row(const nlohmann::ordered_json& s, bool header) {
    if (header)
        std::printf("%-8s %6s %8s %8s %22s %12s %8s\n", "time", "peers", "clients", "epoch",
                    "samples / target", "samples/s", "ETA s");
    const auto eta = s["eta_seconds"];
    char when[16];
    const auto t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
    std::strftime(when, sizeof when, "%H:%M:%S", std::localtime(&t));
    std::printf(
        "%-8s %6llu %8llu %8llu %10.0f / %-9llu %12.0f %8s\n", when,
        s["peers"].get<unsigned long long>(), s["clients"].get<unsigned long long>(),
        s["global_epoch"].get<unsigned long long>(), s["estimated_samples"].get<double>(),
        s["target_batch_size"].get<unsigned long long>(), s["samples_per_second"].get<double>(),
        eta.is_number() ? std::to_string(static_cast<long>(eta.get<double>())).c_str() : "-");
    std::fflush(stdout);
}

int run(const monitor_options& o) {
    peer_options po;
    po.client_mode = true;
    po.initial_peers = o.join;
    po.swarm_key = o.swarm_key;
    po.plaintext = o.plaintext;
    po.bootstrap_timeout = std::chrono::duration_cast<duration>(seconds_f(o.timeout));
    peer client(po);

    progress::tracker_options to;
    to.run_id = o.run_id;
    to.target_batch_size = o.target_batch_size;
    to.reports_samples = false; // reads only: counted nowhere
    progress::tracker<net::tcp::transport> tracker(client, to);

    // The first estimate made from a read of the DHT.
    const auto deadline = std::chrono::steady_clock::now() + seconds_f(o.timeout);
    while (tracker.statistics().fetches == 0) {
        if (std::chrono::steady_clock::now() > deadline)
            throw std::runtime_error("could not read the run's progress within " +
                                     std::to_string(o.timeout) + " s");
        std::this_thread::sleep_for(20ms);
    }
    auto progress = tracker.global_progress();
    if (o.once) {
        const auto s = snapshot(o, progress);
        if (o.json)
            std::printf("%s\n", s.dump(2).c_str());
        else
            print_row(s, true);
        return 0;
    }
    const bool terminal = isatty(STDOUT_FILENO) == 1;
    for (std::size_t row = 0;; ++row) {
        const auto s = snapshot(o, progress);
        if (o.json)
            std::printf("%s\n", s.dump().c_str());
        else
            print_row(s, row % (terminal ? 20 : 1000000) == 0);
        std::fflush(stdout);
        std::this_thread::sleep_for(seconds_f(o.interval));
        progress = tracker.global_progress();
    }
}

} // namespace

int main(int argc, char** argv) {
    monitor_options o;
    CLI::App app{"Shows the progress of a hivemesh training run: joins the swarm as a client "
                 "and reads the run's progress records.",
                 "monitor"};
    app.option_defaults()->always_capture_default();
    app.add_option("--join", o.join, "Peers to bootstrap from (/ip4/HOST/tcp/PORT/p2p/PEERID)")
        ->required();
    app.add_option("--run-id", o.run_id, "The run to show");
    app.add_option("--target-batch-size", o.target_batch_size,
                   "The run's samples per epoch (for the ETA)")
        ->check(hivemesh::program::positive);
    app.add_flag("--once", o.once, "Print one snapshot and exit");
    app.add_flag("--json", o.json, "JSON instead of a table");
    app.add_option("--interval", o.interval, "Seconds between rows")
        ->check(hivemesh::program::positive);
    app.add_option("--timeout", o.timeout, "Seconds joining and the first read may take")
        ->check(hivemesh::program::positive);
    app.add_option("--swarm-key", o.swarm_key, "The swarm's shared secret, if it has one");
    app.add_flag("--plaintext", o.plaintext, "The swarm's connections are unencrypted");
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        hivemesh::program::exit_after(app, e);
    }
    try {
        return run(o);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "monitor: %s\n", e.what());
        return 1;
    }
}
