// All-reduce benchmark: a vector of float32 (default 25M elements, 100 MB) averaged among 2, 4
// and 8 OS processes over loopback TCP, or with --link RATE each in a network namespace of its
// own behind a link shaped to RATE (scripts/netns-swarm.sh: veth pairs into a bridge, tc tbf
// both ways; needs root). Rows: hivemesh's butterfly all-reduce (plaintext and encrypted
// sessions, codecs none, float16 and blockwise_8bit, and the adaptive choice, which weighs the
// link rate every member announces against this process's blockwise_8bit rate), the same
// bytes in the same pattern over bare TCP sockets with no reduction (the floor for the
// butterfly's traffic) and, when they were found at build time, Gloo's ring and
// halving-doubling all-reduce over its TCP transport and MPI_Allreduce under mpirun with the
// TCP BTL only. Prints a table and, with --json FILE, the same as JSON; exits nonzero when any
// configuration failed or any process got a wrong result.
//
// Every process of a configuration is a child: hivemesh, bare TCP and Gloo children are
// started by this program (`--child hivemesh|tcp|gloo`) and talk to it over stdin/stdout; MPI
// children are started by mpirun (`--child mpi`) and write their record to a file. Line
// protocol:
//   child: HELLO <peer id> <address> <port>
//                            parent: PEERS <id> <address> <port> ...   (hivemesh and tcp only)
//   child: READY <n>                parent: GO                       (barrier n: 2 per round)
//   child: RESULT <record>          parent: EXIT
// A child that fails prints `ERROR <text>` and exits nonzero; a hung one dies by SIGALRM.
//
// Timing. Every round, each process fills its tensor (value 4·rank + 0.25·(i mod 33), so
// the mean is known exactly), waits at the barrier, reads the monotonic clock (one clock for
// all processes of the machine), runs the all-reduce including the division by N into a
// mean, reads the clock again and waits at a second barrier before checking its result (so
// no process checks while others still average); a round lasts from the earliest start to
// the latest end. CPU is the user plus system time all processes spent inside the round
// (getrusage), and switches their context switches: the cost behind the time on a machine
// with fewer cores than processes.
// The report is the median over the timed rounds, after the warm-up rounds (which also open
// the connections). Bandwidth is the algorithm bandwidth: tensor bytes (elements·4) divided
// by the median round time, in GB/s (10^9 bytes).
//
// Memory. Each process reads VmRSS right after allocating and filling its tensor and VmHWM at
// the end; the extra memory ratio is (VmHWM − that RSS) / tensor bytes, the largest over the
// processes.
//
// Correctness. After every round each process compares its tensor with the exact mean: within
// float rounding for exact reductions, within the codec's error bound for float16 and
// blockwise_8bit (far below the distance from any process's own values to the mean, so a
// part left unaveraged is caught); hivemesh must also report every element averaged. The bare
// TCP row reduces nothing and is not checked.
#include <hivemesh/averaging/allreduce.hpp>
#include <hivemesh/averaging/group.hpp>
#include <hivemesh/averaging/load_balancing.hpp>
#include <hivemesh/core/log.hpp>
#include <hivemesh/net/node.hpp>
#include <hivemesh/net/tcp.hpp>

#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/read.hpp>
#include <asio/thread_pool.hpp>
#include <asio/write.hpp>

#include "program.hpp"
#include "statistics.hpp"

#ifdef HIVEMESH_HAVE_GLOO
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#endif
#ifdef HIVEMESH_HAVE_MPI
#include <mpi.h>
#endif

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

using namespace std::chrono_literals;

namespace hivemesh::bench::allreduce {
namespace {

// ---- options -------------------------------------------------------------------------------

struct options {
    // What to run (driver).
    std::vector<std::size_t> processes{2, 4, 8};
    std::size_t elements = 25'000'000;
    std::size_t warmup = 1;
    std::size_t rounds = 3;
    std::size_t passes = 1;           ///< times the whole table is measured, cells interleaved
    std::vector<std::string> systems; ///< empty: every row that was built
    std::string json_path;
    bool quick = false;
    // hivemesh tuning (forwarded to hivemesh children).
    std::size_t part_size = 512u << 10;
    std::size_t mux_window = 0;    ///< 0: the node's default
    std::size_t frame_payload = 0; ///< 0: the node's default
    std::size_t mux_batch = 0;     ///< 0: the node's default
    unsigned compute_threads = 1;
    unsigned child_timeout = 1800; ///< seconds a child may live
    /// tc's rate of every link (e.g. 100mbit), or of rank k's link at [k]; empty: loopback.
    /// With it, each process runs in a network namespace of its own (scripts/netns-swarm.sh).
    std::vector<std::string> links;
    /// With links: the TCP congestion control of the namespaces; empty: the host's.
    std::string congestion;
    /// The last `clients` ranks of a hivemesh cell join as clients: they reduce nothing.
    std::size_t clients = 0;
    /// Rank k's link rate in bytes per second; 0 on loopback.
    double link_rate(std::size_t k) const;
    /// Whether the links differ, or some rank is a client.
    bool heterogeneous() const;
    // Child only.
    std::string child; ///< hivemesh, tcp, gloo, mpi; empty in the driver
    std::size_t rank = 0;
    std::size_t size = 0;
    std::string mode; ///< hivemesh: codec; gloo: ring or hd
    bool plaintext = true;
    std::string dir;
    std::uint64_t nonce = 0;
    std::string address; ///< where the child listens; empty: loopback
};

/// A tc rate ("100mbit", "1gbit", "2.5gbit", "800kbit", "9600bit") in bytes per second; 0 for
/// anything else.
double link_bytes_per_second(const std::string& rate) {
    std::size_t used = 0;
    double value = 0;
    try {
        value = std::stod(rate, &used);
    } catch (const std::exception&) {
        return 0;
    }
    const std::string unit = rate.substr(used);
    double scale = 0;
    if (unit == "bit") scale = 1;
    if (unit == "kbit") scale = 1e3;
    if (unit == "mbit") scale = 1e6;
    if (unit == "gbit") scale = 1e9;
    const double bytes = value * scale / 8;
    return std::isfinite(bytes) && bytes > 0 ? bytes : 0;
}

double options::link_rate(std::size_t k) const {
    if (links.empty()) return 0;
    return link_bytes_per_second(links.size() == 1 ? links[0] : links.at(k));
}

bool options::heterogeneous() const {
    return clients > 0 ||
           std::adjacent_find(links.begin(), links.end(), std::not_equal_to<>()) != links.end();
}

/// The --link list as given: rates joined by commas.
std::string joined(const std::vector<std::string>& words) {
    std::string out;
    for (const auto& w : words)
        out += (out.empty() ? "" : ",") + w;
    return out;
}

/// One row of the table.
struct system_spec {
    std::string name;  ///< for --systems
    std::string label; ///< for the table
    std::string child; ///< hivemesh, tcp, gloo or mpi
    std::string mode;  ///< codec, or Gloo's algorithm
    bool plaintext = true;
    bool built = true;
};

std::vector<system_spec> all_systems() {
#ifdef HIVEMESH_HAVE_GLOO
    constexpr bool gloo = true;
#else
    constexpr bool gloo = false;
#endif
#ifdef HIVEMESH_HAVE_MPI
    constexpr bool mpi = true;
#else
    constexpr bool mpi = false;
#endif
    return {
        {"hivemesh", "hivemesh plaintext none", "hivemesh", "none", true, true},
        {"hivemesh-uniform", "hivemesh none, uniform split", "hivemesh", "uniform", true, true},
        {"hivemesh-encrypted", "hivemesh encrypted none", "hivemesh", "none", false, true},
        {"hivemesh-float16", "hivemesh plaintext float16", "hivemesh", "float16", true, true},
        {"hivemesh-8bit", "hivemesh plaintext blockwise_8bit", "hivemesh", "blockwise_8bit", true,
         true},
        {"hivemesh-adaptive", "hivemesh plaintext adaptive", "hivemesh", "adaptive", true, true},
        {"tcp", "bare TCP, same bytes, no reduction", "tcp", "none", true, true},
        {"gloo-ring", "gloo ring", "gloo", "ring", true, gloo},
        {"gloo-hd", "gloo halving-doubling", "gloo", "hd", true, gloo},
        {"mpi", "MPI_Allreduce (Open MPI, TCP)", "mpi", "none", true, mpi},
    };
}

options parse(int argc, char** argv) {
    CLI::App app{"All-reduce benchmark: a float32 vector averaged among OS processes over loopback "
                 "TCP, or shaped links between network namespaces (--link), by hivemesh (and "
                 "Gloo and MPI when they were built).",
                 "bench_allreduce"};
    app.option_defaults()->always_capture_default();
    options o;
    std::vector<std::string> names;
    for (const auto& s : all_systems())
        names.push_back(s.name);
    const auto add_count = [&](const std::string& name, auto& value, const std::string& help) {
        return app.add_option(name, value, help)->check(program::non_negative);
    };
    app.add_flag("--quick", o.quick,
                 "2 processes, 2^20 elements, 1 warm-up and 2 timed rounds (flags given "
                 "explicitly still win)");
    auto* processes = app.add_option("--processes", o.processes, "process counts, a cell each")
                          ->delimiter(',')
                          ->check(program::non_negative);
    // Gloo and MPI take int counts.
    auto* elements =
        app.add_option("--elements", o.elements, "float32 in the vector")
            ->check(CLI::Range(std::size_t{1},
                               static_cast<std::size_t>(std::numeric_limits<int>::max())));
    add_count("--warmup", o.warmup, "untimed rounds first (they also open the connections)");
    auto* rounds = app.add_option("--rounds", o.rounds, "timed rounds")->check(program::positive);
    app.add_option("--passes", o.passes,
                   "measure the whole table P times, each cell with fresh processes, the order of "
                   "the systems reversed on every other pass; medians over all P x R rounds (the "
                   "machine's speed drifts, and cells measured minutes apart compare badly)")
        ->check(program::positive);
    app.add_option("--systems", o.systems,
                   "rows to run (default: every one that was built; unbuilt ones are skipped)")
        ->delimiter(',')
        ->check(CLI::IsMember(names))
        ->default_str("");
    app.add_option("--json", o.json_path, "also write the table as JSON to FILE")
        ->type_name("FILE");
    add_count("--part-size", o.part_size, "hivemesh's all-reduce part size in bytes");
    add_count("--mux-window", o.mux_window, "hivemesh's mux window in bytes (0: the default)");
    add_count("--frame-payload", o.frame_payload,
              "hivemesh's largest frame payload in bytes (0: the default)");
    add_count("--mux-batch", o.mux_batch, "hivemesh's mux batch in bytes (0: the default)");
    add_count("--compute-threads", o.compute_threads,
              "hivemesh's pool for compression and reduction per process; 0 runs them on the "
              "io thread");
    add_count("--child-timeout", o.child_timeout, "seconds a child process may live");
    app.add_option("--link", o.links,
                   "run every process in a Linux network namespace of its own, its link to "
                   "a bridge shaped both ways to RATE by tc's token bucket filter (e.g. "
                   "100mbit, 1gbit; scripts/netns-swarm.sh); a comma-separated list with a "
                   "rate per rank (as many as the largest process count) shapes rank k's "
                   "link to the k-th, and hivemesh members announce their own rate for load "
                   "balancing; needs root and ip netns, and says so and exits 0 without them")
        ->type_name("RATE[,RATE...]")
        ->delimiter(',')
        ->check([](const std::string& rate) {
            return link_bytes_per_second(rate) > 0 ? std::string()
                                                   : std::string("a tc rate such as 100mbit");
        });
    app.add_option("--congestion", o.congestion,
                   "with --link: the TCP congestion control in every namespace (cubic, bbr, "
                   "reno; net.ipv4.tcp_available_congestion_control lists them); default: "
                   "the host's (net.ipv4.tcp_congestion_control)")
        ->type_name("NAME");
    add_count("--clients", o.clients,
              "the last C ranks of every hivemesh cell join as clients, which accept no "
              "connections and reduce nothing (Gloo and MPI have no such role: every rank "
              "reduces); the default rows then include hivemesh-uniform, which splits the "
              "vector evenly among the other ranks where hivemesh balances it by link rate")
        ->type_name("C");
    // A child process of a cell (started by the driver, or by mpirun).
    app.add_option("--child", o.child, "internal: run as a child of this kind")
        ->check(CLI::IsMember({"hivemesh", "tcp", "gloo", "mpi"}))
        ->group("");
    add_count("--rank", o.rank, "internal: the child's rank")->group("");
    add_count("--size", o.size, "internal: the processes of the cell")->group("");
    app.add_option("--mode", o.mode, "internal: codec, or Gloo's algorithm")->group("");
    app.add_option("--plaintext", o.plaintext, "internal: 1 for plaintext sessions")->group("");
    app.add_option("--dir", o.dir, "internal: the cell's directory")->group("");
    add_count("--nonce", o.nonce, "internal: the cell's group id")->group("");
    app.add_option("--address", o.address, "internal: the child's address")->group("");
    try {
        app.parse(argc, argv);
        if (o.quick) {
            if (!processes->count()) o.processes = {2};
            if (!elements->count()) o.elements = std::size_t{1} << 20;
            if (!rounds->count()) o.rounds = 2;
        }
        for (const auto n : o.processes) {
            if (n < 2) throw CLI::ValidationError("--processes", "at least 2 each");
            if (o.clients >= n && o.child.empty())
                throw CLI::ValidationError("--clients", "fewer than every process count");
        }
        const auto most = *std::max_element(o.processes.begin(), o.processes.end());
        if (o.links.size() > 1 && o.links.size() != most && o.child.empty())
            throw CLI::ValidationError("--link", "one rate, or one per rank of the largest "
                                                 "process count (" +
                                                     std::to_string(most) + ")");
        if (o.part_size < sizeof(float)) throw CLI::ValidationError("--part-size", "at least 4");
    } catch (const CLI::ParseError& e) {
        program::exit_after(app, e);
    }
    return o;
}

// ---- what every child does -------------------------------------------------------------------

double clock_seconds() {
    // steady_clock is CLOCK_MONOTONIC: the same clock in every process of the machine.
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

/// A field of /proc/self/status in KiB ("VmRSS", "VmHWM").
std::size_t status_kib(std::string_view field) {
    std::ifstream status("/proc/self/status");
    std::string line;
    while (std::getline(status, line))
        if (line.size() > field.size() && line.compare(0, field.size(), field) == 0 &&
            line[field.size()] == ':')
            return std::stoull(line.substr(field.size() + 1));
    return 0;
}

/// Rank r's values: 4r + 0.25 (i mod 33). Dyadic and small, so sums are exact in float.
void fill(std::span<float> values, std::size_t rank) {
    std::array<float, 33> period;
    for (std::size_t c = 0; c < period.size(); ++c)
        period[c] = 4.0f * static_cast<float>(rank) + 0.25f * static_cast<float>(c);
    for (std::size_t i = 0; i < values.size(); i += period.size())
        std::copy_n(period.begin(), std::min(period.size(), values.size() - i), values.begin() + i);
}

/// The largest distance to the exact mean over n ranks: 2(n-1) + 0.25 (i mod 33).
double max_error(std::span<const float> values, std::size_t n) {
    std::array<double, 33> mean;
    for (std::size_t c = 0; c < mean.size(); ++c)
        mean[c] = 2.0 * static_cast<double>(n - 1) + 0.25 * static_cast<double>(c);
    double worst = 0;
    for (std::size_t i = 0; i < values.size(); i += mean.size()) {
        const std::size_t count = std::min(mean.size(), values.size() - i);
        for (std::size_t c = 0; c < count; ++c) {
            const double e = std::abs(static_cast<double>(values[i + c]) - mean[c]);
            if (!(e <= worst)) worst = e; // NaN wins
        }
    }
    return worst;
}

/// The error a correct round may have: the codec's bound (two quantisations: the value and
/// the mean) with a margin. The smallest distance from a rank's own values to the mean is 2.
double tolerance(const std::string& codec, std::size_t n) {
    const double largest = 4.0 * static_cast<double>(n - 1) + 8.0;
    if (codec == "float16") return 4 * 0x1p-11 * largest;
    // The adaptive choice may send blockwise_8bit.
    if (codec == "blockwise_8bit" || codec == "adaptive") return 2.5 * 0.00703125 * largest;
    return 1e-6 * largest; // exact up to the rounding of 1/n
}

/// One process's record of a configuration.
struct child_record {
    std::size_t baseline_kib = 0; ///< VmRSS after the tensor was allocated and filled
    std::size_t peak_kib = 0;     ///< VmHWM at the end
    double max_error = 0;         ///< worst over rounds
    double min_fraction = 1;      ///< hivemesh: smallest fraction averaged; 1 for the others
    std::size_t wrong_rounds = 0; ///< rounds over tolerance or not fully averaged
    std::vector<double> starts, ends;
    std::vector<double> cpu_seconds; ///< user + system time of the process during each round
    std::vector<long> switches;      ///< its context switches during each round

    std::string to_line() const {
        std::ostringstream out;
        out.precision(17);
        out << baseline_kib << ' ' << peak_kib << ' ' << max_error << ' ' << min_fraction << ' '
            << wrong_rounds << ' ' << starts.size();
        for (std::size_t r = 0; r < starts.size(); ++r)
            out << ' ' << starts[r] << ' ' << ends[r] << ' ' << cpu_seconds[r] << ' '
                << switches[r];
        return out.str();
    }
    static std::optional<child_record> from_line(const std::string& line) {
        std::istringstream in(line);
        child_record c;
        std::size_t rounds = 0;
        if (!(in >> c.baseline_kib >> c.peak_kib >> c.max_error >> c.min_fraction >>
              c.wrong_rounds >> rounds) ||
            rounds > 1'000'000)
            return std::nullopt;
        c.starts.resize(rounds);
        c.ends.resize(rounds);
        c.cpu_seconds.resize(rounds);
        c.switches.resize(rounds);
        for (std::size_t r = 0; r < rounds; ++r)
            if (!(in >> c.starts[r] >> c.ends[r] >> c.cpu_seconds[r] >> c.switches[r]))
                return std::nullopt;
        return c;
    }
};

/// CPU time and context switches of this process so far (all its threads).
struct process_usage {
    double cpu_seconds = 0;
    long switches = 0;

    static process_usage now() {
        rusage u{};
        getrusage(RUSAGE_SELF, &u);
        const auto seconds = [](timeval t) {
            return static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_usec);
        };
        return {seconds(u.ru_utime) + seconds(u.ru_stime), u.ru_nvcsw + u.ru_nivcsw};
    }
};

/// The child's side of the line protocol (stdin/stdout belong to it).
struct parent_link {
    void send(const std::string& line) {
        std::fputs((line + '\n').c_str(), stdout);
        std::fflush(stdout);
    }
    std::string receive() {
        std::string line;
        if (!std::getline(std::cin, line)) throw std::runtime_error("the driver went away");
        return line;
    }
    void barrier(std::size_t number) {
        send("READY " + std::to_string(number));
        if (receive() != "GO") throw std::runtime_error("expected GO");
    }
    /// Sends HELLO with our id and where we listen; returns the PEERS line's id and endpoint
    /// of each of the `size` ranks, rank by rank.
    std::vector<std::pair<std::string, asio::ip::tcp::endpoint>>
    introduce(const std::string& id, const asio::ip::tcp::endpoint& at, std::size_t size) {
        send("HELLO " + id + " " + at.address().to_string() + " " + std::to_string(at.port()));
        std::istringstream peers(receive());
        std::string word;
        if (!(peers >> word) || word != "PEERS") throw std::runtime_error("expected PEERS");
        std::vector<std::pair<std::string, asio::ip::tcp::endpoint>> out;
        for (std::size_t k = 0; k < size; ++k) {
            std::string peer_id, peer_address;
            unsigned short peer_port = 0;
            if (!(peers >> peer_id >> peer_address >> peer_port))
                throw std::runtime_error("short PEERS line");
            out.emplace_back(
                peer_id, asio::ip::tcp::endpoint(asio::ip::make_address(peer_address), peer_port));
        }
        return out;
    }
};

/// Runs `rounds` rounds of `reduce` (which averages `tensor` in place) with the protocol's
/// barriers around each (numbered 2·round and 2·round + 1); checks the result after each
/// against `codec`'s bound (an empty `codec`: nothing is checked, nothing was reduced).
/// `reduce` returns the fraction averaged.
template <class Barrier, class Reduce>
void run_rounds(const options& o, std::span<float> tensor, const std::string& codec,
                child_record& record, Barrier&& barrier, Reduce&& reduce) {
    const double allowed = tolerance(codec, o.size);
    for (std::size_t round = 0; round < o.warmup + o.rounds; ++round) {
        fill(tensor, o.rank);
        barrier(2 * round);
        const process_usage before = process_usage::now();
        const double start = clock_seconds();
        const double fraction = reduce(round);
        const double end = clock_seconds();
        const process_usage after = process_usage::now();
        // Checking waits until every process is done: a process that finished first would
        // otherwise check on the cores the others still average on.
        barrier(2 * round + 1);
        record.starts.push_back(start);
        record.ends.push_back(end);
        record.cpu_seconds.push_back(after.cpu_seconds - before.cpu_seconds);
        record.switches.push_back(after.switches - before.switches);
        if (codec.empty()) continue;
        const double error = max_error(tensor, o.size);
        if (!(error <= record.max_error)) record.max_error = error;
        record.min_fraction = std::min(record.min_fraction, fraction);
        if (!(error <= allowed) || fraction < 1.0) {
            ++record.wrong_rounds;
            std::fprintf(stderr,
                         "bench_allreduce: rank %zu round %zu: max error %g (allowed %g), "
                         "fraction averaged %g\n",
                         o.rank, round, error, allowed, fraction);
        }
    }
}

#if defined(HIVEMESH_HAVE_GLOO) || defined(HIVEMESH_HAVE_MPI)
/// Gloo and MPI return sums: the mean is part of their round.
void scale(std::span<float> values, std::size_t n) {
    const float inverse = 1.0f / static_cast<float>(n);
    for (float& v : values)
        v *= inverse;
}
#endif

// ---- hivemesh child --------------------------------------------------------------------------

compression::kind codec_of(const std::string& name) {
    if (name == "adaptive") return compression::kind::none; // blockwise_8bit where it pays
    if (name == "uniform") return compression::kind::none;  // split evenly, not balanced
    for (const auto k : compression::all_kinds)
        if (compression::to_string(k) == name) return k;
    throw std::invalid_argument("unknown codec " + name);
}

/// The cell's ranks as members of a hivemesh group, without their ids and endpoints: the last
/// --clients ranks are clients, and every member announces its link's rate, what load
/// balancing and the adaptive choice weigh (0: unknown, or a client).
averaging::group_info<asio::ip::tcp::endpoint> cell_group(const options& o) {
    averaging::group_info<asio::ip::tcp::endpoint> group;
    for (std::size_t k = 0; k < o.size; ++k) {
        auto& member = group.members.emplace_back();
        const bool client = k >= o.size - o.clients;
        member.role = client ? averaging::member_role::client : averaging::member_role::node;
        member.bandwidth = client ? 0 : o.link_rate(k);
    }
    return group;
}

/// The cell's spans, rank by rank, as the averager splits the vector: by the rates the members
/// announce, evenly where none is known; `uniform`: as if none were.
std::vector<std::size_t> cell_spans(const options& o, bool uniform) {
    auto bandwidths = averaging::announced_bandwidths(cell_group(o));
    if (uniform)
        for (auto& b : bandwidths)
            if (b != 0.0) b.reset();
    return averaging::load_balance(o.elements, bandwidths);
}

/// The address a child listens on and announces: --address, or loopback.
asio::ip::address child_address(const options& o) {
    return o.address.empty() ? asio::ip::address(asio::ip::address_v4::loopback())
                             : asio::ip::make_address(o.address);
}

int hivemesh_child(const options& o) {
    using transport_type = net::tcp::transport;
    using service_type = averaging::allreduce_service<transport_type>;
    parent_link link;

    // Compression and reduction on a pool (the intended use); 0 threads: on the io thread.
    // Declared before `io`, so it is destroyed after it: handlers queued in `io` hold
    // strands on the pool.
    asio::thread_pool compute(std::max(o.compute_threads, 1u));
    asio::io_context io(1);
    transport_type transport(io.get_executor());
    net::node_options node_options;
    node_options.security.plaintext = o.plaintext;
    if (o.mux_window) node_options.mux.initial_window = static_cast<std::uint32_t>(o.mux_window);
    if (o.frame_payload)
        node_options.mux.frame_payload = node_options.mux.encrypted_frame_payload = o.frame_payload;
    if (o.mux_batch) node_options.mux.max_batch_bytes = o.mux_batch;
    net::node<transport_type> rpc(transport, crypto::identity::generate(), node_options);
    const auto address = child_address(o);
    auto listener = transport.listen(asio::ip::tcp::endpoint(address, 0));
    const auto port = listener.local_endpoint().port();
    rpc.serve(std::move(listener));

    std::optional<asio::any_io_executor> compute_executor;
    if (o.compute_threads > 0) compute_executor = compute.get_executor();
    averaging::allreduce_options allreduce_options;
    allreduce_options.codec = codec_of(o.mode);
    if (o.mode != "adaptive") allreduce_options.slow_link_codec.reset();
    allreduce_options.part_size_bytes = o.part_size;
    // A loaded two-core machine can starve a process for seconds: only the round's own
    // timeout should end a slow round here.
    allreduce_options.sender_timeout = 600s;
    allreduce_options.reducer_timeout = 1200s;
    allreduce_options.join_wait = 600s;
    service_type service(rpc, allreduce_options, compute_executor);

    auto work = asio::make_work_guard(io);
    std::thread io_thread([&io] { io.run(); });
    struct stopper { // the io thread ends on every way out
        asio::io_context& io;
        std::thread& thread;
        ~stopper() {
            io.stop();
            if (thread.joinable()) thread.join();
        }
    } stop_io{io, io_thread};

    const auto peers = link.introduce(rpc.id().to_string(), {address, port}, o.size);
    auto group = cell_group(o);
    for (std::size_t k = 0; k < o.size; ++k) {
        group.members[k].peer.id = crypto::peer_id::from_string(peers[k].first);
        group.members[k].peer.endpoint = peers[k].second;
    }
    if (group.members[o.rank].peer.id != rpc.id()) throw std::runtime_error("not at my rank");
    const auto spans = cell_spans(o, o.mode == "uniform");

    std::vector<float> tensor(o.elements);
    fill(tensor, o.rank);
    child_record record;
    record.baseline_kib = status_kib("VmRSS");

    run_rounds(
        o, tensor, o.mode, record, [&](std::size_t number) { link.barrier(number); },
        [&](std::size_t round) {
            // Every process derives the same fresh group id from the run and the round.
            for (std::size_t b = 0; b < 8; ++b) {
                group.id[b] = static_cast<std::byte>((o.nonce >> (8 * b)) & 0xFF);
                group.id[8 + b] = static_cast<std::byte>((round >> (8 * b)) & 0xFF);
            }
            std::promise<std::pair<std::error_code, averaging::allreduce_result>> done;
            auto outcome = done.get_future();
            asio::post(io, [&] {
                service.async_allreduce(group, o.rank, spans, std::span<float>(tensor), 1.0,
                                        std::chrono::seconds(o.child_timeout),
                                        [&done](std::error_code ec, averaging::allreduce_result r) {
                                            done.set_value({ec, std::move(r)});
                                        });
            });
            const auto [ec, result] = outcome.get();
            if (ec) throw std::runtime_error("async_allreduce: " + ec.message());
            std::size_t listed = 0;
            for (const auto& part : result.parts)
                if (!part.averaged() && listed++ < 4)
                    std::fprintf(stderr,
                                 "bench_allreduce: rank %zu round %zu: elements [%zu, %zu) of "
                                 "reducer %zu not averaged\n",
                                 o.rank, round, part.begin, part.begin + part.size, part.reducer);
            return result.fraction_averaged();
        });

    record.peak_kib = status_kib("VmHWM");
    link.send("RESULT " + record.to_line());
    // Only now may anyone close: the others may still be receiving our last results.
    if (link.receive() != "EXIT") throw std::runtime_error("expected EXIT");
    std::promise<void> closed;
    asio::post(io, [&] {
        rpc.close();
        closed.set_value();
    });
    closed.get_future().wait();
    return 0;
}

// ---- bare TCP child ---------------------------------------------------------------------------

/// Sends all of `bytes` on a blocking socket (another thread may receive on it meanwhile).
void send_all(int fd, const std::byte* bytes, std::size_t size) {
    while (size > 0) {
        const ssize_t sent = ::send(fd, bytes, size, MSG_NOSIGNAL);
        if (sent < 0 && errno == EINTR) continue;
        if (sent <= 0) throw std::system_error(errno, std::generic_category(), "send");
        bytes += sent;
        size -= static_cast<std::size_t>(sent);
    }
}

/// Receives exactly `size` bytes on a blocking socket and drops them.
void receive_and_drop(int fd, std::size_t size) {
    std::vector<std::byte> landing(std::size_t{1} << 20);
    while (size > 0) {
        const ssize_t got = ::recv(fd, landing.data(), std::min(size, landing.size()), 0);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) throw std::system_error(errno, std::generic_category(), "recv");
        if (got == 0) throw std::runtime_error("a peer closed mid-round");
        size -= static_cast<std::size_t>(got);
    }
}

/// The butterfly's traffic with no library: over one plain TCP connection per pair, each
/// process sends every other one its values for that one's span and then as many bytes of its
/// own span as the averages it would return, all peers at once, one thread per direction; what
/// arrives is read and dropped. Nothing is reduced and the tensor is not checked: the row is
/// the least time these links take to carry a round's bytes in this pattern.
int tcp_child(const options& o) {
    parent_link link;
    asio::io_context io;
    const auto address = child_address(o);
    asio::ip::tcp::acceptor acceptor(io, asio::ip::tcp::endpoint(address, 0));
    const auto peers = link.introduce("-", acceptor.local_endpoint(), o.size);
    // One connection per pair: a rank dials the lower ranks, which take its rank from the
    // first 4 bytes, and accepts the higher ones.
    std::vector<asio::ip::tcp::socket> sockets;
    for (std::size_t k = 0; k < o.size; ++k)
        sockets.emplace_back(io);
    const auto me = static_cast<std::uint32_t>(o.rank);
    for (std::size_t k = 0; k < o.rank; ++k) {
        sockets[k].connect(peers[k].second);
        asio::write(sockets[k], asio::buffer(&me, sizeof me));
    }
    for (std::size_t accepted = o.rank + 1; accepted < o.size; ++accepted) {
        asio::ip::tcp::socket socket(io);
        acceptor.accept(socket);
        std::uint32_t k = 0;
        asio::read(socket, asio::buffer(&k, sizeof k));
        if (k <= me || k >= o.size || sockets[k].is_open())
            throw std::runtime_error("a connection from an unexpected rank");
        sockets[k] = std::move(socket);
    }

    // Every member sends values, so each ordered pair carries the receiver's span and the
    // sender's.
    const auto spans = cell_spans(o, false);
    std::vector<std::size_t> offsets(o.size, 0);
    for (std::size_t k = 1; k < o.size; ++k)
        offsets[k] = offsets[k - 1] + spans[k - 1];
    std::vector<float> tensor(o.elements);
    fill(tensor, o.rank);
    child_record record;
    record.baseline_kib = status_kib("VmRSS");
    const auto span_bytes = [&](std::size_t k) {
        return std::span<const std::byte>(reinterpret_cast<const std::byte*>(tensor.data()) +
                                              offsets[k] * sizeof(float),
                                          spans[k] * sizeof(float));
    };

    run_rounds(
        o, tensor, "", record, [&](std::size_t number) { link.barrier(number); },
        [&](std::size_t) {
            std::vector<std::exception_ptr> failures(2 * o.size);
            std::vector<std::thread> threads;
            for (std::size_t k = 0; k < o.size; ++k) {
                if (k == o.rank) continue;
                const int fd = sockets[k].native_handle();
                threads.emplace_back([&, k, fd] {
                    try {
                        for (const auto bytes : {span_bytes(k), span_bytes(o.rank)})
                            send_all(fd, bytes.data(), bytes.size());
                    } catch (...) {
                        failures[2 * k] = std::current_exception();
                    }
                });
                threads.emplace_back([&, k, fd] {
                    try {
                        receive_and_drop(fd, (spans[o.rank] + spans[k]) * sizeof(float));
                    } catch (...) {
                        failures[2 * k + 1] = std::current_exception();
                    }
                });
            }
            for (auto& thread : threads)
                thread.join();
            for (const auto& failure : failures)
                if (failure) std::rethrow_exception(failure);
            return 1.0;
        });
    record.peak_kib = status_kib("VmHWM");
    link.send("RESULT " + record.to_line());
    if (link.receive() != "EXIT") throw std::runtime_error("expected EXIT");
    return 0;
}

// ---- Gloo child ------------------------------------------------------------------------------

#ifdef HIVEMESH_HAVE_GLOO
int gloo_child(const options& o) {
    parent_link link;
    gloo::transport::tcp::attr attr;
    attr.hostname = o.address.empty() ? "127.0.0.1" : o.address;
    attr.ai_family = AF_INET;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore files(o.dir);
    gloo::rendezvous::PrefixStore store("allreduce", files);
    auto context = std::make_shared<gloo::rendezvous::Context>(static_cast<int>(o.rank),
                                                               static_cast<int>(o.size));
    context->setTimeout(std::chrono::seconds(o.child_timeout));
    context->connectFullMesh(store, device);

    std::vector<float> tensor(o.elements);
    fill(tensor, o.rank);
    child_record record;
    record.baseline_kib = status_kib("VmRSS");
    // The algorithm's own buffers count as extra memory: made after the baseline.
    std::unique_ptr<gloo::Algorithm> algorithm;
    const std::vector<float*> pointers{tensor.data()};
    const int count = static_cast<int>(o.elements);
    if (o.mode == "ring")
        algorithm = std::make_unique<gloo::AllreduceRing<float>>(context, pointers, count);
    else if (o.mode == "hd")
        algorithm =
            std::make_unique<gloo::AllreduceHalvingDoubling<float>>(context, pointers, count);
    else
        throw std::invalid_argument("unknown Gloo algorithm " + o.mode);

    run_rounds(
        o, tensor, "none", record, [&](std::size_t number) { link.barrier(number); },
        [&](std::size_t) {
            algorithm->run();
            scale(tensor, o.size);
            return 1.0;
        });
    record.peak_kib = status_kib("VmHWM");
    link.send("RESULT " + record.to_line());
    if (link.receive() != "EXIT") throw std::runtime_error("expected EXIT");
    return 0;
}
#endif

// ---- MPI child -------------------------------------------------------------------------------

#ifdef HIVEMESH_HAVE_MPI
int mpi_child(options o) {
    MPI_Init(nullptr, nullptr);
    int rank = 0, size = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    o.rank = static_cast<std::size_t>(rank);
    o.size = static_cast<std::size_t>(size);

    std::vector<float> tensor(o.elements);
    fill(tensor, o.rank);
    child_record record;
    record.baseline_kib = status_kib("VmRSS");
    run_rounds(
        o, tensor, "none", record, [](std::size_t) { MPI_Barrier(MPI_COMM_WORLD); },
        [&](std::size_t) {
            MPI_Allreduce(MPI_IN_PLACE, tensor.data(), static_cast<int>(o.elements), MPI_FLOAT,
                          MPI_SUM, MPI_COMM_WORLD);
            scale(tensor, o.size);
            return 1.0;
        });
    record.peak_kib = status_kib("VmHWM");
    { // written whole, then renamed: the driver never reads half a record
        const std::string path = o.dir + "/rank" + std::to_string(rank);
        std::ofstream(path + ".partial") << record.to_line() << '\n';
        std::filesystem::rename(path + ".partial", path);
    }
    MPI_Finalize();
    return 0;
}
#endif

int child_main(const options& o) {
    alarm(o.child_timeout); // a hung child dies and its configuration says so
    try {
        if (o.child == "hivemesh") return hivemesh_child(o);
        if (o.child == "tcp") return tcp_child(o);
#ifdef HIVEMESH_HAVE_GLOO
        if (o.child == "gloo") return gloo_child(o);
#endif
#ifdef HIVEMESH_HAVE_MPI
        if (o.child == "mpi") return mpi_child(o);
#endif
        throw std::invalid_argument("unknown child " + o.child);
    } catch (const std::exception& e) {
        std::string text = e.what();
        std::replace(text.begin(), text.end(), '\n', ' ');
        std::printf("ERROR %s\n", text.c_str());
        std::fflush(stdout);
        std::fprintf(stderr, "bench_allreduce child %s rank %zu: %s\n", o.child.c_str(), o.rank,
                     text.c_str());
        return 1;
    }
}

// ---- the driver --------------------------------------------------------------------------------

/// The outcome of one system at one process count.
struct cell {
    std::string status = "ok"; ///< ok, or what went wrong
    bool wrong = false;        ///< finished, but some process got a wrong result
    std::vector<double> round_seconds;
    std::vector<double> round_cpu_seconds; ///< per round, summed over the processes
    std::vector<double> round_switches;    ///< per round, summed over the processes
    double median_seconds = 0;
    double median_cpu_seconds = 0; ///< per round, summed over the processes
    double median_switches = 0;    ///< per round, summed over the processes
    double gbytes_per_second = 0;
    double memory_ratio = 0;
    double max_error = 0;
    double load_before = 0;
};

std::string loadavg() {
    std::ifstream in("/proc/loadavg");
    std::string a, b, c;
    in >> a >> b >> c;
    return a + " " + b + " " + c;
}

double load1() {
    std::ifstream in("/proc/loadavg");
    double a = 0;
    in >> a;
    return a;
}

std::string executable_path() {
    return std::filesystem::read_symlink("/proc/self/exe").string();
}

struct temp_dir {
    std::string path;
    temp_dir() {
        std::string pattern =
            (std::filesystem::temp_directory_path() / "hivemesh-allreduce-XXXXXX").string();
        if (!mkdtemp(pattern.data())) throw std::system_error(errno, std::generic_category());
        path = pattern;
    }
    temp_dir(const temp_dir&) = delete;
    temp_dir& operator=(const temp_dir&) = delete;
    ~temp_dir() {
        std::error_code ignored;
        std::filesystem::remove_all(path, ignored);
    }
};

/// A child process with its stdin and stdout as pipes (or, for mpirun, redirected).
struct process {
    pid_t pid = -1;
    FILE* to = nullptr;
    FILE* from = nullptr;
    bool killed = false; ///< by us, after another failure

    static process start(const std::string& program, const std::vector<std::string>& args,
                         bool pipes, const std::string& output_file = {}) {
        int in[2] = {-1, -1}, out[2] = {-1, -1};
        if (pipes && (pipe(in) != 0 || pipe(out) != 0))
            throw std::system_error(errno, std::generic_category(), "pipe");
        std::vector<char*> argv;
        argv.push_back(const_cast<char*>(program.c_str()));
        for (const auto& a : args)
            argv.push_back(const_cast<char*>(a.c_str()));
        argv.push_back(nullptr);
        std::fflush(nullptr);
        const pid_t pid = fork();
        if (pid < 0) throw std::system_error(errno, std::generic_category(), "fork");
        if (pid == 0) {
            if (pipes) {
                dup2(in[0], 0);
                dup2(out[1], 1);
                for (int fd : {in[0], in[1], out[0], out[1]})
                    close(fd);
            } else {
                const int null = open("/dev/null", O_RDONLY);
                const int log = open(output_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
                if (null >= 0) dup2(null, 0);
                if (log >= 0) dup2(log, 1);
            }
            execv(program.c_str(), argv.data());
            std::perror("bench_allreduce: execv");
            _exit(127);
        }
        process p;
        p.pid = pid;
        if (pipes) {
            close(in[0]);
            close(out[1]);
            p.to = fdopen(in[1], "w");
            p.from = fdopen(out[0], "r");
        }
        return p;
    }

    bool send(const std::string& line) {
        if (!to) return false;
        return std::fputs((line + '\n').c_str(), to) >= 0 && std::fflush(to) == 0;
    }
    /// The next line; nullopt at the end of the child's output.
    std::optional<std::string> receive() {
        if (!from) return std::nullopt;
        std::string line;
        char buffer[4096];
        while (std::fgets(buffer, sizeof buffer, from)) {
            line += buffer;
            if (!line.empty() && line.back() == '\n') {
                line.pop_back();
                return line;
            }
        }
        return line.empty() ? std::nullopt : std::optional<std::string>(line);
    }
    /// Waits for the exit; "" for a clean one.
    std::string finish() {
        if (to) std::fclose(to);
        if (from) std::fclose(from);
        to = from = nullptr;
        int status = 0;
        if (pid <= 0 || waitpid(pid, &status, 0) != pid) return {};
        pid = -1;
        if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL && killed) return {};
        if (WIFSIGNALED(status)) return std::string("killed by ") + strsignal(WTERMSIG(status));
        if (WIFEXITED(status) && WEXITSTATUS(status) != 0)
            return "exit status " + std::to_string(WEXITSTATUS(status));
        return {};
    }
    void kill_now() {
        if (pid > 0 && ::kill(pid, SIGKILL) == 0) killed = true;
    }
};

/// The cell's medians from its rounds.
void compute_medians(const options& o, cell& c) {
    c.median_seconds = median(c.round_seconds);
    c.median_cpu_seconds = median(c.round_cpu_seconds);
    c.median_switches = median(c.round_switches);
    const double bytes = static_cast<double>(o.elements) * sizeof(float);
    c.gbytes_per_second = c.median_seconds > 0 ? bytes / c.median_seconds / 1e9 : 0;
}

/// Adds a later pass's measurement of the same cell to `into`: rounds pooled, worst memory
/// and error kept, the first failure kept.
void merge(const options& o, cell& into, const cell& pass) {
    if (into.status != "ok") return;
    if (pass.status != "ok") {
        into.status = pass.status;
        return;
    }
    into.wrong = into.wrong || pass.wrong;
    for (auto [to, from] : {std::pair{&into.round_seconds, &pass.round_seconds},
                            std::pair{&into.round_cpu_seconds, &pass.round_cpu_seconds},
                            std::pair{&into.round_switches, &pass.round_switches}})
        to->insert(to->end(), from->begin(), from->end());
    into.memory_ratio = std::max(into.memory_ratio, pass.memory_ratio);
    into.max_error = std::max(into.max_error, pass.max_error);
    into.load_before = std::max(into.load_before, pass.load_before);
    compute_medians(o, into);
}

/// Round times, CPU, medians, bandwidth and memory from every process's record.
void summarise(const options& o, const std::vector<child_record>& records, cell& c) {
    const std::size_t total = o.warmup + o.rounds;
    for (const auto& r : records)
        if (r.starts.size() != total) {
            c.status = "bad record";
            return;
        }
    for (std::size_t round = o.warmup; round < total; ++round) {
        double first = std::numeric_limits<double>::max(), last = 0;
        double round_cpu = 0, round_switches = 0;
        for (const auto& r : records) {
            first = std::min(first, r.starts[round]);
            last = std::max(last, r.ends[round]);
            round_cpu += r.cpu_seconds[round];
            round_switches += static_cast<double>(r.switches[round]);
        }
        c.round_seconds.push_back(last - first);
        c.round_cpu_seconds.push_back(round_cpu);
        c.round_switches.push_back(round_switches);
    }
    compute_medians(o, c);
    const double bytes = static_cast<double>(o.elements) * sizeof(float);
    for (const auto& r : records) {
        const double extra =
            static_cast<double>(r.peak_kib > r.baseline_kib ? r.peak_kib - r.baseline_kib : 0) *
            1024.0;
        c.memory_ratio = std::max(c.memory_ratio, extra / bytes);
        c.max_error = std::max(c.max_error, r.max_error);
        if (r.wrong_rounds > 0) c.wrong = true;
    }
}

std::vector<std::string> child_arguments(const options& o, const system_spec& s, std::size_t n,
                                         const std::string& dir, std::uint64_t nonce) {
    std::vector<std::string> a{"--child",
                               s.child,
                               "--size",
                               std::to_string(n),
                               "--elements",
                               std::to_string(o.elements),
                               "--warmup",
                               std::to_string(o.warmup),
                               "--rounds",
                               std::to_string(o.rounds),
                               "--mode",
                               s.mode,
                               "--plaintext",
                               s.plaintext ? "1" : "0",
                               "--part-size",
                               std::to_string(o.part_size),
                               "--mux-window",
                               std::to_string(o.mux_window),
                               "--frame-payload",
                               std::to_string(o.frame_payload),
                               "--mux-batch",
                               std::to_string(o.mux_batch),
                               "--compute-threads",
                               std::to_string(o.compute_threads),
                               "--child-timeout",
                               std::to_string(o.child_timeout),
                               "--dir",
                               dir,
                               "--nonce",
                               std::to_string(nonce)};
    if (!o.links.empty()) {
        a.push_back("--link");
        a.push_back(joined(o.links));
    }
    if (o.clients > 0) {
        a.push_back("--clients");
        a.push_back(std::to_string(o.clients));
    }
    return a;
}

/// The TCP congestion control scripts/netns-swarm.sh reports for its namespaces; "unknown"
/// outside them.
std::string namespaces_congestion() {
    const char* name = std::getenv("HIVEMESH_NETNS_CONGESTION");
    return name && *name ? name : "unknown";
}

/// The peer namespaces of scripts/netns-swarm.sh, which runs this driver with --link; empty
/// on loopback.
struct namespaces {
    std::vector<std::string> names, addresses;

    /// The namespaces for a cell of n processes: none, or at least n.
    static namespaces for_processes(std::size_t n) {
        namespaces out;
        const auto words = [](const char* text) {
            std::vector<std::string> list;
            std::istringstream in(text ? text : "");
            for (std::string word; in >> word;)
                list.push_back(word);
            return list;
        };
        out.names = words(std::getenv("HIVEMESH_NETNS_NAMES"));
        out.addresses = words(std::getenv("HIVEMESH_NETNS_ADDRESSES"));
        if (out.names.size() != out.addresses.size())
            throw std::runtime_error("HIVEMESH_NETNS_NAMES and _ADDRESSES differ in length");
        if (out.active() && out.names.size() < n)
            throw std::runtime_error("fewer namespaces than processes");
        return out;
    }
    bool active() const { return !names.empty(); }
    /// `program args` run in namespace k, through ip netns exec.
    std::vector<std::string> in(std::size_t k, const std::string& program,
                                std::vector<std::string> args) const {
        std::vector<std::string> all{"ip", "netns", "exec", names.at(k), program};
        for (auto& a : args)
            all.push_back(std::move(a));
        return all;
    }
};

/// Where programs run in a namespace are started from: env finds ip on the PATH.
const std::string env_program = "/usr/bin/env";

/// hivemesh and Gloo: n children of this program, driven over their pipes.
cell run_children(const options& o, const system_spec& s, std::size_t n) {
    const auto spaces = namespaces::for_processes(n);
    cell c;
    temp_dir dir;
    const auto nonce =
        static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    std::vector<process> children;
    std::string failure;
    auto fail = [&](const std::string& why) {
        if (failure.empty()) failure = why;
    };
    /// The next line of child k, or "" after recording why there is none.
    auto receive = [&](std::size_t k) -> std::string {
        auto line = children[k].receive();
        if (!line) {
            fail("rank " + std::to_string(k) + " ended early");
            return {};
        }
        if (line->rfind("ERROR ", 0) == 0) {
            fail("rank " + std::to_string(k) + ": " + line->substr(6));
            return {};
        }
        return *line;
    };
    const std::string self = executable_path();
    for (std::size_t k = 0; k < n; ++k) {
        auto args = child_arguments(o, s, n, dir.path, nonce);
        args.push_back("--rank");
        args.push_back(std::to_string(k));
        if (!spaces.active()) {
            children.push_back(process::start(self, args, true));
            continue;
        }
        args.push_back("--address");
        args.push_back(spaces.addresses[k]);
        children.push_back(process::start(env_program, spaces.in(k, self, std::move(args)), true));
    }
    std::vector<child_record> records;
    [&] {
        if (s.child == "hivemesh" || s.child == "tcp") {
            std::string peers = "PEERS";
            for (std::size_t k = 0; k < n; ++k) {
                std::istringstream hello(receive(k));
                std::string word, id, address, port;
                if (!(hello >> word >> id >> address >> port) || word != "HELLO")
                    return fail("no HELLO");
                peers += " " + id + " " + address + " " + port;
            }
            for (auto& child : children)
                child.send(peers);
        }
        for (std::size_t barrier = 0; barrier < 2 * (o.warmup + o.rounds); ++barrier) {
            for (std::size_t k = 0; k < n; ++k)
                if (receive(k) != "READY " + std::to_string(barrier)) return fail("no READY");
            for (auto& child : children)
                child.send("GO");
        }
        for (std::size_t k = 0; k < n; ++k) {
            const auto line = receive(k);
            if (line.rfind("RESULT ", 0) != 0) return fail("no RESULT");
            auto record = child_record::from_line(line.substr(7));
            if (!record) return fail("unreadable RESULT");
            records.push_back(std::move(*record));
        }
        for (auto& child : children)
            child.send("EXIT");
    }();
    if (!failure.empty())
        for (auto& child : children)
            child.kill_now();
    for (std::size_t k = 0; k < n; ++k) {
        const auto how = children[k].finish();
        if (how.empty()) continue;
        if (failure.empty())
            failure = "rank " + std::to_string(k) + " " + how;
        else
            failure += " (rank " + std::to_string(k) + " " + how + ")";
    }
    if (!failure.empty()) {
        c.status = failure;
        return c;
    }
    summarise(o, records, c);
    return c;
}

#ifdef HIVEMESH_HAVE_MPI
/// MPI: mpirun starts n copies of this program; each writes its record to the directory.
cell run_mpi(const options& o, const system_spec& s, std::size_t n) {
    cell c;
    temp_dir dir;
    const auto spaces = namespaces::for_processes(n);
    // TCP only, over loopback or the namespaces' links: no shared memory, no UCX.
    const std::string interface = spaces.active() ? "eth0" : "lo";
    std::vector<std::string> args{
        "--allow-run-as-root", "--bind-to", "none", "-np", std::to_string(n), "--mca", "pml", "ob1",
        "--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", interface, "--mca", "coll",
        "^sm,han",
        // Ranks wait without spinning, as the other systems do.
        "--mca", "mpi_yield_when_idle", "1", "--timeout", std::to_string(o.child_timeout)};
    if (spaces.active()) {
        // mpirun in the first namespace starts a rank in each, one per address, through
        // netns-rsh.sh; its daemons reach it over the links too.
        std::string hosts;
        for (std::size_t k = 0; k < n; ++k)
            hosts += (k ? "," : "") + spaces.addresses[k] + ":1";
        // No rtc/hwloc: binding is off anyway, and on some kernels its orted daemons crash
        // writing the topology into shared memory (hwloc_shmem_topology_write).
        for (std::string a : {"--host", hosts.c_str(), "--mca", "plm_rsh_agent",
                              HIVEMESH_SCRIPTS_DIR "/netns-rsh.sh", "--mca", "oob_tcp_if_include",
                              "eth0", "--mca", "rtc", "^hwloc"})
            args.push_back(std::move(a));
    } else {
        args.insert(args.begin(), "--oversubscribe");
    }
    args.push_back(executable_path());
    for (auto& a : child_arguments(o, s, n, dir.path, 0))
        args.push_back(std::move(a));
    const std::string log = dir.path + "/mpirun.log";
    auto mpirun = spaces.active() ? process::start(env_program,
                                                   spaces.in(0, HIVEMESH_MPIEXEC, args), false, log)
                                  : process::start(HIVEMESH_MPIEXEC, args, false, log);
    if (auto how = mpirun.finish(); !how.empty()) {
        c.status = "mpirun " + how;
        std::ifstream in(log);
        std::string line;
        while (std::getline(in, line))
            std::fprintf(stderr, "  mpirun: %s\n", line.c_str());
        return c;
    }
    std::vector<child_record> records;
    for (std::size_t k = 0; k < n; ++k) {
        std::ifstream in(dir.path + "/rank" + std::to_string(k));
        std::string line;
        std::optional<child_record> record;
        if (std::getline(in, line)) record = child_record::from_line(line);
        if (!record) {
            c.status = "rank " + std::to_string(k) + " wrote no record";
            return c;
        }
        records.push_back(std::move(*record));
    }
    summarise(o, records, c);
    return c;
}
#endif

cell run_cell(const options& o, const system_spec& s, std::size_t n) {
    try {
#ifdef HIVEMESH_HAVE_MPI
        if (s.child == "mpi") return run_mpi(o, s, n);
#endif
        return run_children(o, s, n);
    } catch (const std::exception& e) {
        cell c;
        c.status = e.what();
        return c;
    }
}

/// The least time an all-reduce among the first n ranks takes over their links. With the
/// shares w_i that minimise it (averaging::optimize_shares), member i sends, and receives,
/// 1 + (n-2) w_i times the tensor, and a client (share 0) the tensor once; with equal links
/// and no clients this is 2(n-1)/n x tensor bytes / rate.
double all_reduce_bound(const options& o, std::size_t n) {
    std::vector<double> rates(n);
    double slowest_client = 0; // the longest 1/rate among the clients
    for (std::size_t k = 0; k < n; ++k)
        if (k < n - o.clients)
            rates[k] = o.link_rate(k);
        else
            slowest_client = std::max(slowest_client, 1 / o.link_rate(k));
    const auto plan = averaging::optimize_shares(rates);
    return std::max(plan.round_time, slowest_client) *
           static_cast<double>(o.elements * sizeof(float));
}

struct target {
    std::string text;
    std::optional<bool> met; ///< nullopt: not measured in this run
    std::string detail;
};

int driver_main(const options& o) {
    std::signal(SIGPIPE, SIG_IGN); // a dead child's pipe is an error code, not our death
    std::vector<system_spec> rows;
    const auto known = all_systems();
    if (o.systems.empty()) {
        for (const auto& s : known) // the uniform split differs only where the links do
            if (s.built && (s.mode != "uniform" || o.heterogeneous())) rows.push_back(s);
    } else {
        for (const auto& name : o.systems) { // parse() took only known names
            const auto it = std::find_if(known.begin(), known.end(),
                                         [&](const system_spec& s) { return s.name == name; });
            if (it->built)
                rows.push_back(*it);
            else
                std::fprintf(stderr, "bench_allreduce: %s was not built, skipped\n", name.c_str());
        }
    }
    for (const auto& s : known)
        if (!s.built)
            std::fprintf(stderr, "bench_allreduce: %s not built (library not found)\n",
                         s.label.c_str());

    const std::string load_at_start = loadavg();
    const double tensor_mb = static_cast<double>(o.elements) * sizeof(float) / 1e6;
    std::fprintf(stderr,
                 "bench_allreduce: %zu elements (%.1f MB), %zu warm-up + %zu timed rounds, "
                 "%u cores, load %s\n",
                 o.elements, tensor_mb, o.warmup, o.rounds, std::thread::hardware_concurrency(),
                 load_at_start.c_str());
    std::vector<std::vector<cell>> cells(rows.size(), std::vector<cell>(o.processes.size()));
    bool any_failure = false;
    for (std::size_t pass = 0; pass < o.passes; ++pass)
        for (std::size_t k = 0; k < rows.size(); ++k) {
            const std::size_t i = pass % 2 == 0 ? k : rows.size() - 1 - k;
            for (std::size_t j = 0; j < o.processes.size(); ++j) {
                const std::size_t n = o.processes[j];
                const double load = load1();
                std::fprintf(stderr, "  %-34s N=%zu", rows[i].label.c_str(), n);
                if (o.passes > 1) std::fprintf(stderr, " pass %zu", pass + 1);
                std::fprintf(stderr, " (load %.2f) ... ", load);
                const auto began = std::chrono::steady_clock::now();
                auto c = run_cell(o, rows[i], n);
                c.load_before = load;
                const double took =
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
                if (c.status != "ok")
                    std::fprintf(stderr, "FAILED: %s\n", c.status.c_str());
                else
                    std::fprintf(stderr, "%.3f s median%s (%.0f s in all)\n", c.median_seconds,
                                 c.wrong ? ", WRONG RESULT" : "", took);
                if (c.status != "ok" || c.wrong) any_failure = true;
                if (pass == 0)
                    cells[i][j] = std::move(c);
                else
                    merge(o, cells[i][j], c);
            }
        }
    const std::string load_at_end = loadavg();

    // The table.
    const bool shaped = !o.links.empty();
    const auto byte_bound = [&](std::size_t n) { return all_reduce_bound(o, n); };
    const std::string where =
        !shaped
            ? "loopback TCP"
            : "TCP between network namespaces, " +
                  (o.links.size() == 1 ? "every link shaped to " + o.links[0]
                                       : "rank k's link shaped to the k-th of " + joined(o.links)) +
                  " each way (tc tbf), TCP congestion control " + namespaces_congestion() +
                  (o.clients
                       ? ", the last " + std::to_string(o.clients) + " rank(s) hivemesh clients"
                       : std::string());
    std::printf("\nAll-reduce of %zu float32 (%.1f MB) over %s; median of %zu rounds after %zu "
                "warm-up, in each of %zu pass(es).\n",
                o.elements, tensor_mb, where.c_str(), o.rounds, o.warmup, o.passes);
    if (shaped) {
        std::printf("bound = the median round time / the least time the links allow (2(N-1)/N x "
                    "tensor bytes / link rate where they are equal):");
        for (const auto n : o.processes)
            std::printf(" %.3f s at N=%zu", byte_bound(n), n);
        std::printf(".\n");
    }
    std::printf("s = median round seconds (earliest start to latest end); GB/s = algorithm "
                "bandwidth = tensor bytes / s;\nmem = peak extra memory per process / tensor "
                "bytes (VmHWM minus RSS after allocating the tensor);\nCPU s = median CPU "
                "seconds (user + system) of all processes together in a round.\n");
    std::printf("Load average (1/5/15 min): %s at start, %s at end; %u cores.\n\n",
                load_at_start.c_str(), load_at_end.c_str(), std::thread::hardware_concurrency());
    const int width = shaped ? 38 : 31;
    std::printf("%-34s", "system / mode");
    for (const auto n : o.processes)
        std::printf(
            " | %-*s", width,
            ("N=" + std::to_string(n) + "  s / GB/s / mem / CPU s" + (shaped ? " / bound" : ""))
                .c_str());
    std::printf("\n");
    for (std::size_t i = 0; i < rows.size(); ++i) {
        std::printf("%-34s", rows[i].label.c_str());
        for (std::size_t j = 0; j < o.processes.size(); ++j) {
            const auto& c = cells[i][j];
            if (c.status != "ok") {
                std::printf(" | %-*s", width,
                            ("FAILED: " + c.status).substr(0, std::size_t(width)).c_str());
                continue;
            }
            std::string text =
                program::format("%7.3f %6.3f %5.2fx %6.3f", c.median_seconds, c.gbytes_per_second,
                                c.memory_ratio, c.median_cpu_seconds);
            if (shaped)
                text += program::format(" %5.2fx", c.median_seconds / byte_bound(o.processes[j]));
            if (c.wrong) text += " WRONG";
            std::printf(" | %-*s", width, text.c_str());
        }
        std::printf("\n");
    }

    // The targets, where this run measured what they compare.
    auto find = [&](const std::string& name, std::size_t n) -> const cell* {
        for (std::size_t i = 0; i < rows.size(); ++i)
            if (rows[i].name == name)
                for (std::size_t j = 0; j < o.processes.size(); ++j)
                    if (o.processes[j] == n && cells[i][j].status == "ok") return &cells[i][j];
        return nullptr;
    };
    std::vector<target> targets;
    const auto ratio_target = [&](std::string text, const cell* a, const cell* b, double most) {
        target t{std::move(text), std::nullopt, ""};
        if (a && b) {
            t.met = a->median_seconds <= most * b->median_seconds;
            t.detail = program::format("%.6g s vs %.6g s", a->median_seconds, b->median_seconds);
        }
        targets.push_back(t);
    };
    if (shaped) {
        for (const auto n : o.processes) {
            const std::string at = ", N=" + std::to_string(n);
            const cell* plain = find("hivemesh", n);
            ratio_target("hivemesh load balancing at least 1.5x faster than a uniform split" + at,
                         plain, find("hivemesh-uniform", n), 1 / 1.5);
            target bound{"hivemesh uncompressed within 1.15x of the byte bound" + at, std::nullopt,
                         ""};
            if (plain) {
                const double ratio = plain->median_seconds / byte_bound(n);
                bound.met = ratio <= 1.15;
                bound.detail = program::format("%.3gx", ratio);
            }
            targets.push_back(bound);
            const cell* packed = find("hivemesh-8bit", n);
            ratio_target("hivemesh blockwise_8bit at least 3x faster than uncompressed" + at,
                         packed, plain, 1.0 / 3);
            const cell* better =
                plain && packed ? (plain->median_seconds <= packed->median_seconds ? plain : packed)
                                : nullptr;
            ratio_target("hivemesh adaptive within 5% of the better of none and blockwise_8bit" +
                             at,
                         find("hivemesh-adaptive", n), better, 1.05);
            const cell* ring = find("gloo-ring", n);
            const cell* hd = find("gloo-hd", n);
            const cell* gloo = ring && hd ? (ring->median_seconds <= hd->median_seconds ? ring : hd)
                                          : (ring ? ring : hd);
            ratio_target("hivemesh uncompressed no slower than Gloo's best" + at, plain, gloo, 1.0);
        }
    }
    if (!shaped) {
        target t{"hivemesh plaintext none at 4 processes no slower than Gloo halving-doubling",
                 std::nullopt, ""};
        const cell* ours = find("hivemesh", 4);
        const cell* theirs = find("gloo-hd", 4);
        if (ours && theirs) {
            t.met = ours->median_seconds <= theirs->median_seconds;
            t.detail =
                program::format("%.6g s vs %.6g s", ours->median_seconds, theirs->median_seconds);
        }
        targets.push_back(t);
    }
    for (const auto n : !shaped ? o.processes : std::vector<std::size_t>{}) {
        target t{"hivemesh blockwise_8bit at least 2x faster than uncompressed, N=" +
                     std::to_string(n),
                 std::nullopt, ""};
        const cell* plain = find("hivemesh", n);
        const cell* packed = find("hivemesh-8bit", n);
        if (plain && packed) {
            t.met = packed->median_seconds * 2 <= plain->median_seconds;
            t.detail = program::format("%.6gx", plain->median_seconds / packed->median_seconds);
        }
        targets.push_back(t);
    }
    {
        target t{"hivemesh peak extra memory per process <= 1.5x the tensor", std::nullopt, ""};
        double worst = 0;
        bool any = false;
        for (std::size_t i = 0; i < rows.size(); ++i)
            if (rows[i].child == "hivemesh")
                for (const auto& c : cells[i])
                    if (c.status == "ok") {
                        any = true;
                        worst = std::max(worst, c.memory_ratio);
                    }
        if (any) {
            t.met = worst <= 1.5;
            t.detail = program::format("worst %.6gx", worst);
        }
        targets.push_back(t);
    }
    std::printf("\nTargets (timing targets are not enforced by the exit status):\n");
    for (const auto& t : targets)
        std::printf("  [%s] %s%s\n",
                    !t.met   ? "n/a "
                    : *t.met ? "met "
                             : "MISS",
                    t.text.c_str(), t.detail.empty() ? "" : (": " + t.detail).c_str());
    std::printf("Correctness: %s\n", any_failure ? "FAILED (see above)" : "every process ok");

    if (!o.json_path.empty()) {
        nlohmann::ordered_json report = {
            {"benchmark", "allreduce"},
            {"elements", o.elements},
            {"tensor_bytes", o.elements * sizeof(float)},
            {"warmup_rounds", o.warmup},
            {"timed_rounds", o.rounds},
            {"passes", o.passes},
            {"link", shaped ? joined(o.links) : "loopback"},
            {"congestion_control", shaped ? namespaces_congestion() : std::string()},
            {"clients", o.clients},
            {"part_size_bytes", o.part_size},
            {"cores", std::thread::hardware_concurrency()},
            {"load_at_start", load_at_start},
            {"load_at_end", load_at_end},
            {"round_time", "earliest start to latest end over the processes, median over timed "
                           "rounds"},
            {"bandwidth", "algorithm bandwidth: tensor bytes / median round time, 1e9 bytes per "
                          "GB"},
            {"memory_ratio", "max over processes of (VmHWM - VmRSS after allocating the tensor) / "
                             "tensor bytes"},
            {"cpu", "median over timed rounds of the user + system seconds (and context "
                    "switches) of all processes inside the round"},
            {"results", nlohmann::ordered_json::array()},
            {"targets", nlohmann::ordered_json::array()},
            {"correct", !any_failure}};
        for (std::size_t i = 0; i < rows.size(); ++i)
            for (std::size_t j = 0; j < o.processes.size(); ++j) {
                const auto& c = cells[i][j];
                nlohmann::ordered_json result = {{"system", rows[i].name},
                                                 {"label", rows[i].label},
                                                 {"processes", o.processes[j]},
                                                 {"status", c.status},
                                                 {"correct", c.status == "ok" && !c.wrong},
                                                 {"load_before", c.load_before}};
                if (c.status == "ok") {
                    result["median_seconds"] = c.median_seconds;
                    result["median_cpu_seconds"] = c.median_cpu_seconds;
                    result["median_context_switches"] = c.median_switches;
                    result["gbytes_per_second"] = c.gbytes_per_second;
                    result["memory_ratio"] = c.memory_ratio;
                    result["max_error"] = c.max_error;
                    result["round_seconds"] = c.round_seconds;
                    if (shaped) {
                        result["byte_bound_seconds"] = byte_bound(o.processes[j]);
                        result["bound_ratio"] = c.median_seconds / byte_bound(o.processes[j]);
                    }
                }
                report["results"].push_back(std::move(result));
            }
        for (const auto& t : targets)
            report["targets"].push_back(
                {{"target", t.text},
                 {"met", t.met ? nlohmann::ordered_json(*t.met) : nlohmann::ordered_json()},
                 {"detail", t.detail}});
        program::write_json(o.json_path, report);
    }
    return any_failure ? 1 : 0;
}

/// --link: runs this same command again under scripts/netns-swarm.sh, which makes a namespace
/// for each process of the largest count, shapes their links, and removes it all at the end.
/// 0 when the script skipped (no root or ip netns: it said so).
int run_in_namespaces(const options& o, int argc, char** argv) {
    const std::size_t peers = *std::max_element(o.processes.begin(), o.processes.end());
    const std::size_t rows = o.systems.empty() ? all_systems().size() : o.systems.size();
    const std::size_t bound = rows * o.processes.size() * o.passes * o.child_timeout + 60;
    // tbf's bucket holds 10 ms at the rate (128 KiB at least): a small one throttles a fast
    // link below its rate.
    std::vector<std::string> bursts;
    for (const auto& rate : o.links)
        bursts.push_back(
            std::to_string(std::max<std::size_t>(
                128 * 1024, static_cast<std::size_t>(link_bytes_per_second(rate) / 100))) +
            "b");
    std::vector<std::string> args{HIVEMESH_SCRIPTS_DIR "/netns-swarm.sh",
                                  "--peers",
                                  std::to_string(peers),
                                  "--rate",
                                  joined(o.links),
                                  "--burst",
                                  joined(bursts),
                                  "--loopback",
                                  "--timeout",
                                  std::to_string(bound),
                                  "--",
                                  executable_path()};
    for (int i = 1; i < argc; ++i)
        args.emplace_back(argv[i]);
    if (!o.congestion.empty()) args.insert(args.begin() + 1, {"--congestion", o.congestion});
    auto script = process::start("/bin/bash", args, false); // our stdout, its stdin /dev/null
    int status = 0;
    if (waitpid(script.pid, &status, 0) != script.pid)
        throw std::system_error(errno, std::generic_category(), "waitpid");
    if (WIFEXITED(status) && WEXITSTATUS(status) == 77) return 0; // skipped, and said why
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    std::fprintf(stderr, "bench_allreduce: netns-swarm.sh killed by %s\n",
                 strsignal(WTERMSIG(status)));
    return 1;
}

} // namespace
} // namespace hivemesh::bench::allreduce

int main(int argc, char** argv) {
    using namespace hivemesh::bench::allreduce;
    try {
        const auto o = parse(argc, argv);
        if (!o.child.empty()) return child_main(o);
        if (!o.links.empty() && !std::getenv("HIVEMESH_NETNS_NAMES"))
            return run_in_namespaces(o, argc, argv);
        return driver_main(o);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_allreduce: %s\n", e.what());
        return 1;
    }
}
