// The thesis' experiment at small scale: runs collaborative_trainer once per cell of a grid
// and writes docs/thesis-matrix.md (tables and findings) with its PNG charts.
//
// The grid is one factor at a time around a baseline (4 peers, target batch size 1250, batch
// size 64, learning rate 0.01, gradient averaging), every cell with the same sample budget.
// Each configuration also runs as --single with the same hyperparameters and the same total
// threads, so every row is compared with one node that trained on as many samples.
//
//   thesis_matrix [--quick] [--factor NAME]... [--samples N] [--output FILE] [--runs DIR]
//                 [--trainer PATH] [--model cnn|mlp] [--total-threads N] [--seed N] [--dry-run]
#include "../examples/trainer/phases.hpp"
#include "process.hpp"
#include "program.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using hivemesh::examples::phase_fields;
using hivemesh::examples::phase_seconds;
using hivemesh::program::format;

/// One trainer configuration; peers == 0 is the single node.
struct configuration {
    std::size_t peers = 4;
    std::uint64_t target_batch_size = 1250;
    std::uint64_t batch_size = 64;
    double lr = 0.01;
    bool local_updates = false;

    configuration single() const {
        auto c = *this;
        c.peers = 0;
        return c;
    }
};

/// A factor of the grid: its name, how its values read, and how a value changes the baseline.
struct factor {
    std::string name;
    std::string title;
    std::vector<std::string> values, quick_values;
    std::string baseline_value;
    void (*apply)(configuration&, const std::string&);
};

const std::vector<factor>& factors() {
    static const std::vector<factor> all{
        {"peers",
         "Peers (single node against 2, 4 and 8 peers)",
         {"single", "2", "4", "8"},
         {"single", "2", "4", "8"},
         "4",
         [](configuration& c, const std::string& v) {
             c.peers = v == "single" ? 0 : std::stoul(v);
         }},
        {"target_batch_size",
         "Target batch size (samples per collaborative epoch)",
         {"625", "1250", "2500", "5000", "10000"},
         {"625", "1250", "5000"},
         "1250",
         [](configuration& c, const std::string& v) { c.target_batch_size = std::stoull(v); }},
        {"local_updates",
         "Local updates (parameter averaging) against gradient averaging",
         {"off", "on"},
         {"off", "on"},
         "off",
         [](configuration& c, const std::string& v) { c.local_updates = v == "on"; }},
        {"batch_size",
         "Batch size (per peer and step)",
         {"32", "64", "128"},
         {"32", "64", "128"},
         "64",
         [](configuration& c, const std::string& v) { c.batch_size = std::stoull(v); }},
        {"lr",
         "Learning rate (Adam)",
         {"0.001", "0.01", "0.1"},
         {"0.001", "0.01", "0.1"},
         "0.01",
         [](configuration& c, const std::string& v) { c.lr = std::stod(v); }},
    };
    return all;
}

struct settings {
    bool quick = false;
    std::vector<std::string> only; ///< factor names; empty: all
    std::uint64_t samples = 0;     ///< 0: 60,000 with --quick, else 120,000
    std::string output = "docs/thesis-matrix.md";
    std::string runs = "thesis-matrix-runs";
    std::string trainer;
    std::string model = "cnn";
    std::size_t total_threads = 0; ///< 0: this machine's cores
    std::uint64_t seed = 1;
    bool dry_run = false;
    bool report_only = false; ///< read the runs' reports instead of running them
};

/// What one trainer run left: its report, or why there is none.
struct outcome {
    std::string name;
    std::optional<json> report;
    std::string failure;
    double seconds = 0; ///< the whole process, evaluation included
};

/// Threads per peer, so that peers x threads holds the total (one at least).
std::size_t threads_per_peer(const settings& s, std::size_t peers) {
    return std::max<std::size_t>(1, s.total_threads / std::max<std::size_t>(1, peers));
}

/// The trainer's command line for a configuration; also its run's name.
std::vector<std::string> trainer_args(const settings& s, const configuration& c) {
    std::vector<std::string> args{"--model",
                                  s.model,
                                  "--target-batch-size",
                                  std::to_string(c.target_batch_size),
                                  "--batch-size",
                                  std::to_string(c.batch_size),
                                  "--lr",
                                  format("%g", c.lr),
                                  "--epochs",
                                  "0",
                                  "--max-samples",
                                  std::to_string(s.samples),
                                  "--seed",
                                  std::to_string(s.seed)};
    if (c.local_updates) args.emplace_back("--local-updates");
    if (c.peers == 0) {
        // --single trains with peers x threads: the whole budget of threads.
        args.insert(args.end(),
                    {"--single", "--peers", "1", "--threads", std::to_string(s.total_threads)});
    } else {
        args.insert(args.end(), {"--peers", std::to_string(c.peers), "--threads",
                                 std::to_string(threads_per_peer(s, c.peers))});
    }
    return args;
}

std::string run_name(const configuration& c) {
    std::string name = c.peers ? std::to_string(c.peers) + "-peers" : "single";
    name += "_target-" + std::to_string(c.target_batch_size) + "_batch-" +
            std::to_string(c.batch_size) + "_lr-" + format("%g", c.lr) +
            (c.local_updates ? "_local" : "");
    return name;
}

/// The run's report from its directory; `o.failure` says why there is none.
void read_report(const fs::path& dir, outcome& o) {
    std::ifstream in(dir / "report" / "report.json");
    auto report = json::parse(in, nullptr, false);
    if (report.is_discarded() || !report.is_object() || !report["test_accuracy"].is_number()) {
        if (o.failure.empty()) o.failure = "no usable report.json in " + dir.string();
        return;
    }
    o.report = std::move(report);
}

outcome run_trainer(const settings& s, const configuration& c) {
    outcome o;
    o.name = run_name(c);
    const auto dir = fs::path(s.runs) / o.name;
    if (s.report_only) {
        std::ifstream(dir / "seconds") >> o.seconds;
        read_report(dir, o);
        return o;
    }
    fs::remove_all(dir);
    fs::create_directories(dir);
    auto args = trainer_args(s, c);
    args.insert(args.end(), {"--report", (dir / "report").string(), "--run-id", o.name});
    const auto started = std::chrono::steady_clock::now();
    try {
        hivemesh::program::child_stdio stdio;
        stdio.stdout_file = (dir / "trainer.log").string();
        stdio.stderr_to_stdout = true;
        const auto child = hivemesh::program::spawn(s.trainer, args, stdio);
        const int status = hivemesh::program::wait_for(child.pid);
        o.seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
        std::ofstream(dir / "seconds") << o.seconds << '\n';
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            o.failure = "the trainer failed: see " + (dir / "trainer.log").string();
    } catch (const std::exception& e) {
        o.failure = e.what();
        return o;
    }
    read_report(dir, o);
    return o;
}

/// The phases' shares of the finished peers' summed wall time (fractions in the fields that
/// hold seconds in a report).
phase_seconds phase_shares(const json& report) {
    phase_seconds seconds;
    double wall = 0;
    for (const auto& p : report["peers"]) {
        if (!p.contains("phases")) continue;
        wall += p.value("wall", 0.0);
        const auto peer = hivemesh::examples::phase_seconds_from_json(p["phases"]);
        for (const auto& [name, field] : phase_fields)
            seconds.*field += peer.*field;
    }
    phase_seconds shares;
    for (const auto& [name, field] : phase_fields)
        shares.*field = wall > 0 ? seconds.*field / wall : 0;
    return shares;
}

double accuracy(const outcome& o) {
    return o.report ? (*o.report)["test_accuracy"].get<double>() : 0;
}
/// The longest training loop of a finished peer (no startup, bootstrap or evaluation).
double training_seconds(const outcome& o) {
    double longest = 0;
    if (o.report)
        for (const auto& p : (*o.report)["peers"])
            longest = std::max(longest, p.value("wall", 0.0));
    return longest;
}
double samples_per_second(const outcome& o) {
    const double seconds = training_seconds(o);
    return seconds > 0 ? (*o.report).value("samples_total", 0.0) / seconds : 0;
}
double averaging_share(const outcome& o) {
    if (!o.report) return 0;
    const auto shares = phase_shares(*o.report);
    return shares.matchmaking + shares.allreduce;
}

/// One row of a factor's table: the swarm's (or single node's) run and its reference.
struct row {
    std::string value;
    const outcome* run = nullptr;
    const outcome* single = nullptr; ///< the single node with the same hyperparameters
};

std::string percent(double share) {
    return format("%.0f%%", 100 * share);
}

void write_table(std::ostream& md, const std::vector<row>& rows) {
    md << "| value | test accuracy | Δ single | wall (s) | training (s) | samples | samples/s | "
          "× single |";
    for (const auto& [name, field] : phase_fields)
        md << ' ' << name << " |";
    md << "\n|---|---:|---:|---:|---:|---:|---:|---:|";
    for (std::size_t i = 0; i < phase_fields.size(); ++i)
        md << "---:|";
    md << '\n';
    for (const auto& r : rows) {
        md << "| " << r.value << " | ";
        if (!r.run->report) {
            md << "failed: " << r.run->failure << " |";
            for (std::size_t i = 0; i < 7 + phase_fields.size(); ++i)
                md << " |";
            md << '\n';
            continue;
        }
        const auto& report = *r.run->report;
        const bool reference_ok = r.single && r.single->report;
        md << format("%.4f", accuracy(*r.run)) << " | "
           << (reference_ok ? format("%+.4f", accuracy(*r.run) - accuracy(*r.single)) : "–")
           << " | " << format("%.1f", report.value("wall_seconds", 0.0)) << " | "
           << format("%.1f", training_seconds(*r.run)) << " | "
           << report.value("samples_total", std::uint64_t{0}) << " | "
           << format("%.0f", samples_per_second(*r.run)) << " | "
           << (reference_ok && samples_per_second(*r.single) > 0
                   ? format("%.2f", samples_per_second(*r.run) / samples_per_second(*r.single))
                   : "–")
           << " |";
        const auto shares = phase_shares(report);
        for (const auto& [name, field] : phase_fields)
            md << ' ' << percent(shares.*field) << " |";
        md << '\n';
    }
}

/// Sentences on what a factor's rows show, from their figures only.
std::string findings(const std::vector<row>& rows) {
    std::vector<const row*> ok;
    for (const auto& r : rows)
        if (r.run->report) ok.push_back(&r);
    if (ok.size() < 2) return "too few runs finished to compare.";
    const auto [worst, best] = std::minmax_element(ok.begin(), ok.end(), [](auto* a, auto* b) {
        return accuracy(*a->run) < accuracy(*b->run);
    });
    std::ostringstream out;
    out << "test accuracy is highest at " << (*best)->value << " ("
        << format("%.4f", accuracy(*(*best)->run)) << ") and lowest at " << (*worst)->value << " ("
        << format("%.4f", accuracy(*(*worst)->run)) << ")";
    // Ten classes: a model near 0.1 guesses; one that ends there diverged.
    constexpr double chance = 0.15;
    std::size_t compared = 0, within = 0;
    std::string diverged, speed;
    for (const auto* r : ok) {
        if (accuracy(*r->run) < chance) diverged += (diverged.empty() ? "" : ", ") + r->value;
        if (!r->single || !r->single->report || r->run == r->single) continue;
        if (accuracy(*r->run) >= chance || accuracy(*r->single) >= chance) {
            ++compared;
            within += std::abs(accuracy(*r->run) - accuracy(*r->single)) <= 0.01;
        }
        if (samples_per_second(*r->single) > 0)
            speed += (speed.empty() ? "" : ", ") +
                     format("×%.2f", samples_per_second(*r->run) / samples_per_second(*r->single)) +
                     " (" + r->value + ")";
    }
    if (!diverged.empty())
        out << "; at " << diverged << " the model ends at chance accuracy: training diverged";
    if (compared)
        out << "; " << within << " of " << compared
            << " swarm runs are within 0.01 of their single node";
    if (!speed.empty()) out << "; samples/s against the single node: " << speed;
    const auto* first = ok.front();
    const auto* last = ok.back();
    out << "; matchmaking and all-reduce take " << percent(averaging_share(*first->run)) << " of "
        << "the peers' time at " << first->value << " and " << percent(averaging_share(*last->run))
        << " at " << last->value;
    const auto [slow, fast] = std::minmax_element(ok.begin(), ok.end(), [](auto* a, auto* b) {
        return samples_per_second(*a->run) < samples_per_second(*b->run);
    });
    out << "; throughput runs from " << format("%.0f", samples_per_second(*(*slow)->run))
        << " samples/s (" << (*slow)->value << ") to "
        << format("%.0f", samples_per_second(*(*fast)->run)) << " (" << (*fast)->value << ").";
    return out.str();
}

std::string gnuplot_quoted(const fs::path& path) {
    return "'" + path.string() + "'";
}

/// Accuracy against samples for each value of a factor (swarm solid, its single node dashed),
/// and for the peers factor the phase shares against the number of peers, drawn into
/// `chart_dir` from data and a gnuplot script written to `data_dir`. Returns the PNG files'
/// names relative to the markdown file, or why there are none.
std::pair<std::map<std::string, std::vector<std::string>>, std::string>
draw_charts(const fs::path& chart_dir, const fs::path& data_dir, const std::string& chart_link,
            const std::vector<std::pair<const factor*, std::vector<row>>>& tables) {
    fs::create_directories(chart_dir);
    fs::create_directories(data_dir);
    std::map<std::string, std::vector<std::string>> pngs;
    const auto script = data_dir / "charts.gp";
    std::ofstream gp(script);
    gp << "set terminal pngcairo size 900,540 noenhanced\nset grid\nset key outside right\n";
    const auto curve_file = [&](const outcome& o) {
        const auto file = data_dir / (o.name + ".dat");
        std::ofstream out(file);
        for (const auto& point : (*o.report)["accuracy_curve"])
            out << point.value("samples", std::uint64_t{0}) << ' '
                << point.value("test_accuracy", 0.0) << '\n';
        return file;
    };
    for (const auto& [f, rows] : tables) {
        const std::string png = "accuracy-" + f->name + ".png";
        gp << "set output " << gnuplot_quoted(chart_dir / png) << "\nset title 'test accuracy ("
           << f->name << "): swarm solid, single node dashed'\n"
           << "set xlabel 'samples'\nset ylabel 'accuracy (first 2000 test images)'\nplot";
        // The peers factor has its single node as a row: no dashed copies of it.
        bool single_is_a_row = false;
        for (const auto& r : rows)
            for (const auto& other : rows)
                single_is_a_row = single_is_a_row || other.run == r.single;
        std::size_t colour = 0, plotted = 0;
        for (const auto& r : rows) {
            ++colour;
            if (!r.run->report) continue;
            gp << (plotted++ ? ", " : " ") << gnuplot_quoted(curve_file(*r.run))
               << " using 1:2 with linespoints lc " << colour << " title '" << r.value << "'";
            if (!single_is_a_row && r.single && r.single->report)
                gp << ", " << gnuplot_quoted(curve_file(*r.single)) << " using 1:2 with lines lc "
                   << colour << " dt 2 title '" << r.value << " single'";
        }
        if (plotted == 0) {
            gp << " NaN notitle\n";
            continue;
        }
        gp << '\n';
        pngs[f->name].push_back(chart_link + "/" + png);
        if (f->name != "peers") continue;
        const auto data = data_dir / "phases-peers.dat";
        {
            std::ofstream out(data);
            out << "peers";
            for (const auto& [name, field] : phase_fields)
                out << ' ' << name;
            out << '\n';
            for (const auto& r : rows) {
                if (!r.run->report) continue;
                const auto shares = phase_shares(*r.run->report);
                out << r.value;
                for (const auto& [name, field] : phase_fields)
                    out << ' ' << 100 * shares.*field;
                out << '\n';
            }
        }
        gp << "set output " << gnuplot_quoted(chart_dir / "phases-peers.png") << '\n'
           << "set title \"where the peers' time goes\"\nset xlabel 'peers'\n"
           << "set ylabel 'share of wall time (%)'\nset yrange [0:105]\n"
           << "set style data histograms\nset style histogram rowstacked\n"
           << "set style fill solid 0.8 border -1\nset boxwidth 0.7\n"
           << "plot for [i=2:" << phase_fields.size() + 1 << "] " << gnuplot_quoted(data)
           << " using i:xtic(1) title columnheader(i)\nset autoscale y\n"
           << "set style data linespoints\n";
        pngs[f->name].push_back(chart_link + "/phases-peers.png");
    }
    gp.close();
    if (auto failure = hivemesh::program::run_gnuplot(script, data_dir / "gnuplot.log"))
        return {{}, *failure};
    return {pngs, ""};
}

std::string today() {
    const auto t = std::time(nullptr);
    char text[32];
    std::strftime(text, sizeof text, "%Y-%m-%d", std::gmtime(&t));
    return text;
}

std::string command_line(const settings& s, bool samples_given, bool threads_given) {
    std::string text = "scripts/thesis-matrix.sh";
    if (s.quick) text += " --quick";
    for (const auto& f : s.only)
        text += " --factor " + f;
    if (samples_given) text += " --samples " + std::to_string(s.samples);
    if (s.model != "cnn") text += " --model " + s.model;
    if (threads_given) text += " --total-threads " + std::to_string(s.total_threads);
    if (s.seed != 1) text += " --seed " + std::to_string(s.seed);
    return text;
}

} // namespace

int main(int argc, char** argv) {
    settings s;
    CLI::App app{"Runs the thesis' experiment grid with collaborative_trainer, one factor at a "
                 "time around a baseline, and writes a markdown report with charts.",
                 "thesis_matrix"};
    app.option_defaults()->always_capture_default();
    app.add_flag("--quick", s.quick, "A subset of the values and half the samples (~10 min)");
    std::vector<std::string> names;
    for (const auto& f : factors())
        names.push_back(f.name);
    app.add_option("--factor", s.only, "Only these factors (repeatable)")
        ->check(CLI::IsMember(names));
    app.add_option("--samples", s.samples, "Samples per run (0: 60000 with --quick, else 120000)")
        ->check(hivemesh::program::non_negative);
    app.add_option("--output", s.output,
                   "The markdown file; its charts go to a directory "
                   "of the same name beside it");
    app.add_option("--runs", s.runs, "Where each run's report and log go");
    app.add_option("--trainer", s.trainer,
                   "The collaborative_trainer program (default: ../examples/ from this one)");
    app.add_option("--model", s.model)->check(CLI::IsMember({"cnn", "mlp"}));
    app.add_option("--total-threads", s.total_threads,
                   "Threads of each configuration, shared by its peers (one each at least; "
                   "0: this machine's cores)")
        ->check(CLI::Range(std::size_t{0}, std::size_t{256}));
    app.add_option("--seed", s.seed);
    app.add_flag("--dry-run", s.dry_run, "Print the runs' command lines and stop");
    app.add_flag("--report-only", s.report_only,
                 "Write the markdown and charts from the reports already in --runs");
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        hivemesh::program::exit_after(app, e);
    }
    const bool samples_given = s.samples != 0;
    if (!samples_given) s.samples = s.quick ? 60000 : 120000;
    const bool threads_given = s.total_threads != 0;
    if (!threads_given) s.total_threads = std::max(1u, std::thread::hardware_concurrency());
    if (s.trainer.empty())
        s.trainer = (fs::read_symlink("/proc/self/exe").parent_path().parent_path() / "examples" /
                     "collaborative_trainer")
                        .string();

    // The rows, and the distinct runs they need (a configuration runs once).
    std::vector<std::pair<const factor*, std::vector<std::pair<std::string, configuration>>>> plan;
    std::vector<configuration> configurations;
    const auto need = [&](const configuration& c) {
        const auto name = run_name(c);
        if (std::none_of(configurations.begin(), configurations.end(),
                         [&](const auto& other) { return run_name(other) == name; }))
            configurations.push_back(c);
    };
    for (const auto& f : factors()) {
        if (!s.only.empty() && std::find(s.only.begin(), s.only.end(), f.name) == s.only.end())
            continue;
        std::vector<std::pair<std::string, configuration>> rows;
        for (const auto& value : s.quick ? f.quick_values : f.values) {
            configuration c;
            f.apply(c, value);
            need(c);
            need(c.single());
            rows.emplace_back(value, c);
        }
        plan.emplace_back(&f, std::move(rows));
    }
    if (s.dry_run) {
        for (const auto& c : configurations) {
            std::printf("%s", s.trainer.c_str());
            for (const auto& a : trainer_args(s, c))
                std::printf(" %s", a.c_str());
            std::printf("\n");
        }
        return 0;
    }
    if (!s.report_only && !fs::exists(s.trainer)) {
        std::fprintf(stderr,
                     "thesis_matrix: %s not found: build collaborative_trainer or "
                     "give --trainer\n",
                     s.trainer.c_str());
        return 1;
    }

    std::map<std::string, outcome> outcomes;
    std::size_t failed = 0;
    double minutes = 0; // the runs' own, so that --report-only gives the same
    for (std::size_t i = 0; i < configurations.size(); ++i) {
        const auto& c = configurations[i];
        std::printf("[%zu/%zu] %s ... ", i + 1, configurations.size(), run_name(c).c_str());
        std::fflush(stdout);
        auto o = run_trainer(s, c);
        if (o.report)
            std::printf("accuracy %.4f, %.0f samples/s, %.0f s\n", accuracy(o),
                        samples_per_second(o), o.seconds);
        else
            std::printf("%s\n", o.failure.c_str());
        failed += !o.report;
        minutes += o.seconds / 60;
        outcomes.emplace(o.name, std::move(o));
    }

    std::vector<std::pair<const factor*, std::vector<row>>> tables;
    for (const auto& [f, planned] : plan) {
        std::vector<row> rows;
        for (const auto& [value, c] : planned)
            rows.push_back({value, &outcomes.at(run_name(c)), &outcomes.at(run_name(c.single()))});
        tables.emplace_back(f, std::move(rows));
    }
    const fs::path output(s.output);
    const auto chart_dir = output.parent_path() / output.stem();
    const auto [charts, charts_note] =
        draw_charts(chart_dir, fs::path(s.runs) / "charts", output.stem().string(), tables);

    std::ostringstream md;
    md << "# The thesis matrix\n\n"
       << "Where the time goes when peers train one model together, and how a swarm compares "
          "with one node, measured with `examples/collaborative_trainer` on Fashion-MNIST. "
          "Generated by `"
       << command_line(s, samples_given, threads_given) << "` (" << configurations.size()
       << " runs, " << format("%.1f", minutes) << " minutes, " << today() << ").\n\n"
       << "- Every run trains the " << s.model << " model on " << s.samples
       << " samples (rounded up to whole collaborative epochs), seed " << s.seed
       << ", Adam, and is evaluated on the 10,000 test images (peer 0's final model).\n"
       << "- A table changes one factor from the baseline: 4 peers, target batch size 1250, "
          "batch size 64, learning rate 0.01, gradient averaging.\n"
       << "- Each configuration holds " << s.total_threads << " threads in total"
       << (threads_given ? "" : " (this machine's cores)")
       << ", split among its peers, one each at least (more peers than threads run one "
          "each); the single node runs `--single` with all of them.\n"
       << "- Δ single is the test accuracy minus that of the single node with the same "
          "hyperparameters and samples. Wall is the whole run (process start, bootstrap, "
          "training and evaluation); training is the longest peer's training loop, and "
          "samples/s is the samples over it; × single is that over the single node's.\n"
       << "- The phase columns are shares of the peers' summed wall time (the trainer's "
          "report, see docs/architecture.md).\n"
       << "- Each cell is one run. A swarm's epochs depend on when its peers' batches land, "
          "so its runs are not repeatable to the bit, and the time figures move with the "
          "machine's load: read differences against the spread of repeated runs "
          "(docs/benchmarks.md gives it for the quick grid).\n\n"
       << "## What the grid shows\n\n";
    for (const auto& [f, rows] : tables)
        md << "- **" << f->name << "**: " << findings(rows) << '\n';
    md << '\n';
    if (!charts_note.empty()) md << "No charts: " << charts_note << "\n\n";
    for (const auto& [f, rows] : tables) {
        md << "## " << f->title << "\n\n";
        write_table(md, rows);
        md << '\n';
        if (charts.count(f->name))
            for (const auto& png : charts.at(f->name))
                md << "![" << f->name << "](" << png << ")\n\n";
    }
    md << "## The runs\n\n"
       << "Each run is `collaborative_trainer` with these options (and `--report`, "
          "`--run-id`):\n\n```\n";
    for (const auto& c : configurations) {
        for (const auto& a : trainer_args(s, c))
            md << a << ' ';
        md << '\n';
    }
    md << "```\n";
    fs::create_directories(output.parent_path().empty() ? "." : output.parent_path());
    std::ofstream(output) << md.str();
    std::printf("%s written (%zu runs, %zu failed, %.1f minutes)\n", output.string().c_str(),
                configurations.size(), failed, minutes);
    return failed ? 1 : 0;
}
