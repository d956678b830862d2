// Checks a collaborative_trainer report.json for tests/integration/collaborative_trainer.sh:
// every field the report promises, and the run's claims the options name. Prints each failed
// check and exits 1 if there was one.
//
//   trainer_report_check REPORT.json [--min-accuracy A] [--finished N] [--live N]
//                        [--same-parameters] [--min-attributed F] [--killed RANK]
//                        [--replacements N] [--in-swarm] [--same-buffers] [--resumed]
//                        [--near-accuracy OTHER.json --within D]
#include "../../examples/trainer/phases.hpp"
#include "program.hpp"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
    if (!ok) {
        std::printf("FAILED: %s\n", what.c_str());
        ++failures;
    }
}

bool has_number(const nlohmann::json& j, const char* key) {
    return j.contains(key) && j[key].is_number();
}

} // namespace

int main(int argc, char** argv) {
    std::string path;
    double min_accuracy = 0, min_attributed = 0.95;
    std::size_t finished = 0, replacements = 0;
    std::optional<std::size_t> live;
    bool same_parameters = false, in_swarm = false, same_buffers = false, resumed = false;
    std::string other_report;
    double within = 0.02;
    std::optional<std::size_t> killed;
    CLI::App app{"Checks a collaborative_trainer report."};
    app.add_option("report", path, "report.json")->required();
    app.add_option("--min-accuracy", min_accuracy);
    app.add_option("--finished", finished, "Peers that must have finished");
    app.add_option("--live", live,
                   "Peers not killed: each finished, or was a replacement the end of the run "
                   "stopped before it joined");
    app.add_flag("--same-parameters", same_parameters,
                 "Every finished peer ends with the same parameters");
    app.add_flag("--same-buffers", same_buffers,
                 "Every finished peer ends with the same float buffers (BatchNorm statistics)");
    app.add_flag("--resumed", resumed,
                 "Every peer resumed from a checkpoint, of an epoch > 0, and finished past it");
    app.add_option("--near-accuracy", other_report,
                   "Another run's report.json: test accuracies within --within of each other");
    app.add_option("--within", within);
    app.add_option("--min-attributed", min_attributed);
    app.add_option("--killed", killed, "This peer was killed");
    app.add_option("--replacements", replacements,
                   "At least this many peers joined late, each after loading state");
    app.add_flag("--in-swarm", in_swarm,
                 "Every finished peer's epochs hold more samples than it computed itself: "
                 "others trained with it (a multi-host peer's report has only itself)");
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        hivemesh::program::exit_after(app, e);
    }
    std::ifstream in(path);
    const auto report = nlohmann::json::parse(in, nullptr, false);
    if (report.is_discarded() || !report.is_object()) {
        std::printf("FAILED: %s is not a JSON object\n", path.c_str());
        return 1;
    }
    for (const char* key : {"test_accuracy", "test_loss", "samples_total", "wall_seconds", "epochs",
                            "attributed_fraction"})
        check(has_number(report, key), std::string("report.") + key + " is a number");
    check(report.contains("config") && report["config"].is_object(), "report.config");
    check(report.contains("peers") && report["peers"].is_array(), "report.peers");
    if (failures) return 1;

    check(report["test_accuracy"].get<double>() >= min_accuracy,
          "test_accuracy " + report["test_accuracy"].dump() +
              " >= " + std::to_string(min_accuracy));
    std::size_t done = 0, late = 0, not_killed = 0;
    std::string hash, buffers;
    if (!other_report.empty()) {
        std::ifstream other_in(other_report);
        const auto other = nlohmann::json::parse(other_in, nullptr, false);
        const bool number = other.is_object() && has_number(other, "test_accuracy");
        check(number, other_report + ": test_accuracy is a number");
        if (number) {
            const double a = report["test_accuracy"].get<double>();
            const double b = other["test_accuracy"].get<double>();
            check(std::abs(a - b) <= within, "test accuracy " + std::to_string(a) + " within " +
                                                 std::to_string(within) + " of " +
                                                 std::to_string(b) + " (" + other_report + ")");
        }
    }
    if (resumed)
        check(has_number(report, "resumed_from_epoch") &&
                  report["resumed_from_epoch"].get<std::uint64_t>() > 0,
              "report.resumed_from_epoch " +
                  report.value("resumed_from_epoch", nlohmann::json()).dump() + " > 0");
    for (const auto& p : report["peers"]) {
        const std::string rank = p.contains("rank") ? p["rank"].dump() : "?";
        for (const char* key : {"rank", "epoch", "samples", "samples_per_second"})
            check(has_number(p, key), "peer " + rank + ": " + key + " is a number");
        check(p.contains("joined") && p.contains("left"), "peer " + rank + ": joined and left");
        const std::string status = p.value("status", "");
        check(status == "finished" || status == "killed" || status == "not_joined",
              "peer " + rank + ": status " + status);
        if (status != "killed") ++not_killed;
        if (status == "not_joined")
            check(p["joined"].is_null(), "peer " + rank + " is not_joined and has no join time");
        if (status == "finished") {
            ++done;
            check(p.contains("phases") && p["phases"].is_object(), "peer " + rank + ": phases");
            for (const auto& phase : hivemesh::examples::phase_fields)
                check(p.contains("phases") && has_number(p["phases"], phase.name),
                      "peer " + rank + ": phases." + phase.name);
            check(p.value("attributed_fraction", 0.0) >= min_attributed,
                  "peer " + rank + ": attributed_fraction " +
                      std::to_string(p.value("attributed_fraction", 0.0)) +
                      " >= " + std::to_string(min_attributed));
            const std::string h = p.value("parameters_hash", "");
            if (same_parameters && !hash.empty())
                check(h == hash, "peer " + rank + ": parameters " + h + " == " + hash);
            if (hash.empty()) hash = h;
            const std::string b = p.value("buffers_hash", "");
            if (same_buffers && !buffers.empty())
                check(b == buffers, "peer " + rank + ": buffers " + b + " == " + buffers);
            if (buffers.empty()) buffers = b;
            if (resumed) {
                const auto from = p.value("resumed_from_epoch", nlohmann::json());
                check(from.is_number() && from.get<std::uint64_t>() > 0 &&
                          p.value("epoch", std::uint64_t{0}) > from.get<std::uint64_t>(),
                      "peer " + rank + " resumed from epoch " + from.dump() +
                          " > 0 and trained past it to " + p["epoch"].dump());
            }
            if (in_swarm) {
                const auto target = report["config"].value("target_batch_size", std::uint64_t{0});
                const auto epoch = p.value("epoch", std::uint64_t{0});
                const auto samples = p.value("samples", std::uint64_t{0});
                check(epoch * target > samples,
                      "peer " + rank + ": " + std::to_string(epoch) + " epochs of " +
                          std::to_string(target) + " samples > its own " + std::to_string(samples) +
                          " (it trained in a swarm)");
            }
        }
        // A peer that started behind the swarm (after its checkpoint, if it resumed).
        const auto resumed_epoch = p.value("resumed_from_epoch", nlohmann::json());
        const std::uint64_t start =
            resumed_epoch.is_number() ? resumed_epoch.get<std::uint64_t>() : 0;
        if (p.value("joined_global_epoch", std::uint64_t{0}) > start) {
            ++late;
            check(p.value("joined_state_loaded", false), "peer " + rank + " loaded state");
            check(p.value("joined_epoch", 0) + 1 >= p.value("joined_global_epoch", 0),
                  "peer " + rank + ": epoch " + p["joined_epoch"].dump() +
                      " >= global epoch - 1 when it started (" + p["joined_global_epoch"].dump() +
                      ")");
        }
        if (killed && p.value("rank", std::size_t{0}) == *killed)
            check(p.value("status", "") == "killed" && p["left"].is_number(),
                  "peer " + rank + " shows as killed, with the time it left");
    }
    check(done >= finished,
          std::to_string(done) + " peers finished, expected " + std::to_string(finished));
    if (live)
        check(not_killed == *live,
              std::to_string(not_killed) + " peers not killed, expected " + std::to_string(*live));
    check(late >= replacements,
          std::to_string(late) + " peers joined late, expected " + std::to_string(replacements));
    if (failures == 0)
        std::printf("report ok: accuracy %s, %zu peers finished, %zu joined late\n",
                    report["test_accuracy"].dump().c_str(), done, late);
    return failures ? 1 : 0;
}
