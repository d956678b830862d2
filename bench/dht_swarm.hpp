// What the DHT swarm benchmark's halves share: a swarm of DHT nodes hosted by one process
// (hivemesh's, or OpenDHT's when it is installed), the bounded-concurrency workload driver,
// the keys and values of the workload, and memory readings.
#pragma once

#include <hivemesh/core/random.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace hivemesh::bench::swarm {

/// How one process hosts its nodes (the same for every process of a run).
struct host_config {
    std::size_t nodes = 100;
    std::size_t process_index = 0;
    std::uint64_t seed = 1;
    bool plaintext = false;          ///< hivemesh: authenticated but unencrypted sessions
    std::size_t threads = 2;         ///< hivemesh: io threads (one io_context each)
    std::size_t max_connections = 0; ///< hivemesh: per-node connection cap, 0 = none
    std::size_t concurrency = 16;    ///< operations in flight in this process
    std::size_t value_size = 64;
};

/// A node another process can bootstrap from: its loopback port and, for hivemesh, its
/// PeerId in base58 ("-" for OpenDHT).
struct seed_peer {
    std::uint16_t port = 0;
    std::string id;
};

/// The outcome of one phase (all stores or all gets) in one process.
struct phase_result {
    std::vector<double> latencies_ms; ///< one per operation, failed ones included
    std::size_t attempted = 0;
    std::size_t succeeded = 0;
    double seconds = 0;
    std::uint64_t requests = 0; ///< DHT requests the nodes sent meanwhile, 0 if unknown
    /// Secure handshakes the nodes completed meanwhile, dialing or accepting; 0 if unknown.
    std::uint64_t handshakes = 0;
};

/// The nodes of one process. Methods are called from the main thread, one at a time.
class host {
public:
    virtual ~host() = default;
    /// Bootstraps every node: from `seeds` (another process's nodes) and from the nodes
    /// of this process started before it. Returns how many nodes failed to bootstrap.
    virtual std::size_t bootstrap(const std::vector<seed_peer>& seeds) = 0;
    virtual std::vector<seed_peer> peers() const = 0;
    /// Stores (or gets and checks) the keys [first, first + count) from random nodes.
    virtual phase_result run_phase(bool store, std::size_t first, std::size_t count) = 0;
};

/// The workload's key and value for key number `index`: the same in every process.
inline std::string key_of(std::size_t index) {
    return "swarm-bench/" + std::to_string(index);
}
inline std::vector<std::byte> value_of(std::size_t index, std::size_t size, std::uint64_t seed) {
    random_generator rng(seed * 0x9E3779B97F4A7C15ull + index);
    std::vector<std::byte> out(size);
    for (auto& b : out)
        b = static_cast<std::byte>(rng() & 0xFF);
    return out;
}

/// Resident set size of this process in KiB (VmRSS), 0 if unknown.
inline std::size_t rss_kib() {
    std::ifstream status("/proc/self/status");
    std::string line;
    while (std::getline(status, line))
        if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6));
    return 0;
}

namespace detail {

struct operations {
    using clock = std::chrono::steady_clock;
    std::function<void(std::size_t, std::function<void(bool)>)> start;
    std::size_t count = 0;
    std::mutex mutex;
    std::condition_variable done;
    std::size_t next = 0;
    std::size_t finished = 0;
    phase_result result;
};

/// Launches the next operation, if any is left. Everything it touches is owned by `ops`,
/// so a thread still returning from here after the last operation finished is harmless.
inline void launch_next(const std::shared_ptr<operations>& ops) {
    std::size_t index = 0;
    {
        std::lock_guard lock(ops->mutex);
        if (ops->next == ops->count) return;
        index = ops->next++;
    }
    const auto began = operations::clock::now();
    ops->start(index, [ops, began](bool ok) {
        const double ms =
            std::chrono::duration<double, std::milli>(operations::clock::now() - began).count();
        bool all_done = false;
        {
            std::lock_guard lock(ops->mutex);
            ops->result.latencies_ms.push_back(ms);
            ++ops->result.attempted;
            if (ok) ++ops->result.succeeded;
            all_done = ++ops->finished == ops->count;
        }
        if (all_done)
            ops->done.notify_all();
        else
            launch_next(ops);
    });
}

} // namespace detail

/// Runs operations 0..count-1, at most `concurrency` at a time. `start(i, finish)` begins
/// operation i and calls `finish(ok)` exactly once, from any thread (also from inside
/// start). Latency runs from just before start() to finish().
inline phase_result
run_operations(std::size_t count, std::size_t concurrency,
               std::function<void(std::size_t, std::function<void(bool)>)> start) {
    auto ops = std::make_shared<detail::operations>();
    ops->start = std::move(start);
    ops->count = count;
    ops->result.latencies_ms.reserve(count);
    const auto began = detail::operations::clock::now();
    for (std::size_t i = 0; i < std::max<std::size_t>(concurrency, 1); ++i)
        detail::launch_next(ops);
    std::unique_lock lock(ops->mutex);
    ops->done.wait(lock, [&] { return ops->finished == count; });
    phase_result result = std::move(ops->result);
    result.seconds =
        std::chrono::duration<double>(detail::operations::clock::now() - began).count();
    return result;
}

#ifdef HIVEMESH_HAVE_OPENDHT
/// OpenDHT DhtRunner nodes on 127.0.0.1 (dht_swarm_opendht.cpp).
std::unique_ptr<host> make_opendht_host(const host_config& config);
#endif

} // namespace hivemesh::bench::swarm
