// The collaborative trainer's launcher: it starts the peer processes (copies of this program
// with --worker), reads their events, draws the live view, replaces peers under --churn, and
// collects what the report needs.
#pragma once

#include "options.hpp"
#include "process.hpp"

#include <nlohmann/json.hpp>

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace hivemesh::examples {

/// One peer process as the launcher saw it.
struct peer_record {
    std::size_t rank = 0;
    pid_t pid = -1;
    int output = -1; ///< its stdout, read here; -1 once closed
    std::string partial_line;
    bool alive = true;
    bool killed = false;           ///< by --churn or --kill
    bool stopped_unjoined = false; ///< a replacement stopped because the run ended before it joined
    int exit_status = 0;           ///< as waitpid gives it
    double started = 0;            ///< seconds since the launch
    std::optional<double> joined, left;
    std::uint64_t joined_epoch = 0, joined_global_epoch = 0;
    std::optional<std::uint64_t> resumed_from_epoch; ///< the epoch of its checkpoint
    bool joined_state_loaded = false;
    std::vector<std::string> addresses;
    nlohmann::json progress = nlohmann::json::object(); ///< the latest progress event
    std::optional<nlohmann::json> done;
    std::string error;
};

/// A model snapshot of peer 0.
struct snapshot_record {
    std::uint64_t epoch = 0;
    std::string file;
    bool final = false;
};

/// One row of metrics.csv.
struct metric_row {
    double time = 0;
    std::size_t rank = 0;
    std::uint64_t epoch = 0, samples = 0;
    double loss = 0;
};

/// What a run leaves for the report.
struct run_record {
    std::vector<peer_record> peers;
    std::vector<snapshot_record> snapshots;
    std::vector<metric_row> metrics;
    double wall_seconds = 0;
    std::vector<std::string> messages; ///< errors and warnings the peers sent
};

namespace detail {

/// "RANK@SECONDS" of --kill; std::invalid_argument when malformed.
inline std::pair<std::size_t, double> parse_kill(const std::string& text) {
    const auto at = text.find('@');
    try {
        if (at == std::string::npos) throw std::invalid_argument("");
        std::size_t used = 0;
        const auto rank = std::stoul(text.substr(0, at), &used);
        if (used != at) throw std::invalid_argument("");
        const double when = std::stod(text.substr(at + 1), &used);
        if (used != text.size() - at - 1 || !(when >= 0)) throw std::invalid_argument("");
        return {rank, when};
    } catch (const std::exception&) {
        throw std::invalid_argument("--kill \"" + text + "\": expected RANK@SECONDS, e.g. 2@10");
    }
}

/// The live view: a line per peer redrawn in place on a terminal, plain lines every few
/// seconds otherwise.
class live_view {
public:
    live_view(const trainer_options& o)
        : o_(o)
        , terminal_(isatty(STDOUT_FILENO) == 1) {}

    void draw(const std::vector<peer_record>& peers, double now, bool force = false) {
        if (!force && now - last_ < (terminal_ ? 0.25 : 5.0)) return;
        last_ = now;
        std::vector<std::string> lines;
        std::uint64_t global_epoch = 0;
        double swarm_rate = 0;
        std::optional<double> next_round;
        std::size_t live = 0;
        for (const auto& p : peers) {
            const auto& g = p.progress;
            // A finished peer's last progress line may be an epoch short of its end.
            const std::uint64_t epoch =
                (p.done ? *p.done : g).value("epoch", g.value("epoch", std::uint64_t{0}));
            global_epoch = std::max(
                {global_epoch, g.value("global_epoch", std::uint64_t{0}), p.done ? epoch : 0});
            if (!p.alive && !terminal_ && !force) continue;
            if (p.alive) {
                ++live;
                swarm_rate += g.value("samples_per_second", 0.0);
            }
            if (g.contains("next_round") && g["next_round"].is_number())
                next_round = g["next_round"].get<double>();
            lines.push_back(peer_line(p, epoch));
        }
        lines.insert(
            lines.begin(),
            program::format(
                "[%6.1f s] %s: global epoch %llu, %zu of %zu peers running, %.0f samples/s%s", now,
                o_.single ? "single node" : "swarm", static_cast<unsigned long long>(global_epoch),
                live, peers.size(), swarm_rate,
                next_round ? program::format(", next round in %.1f s", *next_round).c_str() : ""));
        if (terminal_) {
            if (drawn_ > 0) std::printf("\x1b[%zuA", drawn_);
            for (const auto& l : lines)
                std::printf("\x1b[2K%s\n", l.c_str());
            drawn_ = lines.size();
        } else {
            for (const auto& l : lines)
                std::printf("%s\n", l.c_str());
        }
        std::fflush(stdout);
    }

    /// Prints a line above the view (a terminal's view is redrawn below it).
    void note(const std::string& text) {
        if (terminal_ && drawn_ > 0) {
            std::printf("\x1b[%zuA\x1b[J", drawn_);
            drawn_ = 0;
        }
        std::printf("%s\n", text.c_str());
        std::fflush(stdout);
        last_ = -1e9;
    }

private:
    std::string peer_line(const peer_record& p, std::uint64_t epoch) const {
        const auto& g = p.progress;
        const std::uint64_t limit = o_.epoch_limit();
        constexpr int width = 24;
        const double fraction =
            limit ? std::min(1.0, static_cast<double>(epoch) / static_cast<double>(limit)) : 0;
        std::string bar(static_cast<std::size_t>(std::lround(fraction * width)), '#');
        bar.resize(width, '.');
        const char* state =
            p.alive ? (p.joined ? "" : " starting")
                    : (p.killed ? " killed" : (p.stopped_unjoined ? " not joined" : " done"));
        return program::format(
            "  peer %-3zu [%s] epoch %4llu%s  %7.0f samples/s  loss %6.4f%s%s", p.rank, bar.c_str(),
            static_cast<unsigned long long>(epoch),
            limit ? ("/" + std::to_string(limit)).c_str() : "", g.value("samples_per_second", 0.0),
            g.value("loss", 0.0),
            p.alive && g.contains("next_round") && g["next_round"].is_number()
                ? program::format("  next round %.1f s", g["next_round"].get<double>()).c_str()
                : "",
            state);
    }

    const trainer_options& o_;
    bool terminal_;
    std::size_t drawn_ = 0;
    double last_ = -1e9;
};

} // namespace detail

/// Runs the peer processes to the end; `program` is this executable and `args` the command
/// line it was given (passed on to every peer). Throws std::runtime_error when the first peer
/// cannot start.
class launcher {
public:
    using clock = std::chrono::steady_clock;

    launcher(const trainer_options& o, std::string program, std::vector<std::string> args)
        : o_(o)
        , program_(std::move(program))
        , args_(std::move(args))
        , view_(o)
        , random_(o.seed)
        , started_(clock::now()) {
        for (const auto& k : o.kill)
            kills_.push_back(detail::parse_kill(k));
    }

    run_record run() {
        std::signal(SIGTERM, detail::request_stop);
        std::signal(SIGINT, detail::request_stop);
        std::filesystem::create_directories(std::filesystem::path(o_.report) / "logs");
        const std::size_t initial = o_.single || o_.multi_host() ? 1 : o_.peers;
        start_peer(initial);
        if (initial > 1) {
            // The others bootstrap from the first, so they start once it listens.
            while (record_.peers[0].addresses.empty() && record_.peers[0].alive)
                pump(0.1);
            if (record_.peers[0].addresses.empty())
                throw std::runtime_error("the first peer did not start: " +
                                         first_error(record_.peers[0]));
            for (std::size_t i = 1; i < initial; ++i)
                start_peer(initial);
        }
        double next_churn = o_.churn;
        bool stopping = false;
        while (std::any_of(record_.peers.begin(), record_.peers.end(),
                           [](const peer_record& p) { return p.alive; })) {
            pump(0.1);
            const double t = now();
            if (detail::stop_requested && !stopping) {
                // Ctrl-C or SIGTERM: the peers stop after their current step and report.
                stopping = true;
                kills_.clear();
                for (const auto& p : record_.peers)
                    if (p.alive) ::kill(p.pid, SIGTERM);
                view_.note("stopping: the peers finish their current step");
            }
            if (!stopping && o_.churn > 0 && t >= next_churn) {
                next_churn += o_.churn;
                if (churning()) replace_random_peer();
            }
            for (auto it = kills_.begin(); it != kills_.end();) {
                if (t < it->second) {
                    ++it;
                    continue;
                }
                kill_peer(it->first);
                it = kills_.erase(it);
            }
            view_.draw(record_.peers, t);
        }
        view_.draw(record_.peers, now(), true);
        record_.wall_seconds = now();
        return std::move(record_);
    }

private:
    double now() const { return std::chrono::duration<double>(clock::now() - started_).count(); }

    static std::string first_error(const peer_record& p) {
        return p.error.empty() ? "it exited (see its log)" : p.error;
    }

    void start_peer(std::size_t expect_peers) {
        const std::size_t rank = record_.peers.size();
        std::vector<std::string> args = args_;
        args.insert(args.end(), {"--worker", "--rank", std::to_string(rank), "--expect-peers",
                                 std::to_string(expect_peers)});
        if (rank > 0) {
            args.push_back("--bootstrap");
            args.push_back(record_.peers[0].addresses.front());
        }
        const auto log =
            (std::filesystem::path(o_.report) / "logs" / ("peer-" + std::to_string(rank) + ".log"))
                .string();
        program::child_stdio stdio;
        stdio.stdout_pipe = true;
        stdio.stderr_file = log;
        const auto child = program::spawn(program_, args, stdio);
        peer_record p;
        p.rank = rank;
        p.pid = child.pid;
        p.output = child.stdout_fd;
        p.started = now();
        record_.peers.push_back(std::move(p));
    }

    /// Churn goes on while every peer is still training, short of the last epoch.
    bool churning() const {
        for (const auto& p : record_.peers) {
            if (p.done) return false;
            const auto g = p.progress.value("global_epoch", std::uint64_t{0});
            if (o_.epoch_limit() > 0 && g + 1 >= o_.epoch_limit()) return false;
        }
        return true;
    }

    void replace_random_peer() {
        std::vector<std::size_t> candidates;
        for (const auto& p : record_.peers)
            if (p.rank != 0 && p.alive && p.joined) candidates.push_back(p.rank);
        if (candidates.empty()) return;
        const auto rank = candidates[std::uniform_int_distribution<std::size_t>(
            0, candidates.size() - 1)(random_)];
        kill_peer(rank);
        start_peer(1);
        view_.note("churn: killed peer " + std::to_string(rank) + ", started peer " +
                   std::to_string(record_.peers.size() - 1));
    }

    void kill_peer(std::size_t rank) {
        if (rank >= record_.peers.size() || !record_.peers[rank].alive) return;
        auto& p = record_.peers[rank];
        ::kill(p.pid, SIGKILL);
        p.killed = true;
    }

    /// Waits up to `timeout` seconds for output, then handles every complete line and every
    /// peer whose output ended.
    void pump(double timeout) {
        std::vector<pollfd> polled;
        std::vector<std::size_t> owners;
        for (auto& p : record_.peers)
            if (p.output >= 0) {
                polled.push_back({p.output, POLLIN, 0});
                owners.push_back(p.rank);
            }
        if (polled.empty()) {
            reap();
            return;
        }
        if (poll(polled.data(), polled.size(), static_cast<int>(timeout * 1000)) < 0) return;
        for (std::size_t i = 0; i < polled.size(); ++i) {
            if (!(polled[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            auto& p = record_.peers[owners[i]];
            char buffer[8192];
            const auto n = read(p.output, buffer, sizeof buffer);
            if (n <= 0) {
                close(p.output);
                p.output = -1;
                continue;
            }
            p.partial_line.append(buffer, static_cast<std::size_t>(n));
            for (auto nl = p.partial_line.find('\n'); nl != std::string::npos;
                 nl = p.partial_line.find('\n')) {
                const std::string line = p.partial_line.substr(0, nl);
                p.partial_line.erase(0, nl + 1);
                handle(p, line);
            }
        }
        reap();
    }

    void reap() {
        for (auto& p : record_.peers) {
            if (!p.alive || p.output >= 0) continue;
            waitpid(p.pid, &p.exit_status, 0);
            p.alive = false;
            p.left = now();
            if (!p.killed && !p.stopped_unjoined && !p.done && p.error.empty())
                p.error = "exited without finishing (status " + std::to_string(p.exit_status) +
                          "); see " + o_.report + "/logs/peer-" + std::to_string(p.rank) + ".log";
            if (!p.error.empty()) view_.note("peer " + std::to_string(p.rank) + ": " + p.error);
        }
    }

    void handle(peer_record& p, const std::string& line) {
        const auto e = nlohmann::json::parse(line, nullptr, false);
        if (e.is_discarded() || !e.is_object()) return;
        const std::string event = e.value("event", "");
        if (event == "listening") {
            p.addresses = e.value("addresses", std::vector<std::string>{});
            if (p.rank == 0 && !p.addresses.empty()) {
                std::string text = "peer 0 listens at:";
                for (const auto& a : p.addresses)
                    text += "\n  " + a;
                text += "\nwatch the run with: monitor --join " + p.addresses.front() +
                        " --run-id " + o_.run_id + " --target-batch-size " +
                        std::to_string(o_.target_batch_size);
                if (o_.multi_host())
                    text += "\njoin it from another machine with: collaborative_trainer --join " +
                            p.addresses.front();
                view_.note(text);
            }
        } else if (event == "joined") {
            p.joined = now();
            p.joined_epoch = e.value("epoch", std::uint64_t{0});
            p.joined_global_epoch = e.value("global_epoch", std::uint64_t{0});
            p.joined_state_loaded = e.value("state_loaded", false);
            if (e.contains("resumed_from_epoch") && e["resumed_from_epoch"].is_number())
                p.resumed_from_epoch = e["resumed_from_epoch"].get<std::uint64_t>();
        } else if (event == "progress") {
            p.progress = e;
            record_.metrics.push_back({now(), p.rank, e.value("epoch", std::uint64_t{0}),
                                       e.value("samples", std::uint64_t{0}), e.value("loss", 0.0)});
        } else if (event == "snapshot") {
            record_.snapshots.push_back(
                {e.value("epoch", std::uint64_t{0}), e.value("file", ""), e.value("final", false)});
        } else if (event == "done") {
            p.done = e;
            // A replacement still joining would find the swarm gone: it is not started late.
            for (auto& other : record_.peers)
                if (other.alive && !other.joined && other.rank != 0) {
                    ::kill(other.pid, SIGKILL);
                    other.stopped_unjoined = true;
                }
        } else if (event == "error" || event == "warning") {
            const std::string message = e.value("message", "");
            if (event == "error") p.error = message;
            record_.messages.push_back("peer " + std::to_string(p.rank) + ": " + message);
            if (event == "warning") view_.note("peer " + std::to_string(p.rank) + ": " + message);
        }
    }

    const trainer_options& o_;
    std::string program_;
    std::vector<std::string> args_;
    detail::live_view view_;
    std::mt19937_64 random_;
    clock::time_point started_;
    std::vector<std::pair<std::size_t, double>> kills_;
    run_record record_;
};

} // namespace hivemesh::examples
