// The collaborative trainer: a swarm of peer processes trains one model on Fashion-MNIST with
// hivemesh's collaborative optimizer (or one process alone with --single), shows a live view,
// and writes a report of where the time went (report.json, metrics.csv, charts, a bottleneck
// table). `collaborative_trainer --help` lists the options; README.md shows how to use it.
//
// The launcher runs copies of this program as its peers (--worker, hidden); they send their
// events as JSON lines on stdout (examples/trainer/worker.hpp).
#include <hivemesh/optim/torch.hpp> // first: see there

#include "trainer/launcher.hpp"
#include "trainer/report.hpp"
#include "trainer/worker.hpp"

#include <hivemesh/net/address.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using namespace hivemesh::examples;

/// Refuses, with a message naming the option, what would only fail later in a peer.
void check_launch(const trainer_options& o) {
    for (const auto& text : [&] {
             std::vector<std::string> all = o.join;
             if (!o.listen.empty()) all.push_back(o.listen);
             return all;
         }()) {
        std::string_view reason;
        if (!hivemesh::net::peer_address::parse(text, &reason))
            throw std::invalid_argument("bad multiaddr \"" + text + "\": " + std::string(reason));
    }
    if (o.single && o.multi_host())
        throw std::invalid_argument("--single trains alone: it takes no --listen or --join");
    if (o.single && !o.checkpoint.empty())
        throw std::invalid_argument("--checkpoint saves the peers of a swarm, not --single");
    if (o.resume && o.checkpoint.empty())
        throw std::invalid_argument("--resume needs --checkpoint DIR, where the peers saved");
    for (const auto& k : o.kill)
        hivemesh::examples::detail::parse_kill(k);
    for (const std::string split : {"train", "t10k"})
        for (const std::string kind : {"images-idx3", "labels-idx1"})
            try {
                find_idx_file(o.data, split + "-" + kind + "-ubyte");
            } catch (const idx_missing_file& e) {
                throw std::runtime_error(std::string(e.what()) +
                                         "\nFashion-MNIST comes with the Debian package "
                                         "dataset-fashion-mnist (apt-get install "
                                         "dataset-fashion-mnist), or give --data DIR");
            }
    const std::filesystem::path report(o.report);
    std::error_code ec;
    std::filesystem::create_directories(report, ec);
    const auto probe = report / ".writable";
    if (ec || !std::ofstream(probe))
        throw std::runtime_error("cannot write the report directory " + o.report +
                                 (ec ? ": " + ec.message() : ""));
    std::filesystem::remove(probe, ec);
}

int launch(const trainer_options& o, int argc, char** argv) {
    check_launch(o);
    at::set_num_threads(static_cast<int>(o.threads * std::max<std::size_t>(1, o.peers)));
    const image_set test = load_split(o.data, "t10k");
    launcher swarm(o, "/proc/self/exe", std::vector<std::string>(argv + 1, argv + argc));
    const auto run = swarm.run();
    const auto report = write_report(o, run, test);
    print_bottlenecks(report);
    const auto& accuracy = report["test_accuracy"];
    std::printf("\ntest accuracy %s, %llu samples in %.1f s (%.0f samples/s), %llu epochs\n",
                accuracy.is_number() ? std::to_string(accuracy.get<double>()).c_str() : "unknown",
                report["samples_total"].get<unsigned long long>(),
                report["wall_seconds"].get<double>(), report["samples_per_second"].get<double>(),
                report["epochs"].get<unsigned long long>());
    std::printf("report: %s/report.json, metrics.csv%s\n", o.report.c_str(),
                report["charts"].empty() ? "" : ", loss.png, accuracy.png, phases.png");
    if (report.contains("charts_note"))
        std::printf("%s\n", report["charts_note"].get<std::string>().c_str());
    bool ok = accuracy.is_number();
    for (const auto& p : run.peers)
        ok = ok && (p.done || p.killed || p.stopped_unjoined);
    return ok ? 0 : 1;
}

} // namespace

int main(int argc, char** argv) {
    trainer_options o;
    CLI::App app{"Trains a classifier on Fashion-MNIST with a swarm of hivemesh peers on this "
                 "machine (or one peer of a multi-host swarm with --listen/--join, or one node "
                 "with --single) and reports where the time went.",
                 "collaborative_trainer"};
    add_trainer_options(app, o);
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        hivemesh::program::exit_after(app, e);
    }
    if (o.worker) return run_worker(o);
    try {
        return launch(o, argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "collaborative_trainer: %s\n", e.what());
        return 1;
    }
}
