// The collaborative trainer's report: the snapshots of peer 0 evaluated on the test set,
// report.json, metrics.csv, charts drawn by gnuplot, and the bottleneck table on stdout.
// Include <hivemesh/optim/torch.hpp> before this header.
#pragma once

#include "launcher.hpp"
#include "model.hpp"
#include "phases.hpp"
#include "process.hpp"
#include "worker.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace hivemesh::examples {

/// The test accuracy after an epoch.
struct accuracy_point {
    std::uint64_t epoch = 0;
    std::uint64_t samples = 0; ///< epoch x target_batch_size
    evaluation result;
};

namespace detail {

inline std::vector<float> read_snapshot(const std::string& file) {
    std::ifstream in(file, std::ios::binary | std::ios::ate);
    if (!in) throw std::runtime_error("cannot read the snapshot " + file);
    const auto bytes = static_cast<std::size_t>(in.tellg());
    std::vector<float> values(bytes / sizeof(float));
    in.seekg(0);
    in.read(reinterpret_cast<char*>(values.data()), static_cast<std::streamsize>(bytes));
    return values;
}

/// At most `count` of the epoch snapshots, evenly spread and with the last one.
inline std::vector<snapshot_record> spread(std::vector<snapshot_record> epochs, std::size_t count) {
    if (epochs.size() <= count) return epochs;
    std::vector<snapshot_record> out;
    for (std::size_t i = 0; i < count; ++i)
        out.push_back(epochs[(i + 1) * epochs.size() / count - 1]);
    return out;
}

/// Writes the charts' data and script to `directory` and runs gnuplot; the PNG files made, or
/// the reason there are none.
inline std::pair<std::vector<std::string>, std::string>
draw_charts(const std::filesystem::path& directory, const run_record& run,
            const std::vector<accuracy_point>& accuracy,
            const std::vector<std::pair<std::size_t, phase_seconds>>& phases) {
    const auto data = directory / "charts";
    std::filesystem::create_directories(data);
    std::set<std::size_t> ranks;
    for (const auto& m : run.metrics)
        ranks.insert(m.rank);
    for (const auto rank : ranks) {
        std::ofstream out(data / ("loss-" + std::to_string(rank) + ".dat"));
        for (const auto& m : run.metrics)
            if (m.rank == rank) out << m.time << ' ' << m.loss << '\n';
    }
    {
        std::ofstream out(data / "accuracy.dat");
        for (const auto& a : accuracy)
            out << a.samples << ' ' << a.result.accuracy << '\n';
    }
    {
        std::ofstream out(data / "phases.dat");
        out << "peer";
        for (const auto& [name, field] : phase_fields)
            out << ' ' << name;
        out << '\n';
        for (const auto& [rank, p] : phases) {
            out << rank;
            for (const auto& [name, field] : phase_fields)
                out << ' ' << p.*field;
            out << '\n';
        }
    }
    const auto script = data / "charts.gp";
    {
        std::ofstream gp(script);
        gp << "set terminal pngcairo size 900,540 noenhanced\nset grid\nset key outside right\n";
        gp << "set output '" << (directory / "loss.png").string() << "'\n"
           << "set title 'training loss'\nset xlabel 'wall time (s)'\nset ylabel 'loss'\nplot";
        for (auto it = ranks.begin(); it != ranks.end(); ++it)
            gp << (it == ranks.begin() ? " " : ", ") << "'" << (data / "loss-").string() << *it
               << ".dat' using 1:2 with lines title 'peer " << *it << "'";
        gp << "\nset output '" << (directory / "accuracy.png").string() << "'\n"
           << "set title 'test accuracy of peer 0'\nset xlabel 'samples'\n"
           << "set ylabel 'accuracy'\nplot '" << (data / "accuracy.dat").string()
           << "' using 1:2 with linespoints title 'test accuracy'\n";
        gp << "set output '" << (directory / "phases.png").string() << "'\n"
           << "set title 'where the time went'\nset xlabel 'peer'\nset ylabel 'seconds'\n"
           << "set style data histograms\nset style histogram rowstacked\n"
           << "set style fill solid 0.8 border -1\nset boxwidth 0.7\n"
           << "plot for [i=2:" << phase_fields.size() + 1 << "] '" << (data / "phases.dat").string()
           << "' using i:xtic(1) title columnheader(i)\n";
    }
    if (auto failure = program::run_gnuplot(script, data / "gnuplot.log")) return {{}, *failure};
    return {{(directory / "loss.png").string(), (directory / "accuracy.png").string(),
             (directory / "phases.png").string()},
            ""};
}

} // namespace detail

/// Test images the accuracy curve is measured on (the final model is measured on all).
inline constexpr std::int64_t curve_test_images = 2000;

/// Evaluates peer 0's snapshots: the final model on the whole test set, at most 10 epochs
/// (evenly spread) on its first curve_test_images images.
inline std::vector<accuracy_point> evaluate_snapshots(const trainer_options& o,
                                                      const run_record& run, const image_set& test,
                                                      std::optional<evaluation>& final) {
    auto model = make_model(o.model, o.seed);
    std::vector<snapshot_record> epochs;
    for (const auto& s : run.snapshots) {
        if (s.final) {
            set_flat_parameters(*model, detail::read_snapshot(s.file));
            final = evaluate(*model, test);
        } else {
            epochs.push_back(s);
        }
    }
    std::vector<accuracy_point> out;
    for (const auto& s : detail::spread(epochs, 10)) {
        set_flat_parameters(*model, detail::read_snapshot(s.file));
        out.push_back(
            {s.epoch, s.epoch * o.target_batch_size, evaluate(*model, test, curve_test_images)});
    }
    return out;
}

/// Writes report.json, metrics.csv and the charts to --report, prints the bottleneck table,
/// and returns the report.
inline nlohmann::ordered_json write_report(const trainer_options& o, const run_record& run,
                                           const image_set& test) {
    const std::filesystem::path directory(o.report);
    std::optional<evaluation> final;
    const auto accuracy = evaluate_snapshots(o, run, test, final);

    nlohmann::ordered_json peers = nlohmann::ordered_json::array();
    std::vector<std::pair<std::size_t, phase_seconds>> phases;
    std::uint64_t samples_total = 0, epochs = 0;
    double least_attributed = 1;
    std::optional<std::uint64_t> resumed_from; ///< the earliest checkpoint a peer resumed from
    for (const auto& p : run.peers) {
        const nlohmann::json& last = p.done ? *p.done : p.progress;
        const auto samples = last.value("samples", std::uint64_t{0});
        const auto epoch = last.value("epoch", std::uint64_t{0});
        samples_total += samples;
        epochs = std::max(epochs, epoch);
        nlohmann::ordered_json entry{
            {"rank", p.rank},
            {"status", p.done               ? "finished"
                       : p.killed           ? "killed"
                       : p.stopped_unjoined ? "not_joined"
                                            : "failed"},
            {"epoch", epoch},
            {"samples", samples},
            {"joined", p.joined ? nlohmann::ordered_json(*p.joined) : nlohmann::ordered_json()},
            {"left", p.left ? nlohmann::ordered_json(*p.left) : nlohmann::ordered_json()},
            {"joined_epoch", p.joined_epoch},
            {"joined_global_epoch", p.joined_global_epoch},
            {"joined_state_loaded", p.joined_state_loaded},
            {"resumed_from_epoch", p.resumed_from_epoch
                                       ? nlohmann::ordered_json(*p.resumed_from_epoch)
                                       : nlohmann::ordered_json()}};
        if (p.resumed_from_epoch)
            resumed_from =
                std::min(resumed_from.value_or(*p.resumed_from_epoch), *p.resumed_from_epoch);
        if (p.done) {
            const double wall = p.done->value("wall", 0.0);
            const auto ph =
                phase_seconds_from_json(p.done->value("phases", nlohmann::json::object()));
            const double attributed = wall > 0 ? std::min(1.0, ph.named() / wall) : 0;
            least_attributed = std::min(least_attributed, attributed);
            entry["samples_per_second"] = wall > 0 ? static_cast<double>(samples) / wall : 0;
            entry["wall"] = wall;
            entry["parameters_hash"] = p.done->value("parameters_hash", "");
            entry["buffers_hash"] = p.done->value("buffers_hash", "");
            entry["phases"] = to_json(ph);
            entry["attributed_fraction"] = attributed;
            entry["optimizer"] = p.done->value("stats", nlohmann::json::object());
            phases.emplace_back(p.rank, ph);
        } else {
            entry["samples_per_second"] = p.progress.value("samples_per_second", 0.0);
            if (!p.error.empty()) entry["error"] = p.error;
        }
        peers.push_back(std::move(entry));
    }

    nlohmann::ordered_json curve = nlohmann::ordered_json::array();
    for (const auto& a : accuracy)
        curve.push_back({{"epoch", a.epoch},
                         {"samples", a.samples},
                         {"test_accuracy", a.result.accuracy},
                         {"test_loss", a.result.loss}});

    {
        std::ofstream csv(directory / "metrics.csv");
        csv << "time,peer,epoch,samples,loss\n";
        for (const auto& m : run.metrics)
            csv << m.time << ',' << m.rank << ',' << m.epoch << ',' << m.samples << ',' << m.loss
                << '\n';
    }
    const auto [charts, charts_note] = detail::draw_charts(directory, run, accuracy, phases);

    nlohmann::ordered_json report{
        {"test_accuracy", final ? nlohmann::ordered_json(final->accuracy) : nullptr},
        {"test_loss", final ? nlohmann::ordered_json(final->loss) : nullptr},
        {"samples_total", samples_total},
        {"wall_seconds", run.wall_seconds},
        {"samples_per_second",
         run.wall_seconds > 0 ? static_cast<double>(samples_total) / run.wall_seconds : 0},
        {"epochs", epochs},
        {"resumed_from_epoch",
         resumed_from ? nlohmann::ordered_json(*resumed_from) : nlohmann::ordered_json()},
        {"attributed_fraction", phases.empty() ? 0.0 : least_attributed},
        {"config", to_json(o)},
        {"peers", peers},
        {"accuracy_curve_test_images", std::min(test.size(), curve_test_images)},
        {"accuracy_curve", curve},
        {"charts", charts},
        {"messages", run.messages}};
    if (!charts_note.empty()) report["charts_note"] = charts_note;
    std::ofstream(directory / "report.json") << report.dump(2) << '\n';
    return report;
}

/// The bottleneck table: phase x peer, seconds and share of the peer's wall time, and a
/// sentence naming the dominant phase.
inline void print_bottlenecks(const nlohmann::ordered_json& report) {
    std::vector<const nlohmann::ordered_json*> finished;
    for (const auto& p : report["peers"])
        if (p.contains("phases")) finished.push_back(&p);
    if (finished.empty()) {
        std::printf("no peer finished: no bottleneck table\n");
        return;
    }
    std::printf("\n%-12s", "phase");
    for (const auto* p : finished)
        std::printf(" %16s", ("peer " + std::to_string((*p)["rank"].get<std::size_t>())).c_str());
    std::printf("\n");
    std::string dominant;
    double dominant_share = -1;
    for (const auto& [name, field] : phase_fields) {
        std::printf("%-12s", name);
        double share_sum = 0;
        for (const auto* p : finished) {
            const double s = (*p)["phases"][name].get<double>();
            const double wall = (*p)["wall"].get<double>();
            const double share = wall > 0 ? s / wall : 0;
            share_sum += share;
            std::printf(" %8.1f s %4.0f%%", s, 100 * share);
        }
        std::printf("\n");
        const double mean_share = share_sum / static_cast<double>(finished.size());
        if (mean_share > dominant_share) {
            dominant_share = mean_share;
            dominant = name;
        }
    }
    std::printf("%-12s", "wall");
    for (const auto* p : finished)
        std::printf(" %8.1f s %5s", (*p)["wall"].get<double>(), "");
    std::printf("\nThe dominant phase is %s: %.0f%% of the peers' wall time on average.\n",
                dominant.c_str(), 100 * dominant_share);
}

} // namespace hivemesh::examples
