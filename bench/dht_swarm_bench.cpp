// DHT swarm benchmark: N hivemesh DHT nodes on loopback (UDP datagrams, TCP for what does not
// fit one; see net::datagram_options), and OpenDHT's DhtRunner nodes side by side when it is
// installed, bootstrapped to each other, then a fixed number of stores and gets of distinct
// keys from random nodes with bounded concurrency. Reports store and get latency (p50, p99),
// operations per second, success rate (a get must return exactly the stored value) and
// memory per node, as a table and as JSON.
//
// Every row runs in child processes of this program (`--host SYSTEM`), so memory is measured
// on a fresh process and a system that crashes at some size becomes a row that says so. A
// child hosts its nodes and obeys commands on stdin, answering on stdout:
//   parent: SEED <port> <id> ... GO     child: PEER <port> <id> ...
//                                              READY <failed> <seconds> <connection cap>
//   parent: STORE|GET <first> <count>   child: LAT <ms> ...
//                                              DONE <tried> <ok> <seconds> <requests sent>
//                                                   <handshakes>
//   parent: QUIT                        child: MEM <base KiB> <final KiB>, exits 0
// A multi-process row starts process 0, then the others bootstrapped to process 0's nodes;
// every process stores its share of the keys and gets the keys the next process stored.
#include "dht_swarm.hpp"
#include "program.hpp"

#include <hivemesh/core/clock.hpp>
#include <hivemesh/core/log.hpp>
#include <hivemesh/dht/node.hpp>
#include <hivemesh/net/node.hpp>
#include <hivemesh/net/tcp.hpp>

#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <future>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

using namespace std::chrono_literals;

namespace hivemesh::bench::swarm {
namespace {

// ---- hivemesh nodes ---------------------------------------------------------------------

class hivemesh_host final : public host {
public:
    using transport = net::tcp::transport;
    using rpc_node_type = net::node<transport>;
    using dht_node_type = dht::node<transport>;

    explicit hivemesh_host(const host_config& config)
        : config_(config)
        , rng_(config.seed * 1000003 + config.process_index) {
        net::node_options rpc_options;
        rpc_options.security.plaintext = config.plaintext;
        rpc_options.max_connections = config.max_connections;
        // Keys are stored once and read for the whole run, an hour ahead: every node of the
        // benchmark's swarm accepts that (the default cap is minutes).
        dht::node_options dht_options;
        dht_options.storage.max_lifetime = dht_options.cache.max_lifetime = std::chrono::hours(2);
        const std::size_t threads = std::max<std::size_t>(config.threads, 1);
        for (std::size_t t = 0; t < threads; ++t)
            ios_.push_back(std::make_unique<asio::io_context>(1));
        // Every node exists before any io thread runs, so no handler races its construction.
        for (std::size_t i = 0; i < config.nodes; ++i) {
            auto& t = transports_.emplace_back(ios_[i % threads]->get_executor());
            auto& rpc =
                rpcs_.emplace_back(std::make_unique<rpc_node_type>(t, identity(i), rpc_options));
            auto listener = t.listen({asio::ip::address_v4::loopback(), 0});
            endpoints_.push_back(listener.local_endpoint());
            rpc->serve(std::move(listener));
            dhts_.push_back(std::make_unique<dht_node_type>(*rpc, endpoints_.back(), dht_options));
        }
        for (auto& io : ios_) {
            guards_.emplace_back(io->get_executor());
            threads_.emplace_back([&io = *io] { io.run(); });
        }
    }

    ~hivemesh_host() override {
        guards_.clear();
        for (auto& io : ios_)
            io->stop();
        for (auto& t : threads_)
            t.join();
        dhts_.clear(); // the io threads are gone: closing touches no running node
        rpcs_.clear();
    }

    std::size_t bootstrap(const std::vector<seed_peer>& seeds) override {
        std::vector<rpc_node_type::peer> remote;
        for (const auto& s : seeds) {
            const auto id = crypto::peer_id::parse(s.id);
            if (!id) throw std::runtime_error("bad seed PeerId " + s.id);
            remote.push_back({*id, {asio::ip::address_v4::loopback(), s.port}});
        }
        std::mutex mutex;
        std::condition_variable done;
        std::size_t failed = 0;
        constexpr std::size_t wave = 50; // the swarm grows as a real one does, not all at once
        for (std::size_t begin = 0; begin < dhts_.size(); begin += wave) {
            const std::size_t end = std::min(dhts_.size(), begin + wave);
            std::size_t pending = 0;
            for (std::size_t i = begin; i < end; ++i) {
                std::vector<rpc_node_type::peer> initial;
                if (!remote.empty()) initial.push_back(remote[rng_.uniform(remote.size())]);
                if (i > 0) initial.push_back(address(0));
                if (begin > 1) initial.push_back(address(1 + rng_.uniform(begin - 1)));
                if (initial.empty()) continue; // the very first node: the others come to it
                {
                    std::lock_guard lock(mutex);
                    ++pending;
                }
                dhts_[i]->async_bootstrap(std::move(initial), [&](std::error_code ec) {
                    std::lock_guard lock(mutex);
                    if (ec) ++failed;
                    if (--pending == 0) done.notify_all();
                });
            }
            std::unique_lock lock(mutex);
            done.wait(lock, [&] { return pending == 0; });
        }
        std::fprintf(stderr, "process %zu: bootstrap sent %llu requests, %llu failed\n",
                     config_.process_index, static_cast<unsigned long long>(requests_sent()),
                     static_cast<unsigned long long>(requests_sent(true)));
        return failed;
    }

    std::vector<seed_peer> peers() const override {
        std::vector<seed_peer> out;
        for (std::size_t i = 0; i < rpcs_.size(); ++i)
            out.push_back({endpoints_[i].port(), rpcs_[i]->id().to_string()});
        return out;
    }

    phase_result run_phase(bool store, std::size_t first, std::size_t count) override {
        // Choices are made up front, so the operations (run on io threads) share no RNG.
        std::vector<std::size_t> from(count);
        for (std::size_t i = 0; i < count; ++i) {
            const std::size_t key = first + i;
            std::size_t n = rng_.uniform(dhts_.size());
            if (!store && dhts_.size() > 1) {
                // Never the node that stored the key: that one may answer from its own storage.
                if (const auto it = stored_by_.find(key); it != stored_by_.end())
                    n = (it->second + 1 + rng_.uniform(dhts_.size() - 1)) % dhts_.size();
            }
            if (store) stored_by_[key] = n;
            from[i] = n;
        }
        const time_point expiration = wall_clock().now() + std::chrono::hours(1);
        const std::uint64_t requests_before = requests_sent();
        const std::uint64_t handshakes_before = handshakes();
        auto result = run_operations(
            count, config_.concurrency, [&](std::size_t i, std::function<void(bool)> finish) {
                const std::string key = key_of(first + i);
                auto value = value_of(first + i, config_.value_size, config_.seed);
                auto& node = *dhts_[from[i]];
                if (store) {
                    node.async_store(as_bytes(key), value, expiration,
                                     [finish](std::error_code ec, dht::store_outcome outcome) {
                                         finish(!ec && outcome.replicas > 0);
                                     });
                } else {
                    node.async_get(as_bytes(key), dht::get_options{},
                                   [finish, value = std::move(value)](std::error_code ec,
                                                                      dht::key_entry entry) {
                                       finish(!ec && entry.plain && entry.plain->value == value);
                                   });
                }
            });
        result.requests = requests_sent() - requests_before;
        result.handshakes = handshakes() - handshakes_before;
        return result;
    }

private:
    crypto::identity identity(std::size_t i) const {
        random_generator rng(config_.seed * 0x51ED270B27u + config_.process_index * 1000003u + i);
        std::array<std::byte, 32> seed{};
        for (auto& b : seed)
            b = static_cast<std::byte>(rng() & 0xFF);
        return crypto::identity::from_seed(seed);
    }

    rpc_node_type::peer address(std::size_t i) const { return {rpcs_[i]->id(), endpoints_[i]}; }

    /// The sum of count(i) over the nodes, each read on its node's own thread.
    template <class Count>
    std::uint64_t sum_over_nodes(Count count) {
        std::uint64_t total = 0;
        for (std::size_t t = 0; t < ios_.size(); ++t) {
            std::promise<std::uint64_t> sum;
            asio::post(*ios_[t], [&] {
                std::uint64_t n = 0;
                for (std::size_t i = t; i < dhts_.size(); i += ios_.size())
                    n += count(i);
                sum.set_value(n);
            });
            total += sum.get_future().get();
        }
        return total;
    }

    /// DHT requests sent by all nodes so far (or those that failed).
    std::uint64_t requests_sent(bool failed_only = false) {
        return sum_over_nodes([&](std::size_t i) {
            return failed_only ? dhts_[i]->statistics().requests_failed
                               : dhts_[i]->statistics().requests_sent;
        });
    }

    /// Secure handshakes all nodes completed so far, dialing or accepting.
    std::uint64_t handshakes() {
        return sum_over_nodes(
            [&](std::size_t i) { return rpcs_[i]->statistics().handshakes_completed; });
    }

    host_config config_;
    random_generator rng_;
    std::vector<std::unique_ptr<asio::io_context>> ios_;
    std::vector<asio::executor_work_guard<asio::io_context::executor_type>> guards_;
    std::vector<std::thread> threads_;
    std::deque<transport> transports_;
    std::vector<std::unique_ptr<rpc_node_type>> rpcs_;
    std::vector<std::unique_ptr<dht_node_type>> dhts_;
    std::vector<asio::ip::tcp::endpoint> endpoints_;
    std::map<std::size_t, std::size_t> stored_by_;
};

// ---- command line -------------------------------------------------------------------------

struct options {
    std::vector<std::size_t> sizes{100, 200, 1000};
    std::size_t processes = 4;
    std::size_t nodes_per_process = 50;
    std::size_t ops = 1000;
    std::size_t opendht_max_nodes = 400;
    bool opendht = true;
    bool require_success = false;
    std::optional<std::string> json;
    unsigned child_timeout_s = 0; ///< 0: 120 s plus 0.6 s per node of the process
    host_config host;
    std::optional<std::string> host_system; ///< set in a child: which nodes to host
};

options parse_options(int argc, char** argv) {
    CLI::App app{"DHT swarm benchmark: hivemesh DHT nodes (and OpenDHT's, when built) on "
                 "loopback; store and get latency, throughput, success and memory.",
                 "bench_dht_swarm"};
    app.option_defaults()->always_capture_default();
    options o;
    const auto add_count = [&](const std::string& name, auto& value, const std::string& help) {
        return app.add_option(name, value, help)->check(program::non_negative);
    };
    add_count("--sizes", o.sizes, "single-process swarm sizes; none (or 0) for no such row")
        ->delimiter(',')
        ->transform(CLI::Transformer({{"none", "0"}}).description(""));
    add_count("--processes", o.processes,
              "also a row of P processes x --nodes-per-process nodes; 0 for none");
    add_count("--nodes-per-process", o.nodes_per_process, "nodes in each process of that row");
    add_count("--ops", o.ops, "stores, then as many gets, of distinct keys");
    add_count("--concurrency", o.host.concurrency, "operations in flight, over all processes");
    add_count("--value-size", o.host.value_size, "size of each value in bytes");
    add_count("--threads", o.host.threads,
              "hivemesh io threads per process, one io_context each (at 1000 nodes 2 give "
              "1.4-1.7x the throughput of 1; equal at 200)");
    app.add_flag("--plaintext", o.host.plaintext,
                 "hivemesh sessions authenticated but unencrypted");
    auto* max_connections =
        add_count("--max-connections", o.host.max_connections,
                  "hivemesh per-node connection cap, 0 for none (default: 3/4 of the descriptor "
                  "limit over the nodes of a process; none if that is 256 or more)")
            ->default_str("");
    add_count("--opendht-max-nodes", o.opendht_max_nodes,
              "largest OpenDHT swarm per process (OpenDHT uses select(), which aborts past "
              "FD_SETSIZE descriptors)");
    bool no_opendht = false;
    app.add_flag("--no-opendht", no_opendht, "hivemesh only");
    add_count("--seed", o.host.seed, "seed of the workload's keys, values and node choices");
    app.add_option("--json", o.json, "also write the rows as JSON to FILE")->type_name("FILE");
    app.add_flag("--require-success", o.require_success,
                 "exit 1 unless every hivemesh store and get succeeded");
    add_count("--child-timeout", o.child_timeout_s,
              "a process hosting nodes is killed after S seconds (0: 120 + 0.6 per node it hosts)");
    // A child hosting nodes for the parent.
    app.add_option("--host", o.host_system, "internal: host nodes of this system")
        ->check(CLI::IsMember({"hivemesh", "opendht"}))
        ->group("");
    add_count("--nodes", o.host.nodes, "internal: nodes to host")->group("");
    add_count("--process-index", o.host.process_index, "internal: this child's index")->group("");
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        program::exit_after(app, e);
    }
    std::erase(o.sizes, 0);
    o.opendht = !no_opendht;
    if (max_connections->count() == 0)
        o.host.max_connections = std::numeric_limits<std::size_t>::max();
    return o;
}

/// Raises the descriptor limit to the hard limit; returns the soft limit now in force.
std::size_t raise_descriptor_limit() {
    rlimit limit{};
    if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return 1024;
    if (limit.rlim_cur < limit.rlim_max) {
        limit.rlim_cur = limit.rlim_max;
        setrlimit(RLIMIT_NOFILE, &limit);
        getrlimit(RLIMIT_NOFILE, &limit);
    }
    return static_cast<std::size_t>(limit.rlim_cur);
}

// ---- child: host nodes, obey commands ------------------------------------------------------

std::unique_ptr<host> make_host(const std::string& system, const host_config& config) {
    if (system == "hivemesh") return std::make_unique<hivemesh_host>(config);
#ifdef HIVEMESH_HAVE_OPENDHT
    if (system == "opendht") return make_opendht_host(config);
#endif
    throw std::invalid_argument("unknown system " + system);
}

int host_main(const options& o, std::size_t descriptor_limit) {
    alarm(o.child_timeout_s ? o.child_timeout_s : 300); // a hung child dies, its row says so
    host_config config = o.host;
    if (config.max_connections == std::numeric_limits<std::size_t>::max()) {
        // Every connection costs a descriptor at both ends, all in this process: keep the
        // total under the limit, with room for listeners and connections being replaced.
        const std::size_t per_node =
            descriptor_limit * 3 / 4 / std::max<std::size_t>(config.nodes, 1);
        config.max_connections = per_node >= 256 ? 0 : std::max<std::size_t>(per_node, 4);
    }
    const std::size_t base = rss_kib();
    auto nodes = make_host(*o.host_system, config);
    std::vector<seed_peer> seeds;
    for (std::string line; std::getline(std::cin, line) && line != "GO";) {
        std::istringstream in(line);
        std::string word;
        seed_peer s;
        if (in >> word >> s.port >> s.id && word == "SEED") seeds.push_back(s);
    }
    const auto began = std::chrono::steady_clock::now();
    const std::size_t failed = nodes->bootstrap(seeds);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
    for (const auto& p : nodes->peers())
        std::printf("PEER %u %s\n", static_cast<unsigned>(p.port), p.id.c_str());
    std::printf("READY %zu %.3f %zu\n", failed, seconds, config.max_connections);
    std::fflush(stdout);
    for (std::string line; std::getline(std::cin, line);) {
        std::istringstream in(line);
        std::string command;
        std::size_t first = 0, count = 0;
        in >> command >> first >> count;
        if (command == "STORE" || command == "GET") {
            const auto r = nodes->run_phase(command == "STORE", first, count);
            std::string text = "LAT";
            for (const double ms : r.latencies_ms)
                text += program::format(" %.3f", ms);
            std::printf("%s\nDONE %zu %zu %.6f %llu %llu\n", text.c_str(), r.attempted, r.succeeded,
                        r.seconds, static_cast<unsigned long long>(r.requests),
                        static_cast<unsigned long long>(r.handshakes));
            std::fflush(stdout);
        } else if (command == "QUIT") {
            std::printf("MEM %zu %zu\n", base, rss_kib());
            std::fflush(stdout);
            nodes.reset();
            return 0;
        }
    }
    return 1;
}

// ---- parent: spawn children, run the workload, report -------------------------------------

struct child {
    pid_t pid = -1;
    FILE* to = nullptr;
    FILE* from = nullptr;
};

child spawn(const std::vector<std::string>& args) {
    int in[2], out[2];
    if (pipe(in) != 0 || pipe(out) != 0) throw std::system_error(errno, std::generic_category());
    std::fflush(nullptr);
    const pid_t pid = fork();
    if (pid < 0) throw std::system_error(errno, std::generic_category(), "fork");
    if (pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        close(in[0]);
        close(in[1]);
        close(out[0]);
        close(out[1]);
        std::vector<char*> argv;
        for (const auto& a : args)
            argv.push_back(const_cast<char*>(a.c_str()));
        argv.push_back(nullptr);
        execv("/proc/self/exe", argv.data());
        std::perror("bench_dht_swarm: execv");
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    return {pid, fdopen(in[1], "w"), fdopen(out[0], "r")};
}

/// Waits for the child; "" for a clean exit, else what happened.
std::string reap(child& c) {
    if (c.to) std::fclose(c.to);
    if (c.from) std::fclose(c.from);
    c.to = c.from = nullptr;
    int status = 0;
    if (c.pid > 0 && waitpid(c.pid, &status, 0) == c.pid) {
        c.pid = -1;
        if (WIFSIGNALED(status))
            return std::string("killed by signal ") + strsignal(WTERMSIG(status));
        if (WIFEXITED(status) && WEXITSTATUS(status) != 0)
            return "exit status " + std::to_string(WEXITSTATUS(status));
    }
    return {};
}

std::optional<std::string> read_line(child& c) {
    std::string line;
    int ch = 0;
    while ((ch = std::fgetc(c.from)) != EOF && ch != '\n')
        line.push_back(static_cast<char>(ch));
    if (ch == EOF && line.empty()) return std::nullopt;
    return line;
}

void send_line(child& c, const std::string& line) {
    std::fputs((line + "\n").c_str(), c.to);
    std::fflush(c.to);
}

struct phase_row {
    std::size_t attempted = 0, succeeded = 0;
    std::uint64_t requests = 0;   ///< DHT requests sent meanwhile (hivemesh only)
    std::uint64_t handshakes = 0; ///< handshakes completed meanwhile, both ends (hivemesh only)
    double seconds = 0, p50 = 0, p99 = 0;
    double success() const { return attempted ? 100.0 * succeeded / attempted : 0; }
    double ops_per_second() const { return seconds > 0 ? attempted / seconds : 0; }
    double per_op(double count) const {
        return attempted ? count / static_cast<double>(attempted) : 0;
    }
    double requests_per_op() const { return per_op(static_cast<double>(requests)); }
    /// Connections opened per operation: every connection among the swarm's nodes has
    /// both its ends in the swarm's processes, so two handshakes each.
    double connections_per_op() const { return per_op(static_cast<double>(handshakes) / 2); }
};

struct row {
    std::string system;
    std::size_t nodes = 0, processes = 1;
    bool ran = false;
    std::string note;
    double setup_seconds = 0;
    std::size_t bootstrap_failures = 0;
    std::size_t max_connections = 0;
    phase_row store, get;
    double kib_per_node = 0;
};

double percentile(std::vector<double> v, double q) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    const auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(v.size())));
    return v[std::clamp<std::size_t>(rank, 1, v.size()) - 1];
}

struct child_failure : std::runtime_error {
    using std::runtime_error::runtime_error;
};

/// Reads lines until one starting with `word`; PEER lines go to `peers`.
std::string expect(child& c, const std::string& word, std::vector<seed_peer>* peers = nullptr) {
    while (auto line = read_line(c)) {
        if (line->rfind(word + " ", 0) == 0 || *line == word) return *line;
        if (peers && line->rfind("PEER ", 0) == 0) {
            std::istringstream in(line->substr(5));
            seed_peer p;
            in >> p.port >> p.id;
            peers->push_back(p);
        }
    }
    const std::string why = reap(c);
    throw child_failure(why.empty() ? "child ended early" : why);
}

row run_row(const options& o, const std::string& system, std::size_t processes,
            std::size_t nodes_per_process) {
    row r;
    r.system = system;
    r.processes = processes;
    r.nodes = processes * nodes_per_process;
    std::vector<child> children;
    const auto args = [&](std::size_t index) {
        std::vector<std::string> a{"bench_dht_swarm",
                                   "--host",
                                   system,
                                   "--nodes",
                                   std::to_string(nodes_per_process),
                                   "--process-index",
                                   std::to_string(index),
                                   "--seed",
                                   std::to_string(o.host.seed),
                                   "--concurrency",
                                   std::to_string((o.host.concurrency + processes - 1) / processes),
                                   "--value-size",
                                   std::to_string(o.host.value_size),
                                   "--threads",
                                   std::to_string(o.host.threads),
                                   "--child-timeout",
                                   std::to_string(o.child_timeout_s
                                                      ? o.child_timeout_s
                                                      : 120 + nodes_per_process * 3 / 5)};
        if (o.host.max_connections != std::numeric_limits<std::size_t>::max()) {
            a.push_back("--max-connections");
            a.push_back(std::to_string(o.host.max_connections));
        }
        if (o.host.plaintext) a.push_back("--plaintext");
        return a;
    };
    const auto ready = [&](child& c, std::vector<seed_peer>* peers) {
        std::istringstream in(expect(c, "READY", peers).substr(6));
        std::size_t failed = 0, cap = 0;
        double seconds = 0;
        in >> failed >> seconds >> cap;
        r.bootstrap_failures += failed;
        r.max_connections = cap;
    };
    try {
        const auto began = std::chrono::steady_clock::now();
        std::vector<seed_peer> first_peers;
        children.push_back(spawn(args(0)));
        send_line(children[0], "GO");
        ready(children[0], &first_peers);
        for (std::size_t k = 1; k < processes; ++k) {
            children.push_back(spawn(args(k)));
            for (const auto& p : first_peers)
                send_line(children.back(), "SEED " + std::to_string(p.port) + " " + p.id);
            send_line(children.back(), "GO");
        }
        for (std::size_t k = 1; k < processes; ++k)
            ready(children[k], nullptr);
        r.setup_seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();

        const auto phase = [&](const char* command, std::size_t shift, phase_row& out) {
            for (std::size_t k = 0; k < processes; ++k) {
                const std::size_t from = (k + shift) % processes;
                const std::size_t first = o.ops * from / processes;
                const std::size_t last = o.ops * (from + 1) / processes;
                send_line(children[k], std::string(command) + " " + std::to_string(first) + " " +
                                           std::to_string(last - first));
            }
            std::vector<double> latencies;
            for (auto& c : children) {
                std::istringstream lat(expect(c, "LAT").substr(3));
                for (double ms = 0; lat >> ms;)
                    latencies.push_back(ms);
                std::istringstream done(expect(c, "DONE").substr(5));
                std::size_t attempted = 0, succeeded = 0;
                double seconds = 0;
                std::uint64_t requests = 0, handshakes = 0;
                done >> attempted >> succeeded >> seconds >> requests >> handshakes;
                out.requests += requests;
                out.handshakes += handshakes;
                out.attempted += attempted;
                out.succeeded += succeeded;
                out.seconds = std::max(out.seconds, seconds);
            }
            out.p50 = percentile(latencies, 0.50);
            out.p99 = percentile(latencies, 0.99);
        };
        phase("STORE", 0, r.store);
        phase("GET", processes > 1 ? 1 : 0, r.get); // the keys another process stored

        double kib = 0;
        for (auto& c : children) {
            send_line(c, "QUIT");
            std::istringstream in(expect(c, "MEM").substr(4));
            std::size_t base = 0, final_kib = 0;
            in >> base >> final_kib;
            kib += static_cast<double>(final_kib) - static_cast<double>(base);
            if (auto why = reap(c); !why.empty()) throw child_failure(why + " while closing");
        }
        r.kib_per_node = kib / static_cast<double>(r.nodes);
        r.ran = true;
        if (r.bootstrap_failures)
            r.note = std::to_string(r.bootstrap_failures) + " bootstrap failures";
    } catch (const child_failure& e) {
        r.note = std::string("failed: ") + e.what();
        for (auto& c : children)
            if (c.pid > 0) {
                kill(c.pid, SIGKILL);
                reap(c);
            }
    }
    return r;
}

void print_table(const std::vector<row>& rows) {
    std::printf("\n%-9s %6s %5s %7s %9s %9s %8s %7s %9s %9s %8s %7s %9s %9s %9s  %s\n", "system",
                "nodes", "procs", "setup s", "store p50", "store p99", "store/s", "store%",
                "get p50", "get p99", "get/s", "get%", "KiB/node", "req/op", "conn/op", "note");
    for (const auto& r : rows) {
        if (!r.ran) {
            std::printf("%-9s %6zu %5zu %s\n", r.system.c_str(), r.nodes, r.processes,
                        r.note.c_str());
            continue;
        }
        const bool counted = r.store.requests && r.get.attempted; // hivemesh only
        const std::string requests =
            counted
                ? program::format("%.1f/%.1f", r.store.requests_per_op(), r.get.requests_per_op())
                : "-";
        const std::string connections =
            counted ? program::format("%.1f/%.1f", r.store.connections_per_op(),
                                      r.get.connections_per_op())
                    : "-";
        std::printf("%-9s %6zu %5zu %7.1f %7.2fms %7.2fms %8.0f %6.1f%% %7.2fms %7.2fms %8.0f "
                    "%6.1f%% %9.1f %9s %9s  %s\n",
                    r.system.c_str(), r.nodes, r.processes, r.setup_seconds, r.store.p50,
                    r.store.p99, r.store.ops_per_second(), r.store.success(), r.get.p50, r.get.p99,
                    r.get.ops_per_second(), r.get.success(), r.kib_per_node, requests.c_str(),
                    connections.c_str(), r.note.c_str());
    }
    std::fflush(stdout);
}

void write_json(const std::string& path, const options& o, const std::vector<row>& rows) {
    nlohmann::ordered_json report = {{"benchmark", "dht_swarm"},
                                     {"transport", "tcp loopback"},
                                     {"ops", o.ops},
                                     {"concurrency", o.host.concurrency},
                                     {"value_size", o.host.value_size},
                                     {"hivemesh_threads", o.host.threads},
                                     {"hivemesh_encrypted", !o.host.plaintext},
                                     {"rows", nlohmann::ordered_json::array()}};
    const auto phase = [](const phase_row& p) {
        return nlohmann::ordered_json{{"attempted", p.attempted},
                                      {"succeeded", p.succeeded},
                                      {"success_rate", p.success() / 100},
                                      {"seconds", p.seconds},
                                      {"ops_per_second", p.ops_per_second()},
                                      {"p50_ms", p.p50},
                                      {"p99_ms", p.p99},
                                      {"requests_per_op", p.requests_per_op()},
                                      {"connections_per_op", p.connections_per_op()}};
    };
    for (const auto& r : rows) {
        nlohmann::ordered_json j = {{"system", r.system},
                                    {"nodes", r.nodes},
                                    {"processes", r.processes},
                                    {"ran", r.ran},
                                    {"note", r.note}};
        if (r.ran) {
            j["setup_seconds"] = r.setup_seconds;
            j["bootstrap_failures"] = r.bootstrap_failures;
            j["max_connections"] = r.max_connections;
            j["rss_kib_per_node"] = r.kib_per_node;
            j["store"] = phase(r.store);
            j["get"] = phase(r.get);
        }
        report["rows"].push_back(std::move(j));
    }
    program::write_json(path, report);
}

int parent_main(const options& o) {
#ifdef HIVEMESH_HAVE_OPENDHT
    const bool opendht = o.opendht;
#else
    const bool opendht = false;
    if (o.opendht) std::printf("OpenDHT: not built (libopendht-dev was not found)\n");
#endif
    std::vector<std::pair<std::size_t, std::size_t>> shapes; // processes x nodes each
    for (const auto n : o.sizes)
        shapes.emplace_back(1, n);
    if (o.processes > 0 && o.nodes_per_process > 0)
        shapes.emplace_back(o.processes, o.nodes_per_process);
    std::vector<row> rows;
    bool failed = false;
    for (const auto& [processes, per_process] : shapes) {
        for (const std::string system : {"hivemesh", "opendht"}) {
            if (system == "opendht" && !opendht) continue;
            std::fprintf(stderr, "running %s: %zu x %zu nodes\n", system.c_str(), processes,
                         per_process);
            if (system == "opendht" && per_process > o.opendht_max_nodes) {
                row r;
                r.system = system;
                r.processes = processes;
                r.nodes = processes * per_process;
                r.note = "skipped: " + std::to_string(per_process) +
                         " nodes in one process is above --opendht-max-nodes " +
                         std::to_string(o.opendht_max_nodes) +
                         " (OpenDHT's select() aborts past FD_SETSIZE descriptors)";
                rows.push_back(r);
                continue;
            }
            rows.push_back(run_row(o, system, processes, per_process));
            const auto& r = rows.back();
            if (system == "hivemesh") {
                if (!r.ran || r.bootstrap_failures) failed = true;
                if (o.require_success &&
                    (r.store.succeeded != r.store.attempted || r.get.succeeded != r.get.attempted))
                    failed = true;
            }
            print_table({r});
        }
    }
    std::printf("\nDHT swarm on loopback: %zu stores then %zu gets of distinct %zu-byte "
                "values from random nodes, %zu in flight; hivemesh %s, %zu io thread(s)\n",
                o.ops, o.ops, o.host.value_size, o.host.concurrency,
                o.host.plaintext ? "plaintext" : "encrypted", o.host.threads);
    print_table(rows);
    if (o.json) write_json(*o.json, o, rows);
    return failed ? 1 : 0;
}

} // namespace
} // namespace hivemesh::bench::swarm

int main(int argc, char** argv) {
    using namespace hivemesh::bench::swarm;
    try {
        const auto descriptors = raise_descriptor_limit();
        const auto o = parse_options(argc, argv);
        hivemesh::log::set_level(hivemesh::log::level::error);
        if (o.host_system) return host_main(o, descriptors);
        std::signal(SIGPIPE, SIG_IGN); // a dead child shows as EOF on its pipe instead
        return parent_main(o);
    } catch (const std::exception& e) {
        std::cerr << "bench_dht_swarm: " << e.what() << "\n";
        return 1;
    }
}
