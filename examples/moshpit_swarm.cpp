// A local Moshpit swarm: N OS processes on loopback TCP find each other through the DHT,
// form groups by their Moshpit keys and average a real-size tensor round after round.
//
//   moshpit_swarm [--peers 16] [--group 4] [--rounds 3] [--elements 4194304]
//                 [--codec none|float16|blockwise_8bit] [--plaintext] [--base-port 29300]
//                 [--hosts 127.0.0.1,...] [--json FILE] [--check]
//   moshpit_swarm --rank R [the same options]      (one peer only: see below)
//
// The parent starts one child process per peer (the same program with --rank), starts each
// round once every peer finished the last (a line on the children's stdin), and prints,
// per round: the group sizes, the slowest peer's step time, the bytes sent, the throughput,
// and how far the peers still are from the global mean (root mean square over peers and
// elements; every peer starts with the values rank + a small pattern, so the mean is known
// everywhere). With N = group^d peers the swarm holds the exact mean after d rounds;
// --check exits 1 unless the last round averaged everything and reached the mean.
//
// Rank r listens at the r-th address of --hosts (the last one for ranks beyond the list) on
// port --base-port + r and announces that address; the others bootstrap from rank 0's. With
// --rank R the program runs only that peer, for peers on several hosts or network namespaces
// (scripts/netns-swarm.sh): it prints `ready 1` once it joined, starts a round at each line
// on stdin and prints one line per round:
//   round N rank R seconds S group G fraction F sent BYTES squares Q
// where Q is the sum over its elements of the squared distance from the global mean (or
// `round N rank R error CODE`). Every process of a swarm needs the same options.
#include <hivemesh/averaging/averager.hpp>
#include <hivemesh/dht/node.hpp>
#include <hivemesh/net/tcp.hpp>
#include <hivemesh/tensor/raw.hpp>

#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/thread_pool.hpp>

#include "process.hpp"
#include "program.hpp"

#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <future>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace hivemesh;
using namespace std::chrono_literals;

namespace {

struct options {
    std::size_t peers = 16;
    std::size_t group = 4;
    std::size_t rounds = 3;
    std::size_t elements = std::size_t{1} << 22; // 16 MiB of float32
    compression::kind codec = compression::kind::none;
    bool plaintext = false;
    bool check = false; ///< fail unless the last round holds the exact mean everywhere
    unsigned base_port = 29300;
    std::vector<asio::ip::address> hosts{asio::ip::address_v4::loopback()};
    std::string json;
    std::optional<std::size_t> rank;
};

options parse(int argc, char** argv) {
    CLI::App app{"A local Moshpit swarm: N OS processes on loopback TCP find each other through "
                 "the DHT, form groups by their Moshpit keys and average a tensor round after "
                 "round.",
                 "moshpit_swarm"};
    app.option_defaults()->always_capture_default();
    options o;
    std::string codec(compression::to_string(o.codec));
    std::vector<std::string> codecs;
    for (const auto k : compression::all_kinds)
        codecs.emplace_back(compression::to_string(k));
    app.add_option("--peers", o.peers, "processes, one peer each")->check(CLI::Range(2, 65535));
    app.add_option("--group", o.group, "target group size")->check(CLI::Range(2, 65535));
    app.add_option("--rounds", o.rounds, "averaging rounds")->check(program::positive);
    app.add_option("--elements", o.elements, "float32 per peer")->check(program::positive);
    app.add_option("--codec", codec, "how the all-reduce compresses its parts")
        ->check(CLI::IsMember(codecs));
    app.add_flag("--plaintext", o.plaintext, "authenticated but unencrypted sessions");
    app.add_option("--base-port", o.base_port,
                   "rank r listens at this port + r (on its address of --hosts)")
        ->check(CLI::Range(1, 65535));
    std::vector<std::string> hosts{"127.0.0.1"};
    app.add_option("--hosts", hosts,
                   "IP addresses of the peers: rank r listens at the r-th (the last one for "
                   "ranks beyond the list) and announces it; rank 0's is the bootstrap peer")
        ->delimiter(',')
        ->type_name("IP,...");
    app.add_option("--json", o.json, "also write the rounds as JSON to FILE")->type_name("FILE");
    app.add_flag("--check", o.check,
                 "exit 1 unless the last round averaged everything and reached the mean");
    app.add_option("--rank", o.rank,
                   "run only the peer of this rank (a round starts at each line on stdin; "
                   "see the top of moshpit_swarm.cpp), e.g. on its own host of --hosts")
        ->check(program::non_negative);
    try {
        app.parse(argc, argv);
        o.hosts.clear();
        for (const auto& text : hosts) {
            std::error_code bad;
            const auto ip = asio::ip::make_address(text, bad);
            if (bad || ip.is_unspecified())
                throw CLI::ValidationError("--hosts", "not an IP address to dial: " + text);
            o.hosts.push_back(ip);
        }
        if (o.hosts.empty()) throw CLI::ValidationError("--hosts", "needs an address");
        if (o.rank && *o.rank >= o.peers) throw CLI::ValidationError("--rank", "below --peers");
        o.codec = *compression::parse_kind(codec);
        if (o.group > o.peers) throw CLI::ValidationError("--group", "at most --peers");
        if (o.base_port + o.peers > 65535)
            throw CLI::ValidationError("--base-port", "too high for --peers");
    } catch (const CLI::ParseError& e) {
        program::exit_after(app, e);
    }
    return o;
}

/// Every peer's identity follows from its rank, so all know rank 0's PeerId.
crypto::identity identity_of(std::size_t rank) {
    std::array<std::byte, 32> seed{};
    seed.fill(static_cast<std::byte>(rank + 1));
    seed[0] = std::byte{0x5A};
    return crypto::identity::from_seed(seed);
}

/// Where rank `rank` listens, and where the others reach it.
asio::ip::tcp::endpoint endpoint_of(const options& o, std::size_t rank) {
    return {o.hosts[std::min(rank, o.hosts.size() - 1)],
            static_cast<unsigned short>(o.base_port + rank)};
}

float pattern(std::size_t i) {
    return 0.01f * static_cast<float>(i % 97);
}

/// Bits per key: the swarm is split into peers/group groups of `group`.
std::size_t key_bits(const options& o) {
    std::size_t groups = std::max<std::size_t>(1, o.peers / o.group), bits = 0;
    while ((std::size_t{1} << (bits + 1)) <= groups)
        ++bits;
    return bits;
}

// ---- one peer ----------------------------------------------------------------------------

int run_peer(const options& o) {
    using rpc_node_type = net::node<net::tcp::transport>;
    using dht_node_type = dht::node<net::tcp::transport>;
    const std::size_t rank = *o.rank;
    // Declared first, destroyed last: strands on it outlive handlers still queued in `io`.
    asio::thread_pool compute(1);
    asio::io_context io;
    net::tcp::transport tcp(io.get_executor());
    net::node_options rpc_options;
    rpc_options.security.plaintext = o.plaintext;
    rpc_node_type rpc(tcp, identity_of(rank), rpc_options);
    const auto endpoint = endpoint_of(o, rank);
    rpc.serve(tcp.listen(endpoint));
    dht_node_type dht(rpc, endpoint);

    std::vector<float> values(o.elements);
    for (std::size_t i = 0; i < values.size(); ++i)
        values[i] = static_cast<float>(rank) + pattern(i);
    const double mean_rank = static_cast<double>(o.peers - 1) / 2.0;

    averaging::averager_options ao;
    ao.prefix = "swarm";
    ao.group_key_length = key_bits(o);
    ao.initial_bits =
        averaging::group_bits(rank % (std::size_t{1} << ao.group_key_length), ao.group_key_length);
    ao.target_group_size = o.group;
    ao.min_group_size = 2;
    ao.matchmaking_time = 10s;
    ao.averaging_timeout = 120s;
    ao.bandwidth = 1e9;
    ao.allreduce.codec = o.codec;
    ao.allreduce.slow_link_codec.reset(); // --codec's, over any link: the swarm compares codecs
    std::vector<tensor::tensor_ref> tensors;
    tensors.emplace_back(values);
    averaging::averager<net::tcp::transport> averager(rpc, dht, endpoint, tensors, ao,
                                                      compute.get_executor());

    auto work = asio::make_work_guard(io);
    std::thread io_thread([&] { io.run(); });
    int exit_code = 0;
    try {
        if (rank != 0) {
            const rpc_node_type::peer first{identity_of(0).id(), endpoint_of(o, 0)};
            for (int attempt = 0;; ++attempt) {
                try {
                    dht.bootstrap({first});
                    break;
                } catch (const std::system_error&) {
                    if (attempt == 100) throw;
                    std::this_thread::sleep_for(200ms);
                }
            }
        }
        std::this_thread::sleep_for(1s); // let the routing tables fill
        std::cout << "ready 1" << std::endl;
        for (std::size_t round = 1; round <= o.rounds; ++round) {
            // Every peer starts round r together (the parent's "go"), so no fast peer groups
            // with a slow one still in round r - 1: that breaks the Moshpit grid, and can
            // leave a peer without a partner for its whole matchmaking window.
            std::string go;
            if (!std::getline(std::cin, go)) throw std::runtime_error("the parent went away");
            const auto start = std::chrono::steady_clock::now();
            std::ostringstream line;
            line << "round " << round << " rank " << rank;
            try {
                const auto result = averager.step(1.0);
                const double seconds =
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
                // Only the main thread touches the tensor between steps.
                double squares = 0;
                for (std::size_t i = 0; i < values.size(); ++i) {
                    const double d = values[i] - (mean_rank + pattern(i));
                    squares += d * d;
                }
                line << " seconds " << seconds << " group " << result.group_size << " fraction "
                     << result.allreduce.fraction_averaged() << " sent "
                     << result.allreduce.bytes_sent << " squares " << squares;
                std::size_t local_parts = 0;
                for (const auto& part : result.allreduce.parts)
                    local_parts += part.averaged() ? 0 : 1;
                if (local_parts > 0) {
                    std::ostringstream why;
                    why << "moshpit_swarm rank " << rank << " round " << round << ": "
                        << local_parts << " parts stayed local (reducers";
                    for (const auto& part : result.allreduce.parts)
                        if (!part.averaged()) why << ' ' << part.reducer << '@' << part.begin;
                    std::cerr << why.str() << ")\n";
                }
            } catch (const std::system_error& e) {
                line << " error " << e.code().value();
                exit_code = 1;
            }
            std::cout << line.str() << std::endl;
        }
    } catch (const std::exception& e) {
        std::cerr << "moshpit_swarm rank " << rank << ": " << e.what() << '\n';
        exit_code = 1;
    }
    // Stay reachable a little, so slower peers finish their last round with us.
    std::this_thread::sleep_for(3s);
    asio::post(io, [&] {
        dht.close();
        rpc.close();
    });
    work.reset();
    std::this_thread::sleep_for(200ms);
    io.stop();
    io_thread.join();
    return exit_code;
}

// ---- the parent --------------------------------------------------------------------------

struct round_summary {
    std::size_t reports = 0, failures = 0, min_group = SIZE_MAX, max_group = 0;
    double slowest = 0, squares = 0, fraction = 0;
    std::uint64_t sent = 0;
};

int run_swarm(const options& o, const char* self) {
    std::cout << "moshpit_swarm: " << o.peers << " processes, groups of " << o.group << ", "
              << key_bits(o) << "-bit keys, " << o.elements << " float32 ("
              << (o.elements * 4.0 / (1 << 20)) << " MiB) each, codec "
              << compression::to_string(o.codec) << (o.plaintext ? ", plaintext" : ", encrypted")
              << "\n";
    std::vector<pid_t> children;
    std::vector<int> pipes;        ///< each child's stdout
    std::vector<int> gos;          ///< each child's stdin: a line starts its next round
    std::signal(SIGPIPE, SIG_IGN); // a child that died: its write fails instead
    for (std::size_t rank = 0; rank < o.peers; ++rank) {
        std::vector<std::string> args{"--rank",      std::to_string(rank),
                                      "--peers",     std::to_string(o.peers),
                                      "--group",     std::to_string(o.group),
                                      "--rounds",    std::to_string(o.rounds),
                                      "--elements",  std::to_string(o.elements),
                                      "--codec",     std::string(compression::to_string(o.codec)),
                                      "--base-port", std::to_string(o.base_port)};
        std::string hosts;
        for (const auto& ip : o.hosts)
            hosts += (hosts.empty() ? "" : ",") + ip.to_string();
        args.insert(args.end(), {"--hosts", hosts});
        if (o.plaintext) args.emplace_back("--plaintext");
        program::child_stdio stdio;
        stdio.stdin_pipe = stdio.stdout_pipe = true;
        const auto child = program::spawn(self, args, stdio);
        children.push_back(child.pid);
        pipes.push_back(child.stdout_fd);
        gos.push_back(child.stdin_fd);
    }

    std::map<std::size_t, round_summary> rounds;
    double last_rms = NAN, last_fraction = 0;
    std::vector<std::string> partial(o.peers);
    std::size_t open = o.peers;
    std::size_t printed = 0;
    std::vector<long> reached(o.peers, -1); ///< per child: 0 ready, r: reported round r
    std::size_t released = 0;               ///< rounds started
    std::printf("%5s %7s %10s %10s %10s %14s %9s\n", "round", "groups", "slowest s", "sent MB",
                "MB/s", "rms from mean", "averaged");
    nlohmann::ordered_json report = {
        {"peers", o.peers},          {"group", o.group},
        {"elements", o.elements},    {"codec", compression::to_string(o.codec)},
        {"encrypted", !o.plaintext}, {"rounds", nlohmann::ordered_json::array()}};
    while (open > 0) {
        std::vector<pollfd> polled;
        for (int fd : pipes)
            polled.push_back({fd, POLLIN, 0});
        if (poll(polled.data(), polled.size(), 1000) < 0) break;
        for (std::size_t i = 0; i < polled.size(); ++i) {
            if (pipes[i] < 0 || !(polled[i].revents & (POLLIN | POLLHUP))) continue;
            char buffer[4096];
            const auto n = read(pipes[i], buffer, sizeof buffer);
            if (n <= 0) {
                close(pipes[i]);
                pipes[i] = -1;
                --open;
                continue;
            }
            partial[i].append(buffer, static_cast<std::size_t>(n));
            for (auto nl = partial[i].find('\n'); nl != std::string::npos;
                 nl = partial[i].find('\n')) {
                std::istringstream line(partial[i].substr(0, nl));
                partial[i].erase(0, nl + 1);
                std::map<std::string, double> fields;
                std::string key;
                double value = 0;
                while (line >> key >> value)
                    fields[key] = value;
                if (fields.count("ready")) {
                    reached[i] = 0;
                    continue;
                }
                reached[i] = std::max(reached[i], static_cast<long>(fields["round"]));
                auto& r = rounds[static_cast<std::size_t>(fields["round"])];
                ++r.reports;
                if (fields.count("error")) {
                    ++r.failures;
                } else {
                    const auto g = static_cast<std::size_t>(fields["group"]);
                    r.min_group = std::min(r.min_group, g);
                    r.max_group = std::max(r.max_group, g);
                    r.slowest = std::max(r.slowest, fields["seconds"]);
                    r.squares += fields["squares"];
                    r.fraction += fields["fraction"];
                    r.sent += static_cast<std::uint64_t>(fields["sent"]);
                }
            }
        }
        // Start the next round once every live peer finished the last one (or is ready).
        while (released < o.rounds) {
            bool all = true;
            for (std::size_t i = 0; i < o.peers; ++i)
                all = all && (pipes[i] < 0 || reached[i] >= static_cast<long>(released));
            if (!all) break;
            ++released;
            for (std::size_t i = 0; i < o.peers; ++i) {
                if (pipes[i] < 0) continue;
                const auto sent = write(gos[i], "go\n", 3); // fails only if it just died
                (void)sent;
            }
        }
        // Print each round once every peer reported it.
        while (rounds.count(printed + 1) && rounds[printed + 1].reports == o.peers) {
            const auto& r = rounds[++printed];
            const std::size_t ok = o.peers - r.failures;
            const double rms =
                ok ? std::sqrt(r.squares / static_cast<double>(ok * o.elements)) : NAN;
            const double mb = static_cast<double>(r.sent) / 1e6;
            last_rms = rms;
            last_fraction = ok == o.peers ? r.fraction / static_cast<double>(ok) : 0.0;
            std::printf("%5zu %3zu-%-3zu %10.2f %10.1f %10.1f %14.3g %8.1f%%%s\n", printed,
                        ok ? r.min_group : 0, r.max_group, r.slowest, mb, mb / r.slowest, rms,
                        ok ? 100.0 * r.fraction / static_cast<double>(ok) : 0.0,
                        r.failures ? "  (some peers failed)" : "");
            std::fflush(stdout);
            report["rounds"].push_back({{"round", printed},
                                        {"slowest_seconds", r.slowest},
                                        {"bytes_sent", r.sent},
                                        {"rms_from_mean", rms},
                                        {"failures", r.failures}});
        }
    }
    for (int fd : gos)
        close(fd);
    int status = 0, failed = 0;
    for (pid_t pid : children)
        if (status = program::wait_for(pid); !WIFEXITED(status) || WEXITSTATUS(status) != 0)
            ++failed;
    if (!o.json.empty()) program::write_json(o.json, report);
    const double start_rms = std::sqrt((static_cast<double>(o.peers) * o.peers - 1) / 12.0);
    std::cout << "rms from the mean before averaging: " << start_rms << "; "
              << (failed ? std::to_string(failed) + " peer processes failed" : "all peers finished")
              << "\n";
    if (o.check && !(printed == o.rounds && last_fraction == 1.0 && last_rms <= 1e-5 * start_rms)) {
        std::cout << "check failed: the last round did not hold the exact mean everywhere\n";
        return 1;
    }
    return failed ? 1 : 0;
}

} // namespace

int main(int argc, char** argv) {
    try {
        const auto o = parse(argc, argv);
        if (o.rank) return run_peer(o);
        return run_swarm(o, "/proc/self/exe");
    } catch (const std::exception& e) {
        std::cerr << "moshpit_swarm: " << e.what() << '\n';
        return 1;
    }
}
