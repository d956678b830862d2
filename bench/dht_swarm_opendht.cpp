// The OpenDHT half of the DHT swarm benchmark: DhtRunner nodes on 127.0.0.1, each with its
// own threads and UDP socket, driven through the same workload as hivemesh's nodes.
// Built only when libopendht-dev is installed (HIVEMESH_HAVE_OPENDHT).
#include "dht_swarm.hpp"

#include <opendht.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <atomic>
#include <map>
#include <thread>

namespace hivemesh::bench::swarm {
namespace {

dht::SockAddr loopback(std::uint16_t port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return dht::SockAddr(reinterpret_cast<const sockaddr*>(&a), sizeof a);
}

class opendht_host final : public host {
public:
    explicit opendht_host(const host_config& config)
        : config_(config)
        , rng_(config.seed * 1000003 + config.process_index) {
        for (std::size_t i = 0; i < config.nodes; ++i) {
            dht::DhtRunner::Config c;
            c.threaded = true;
            c.bind4 = loopback(0);                     // IPv4 only: one socket per node
            c.dht_config.node_config.network = 0x4842; // never the public network
            // Every node is 127.0.0.1: OpenDHT's per-address rate limit would throttle the
            // whole swarm as one peer.
            c.dht_config.node_config.max_req_per_sec = -1;
            c.dht_config.node_config.max_peer_req_per_sec = -1;
            auto& runner = runners_.emplace_back(std::make_unique<dht::DhtRunner>());
            runner->run(c, dht::DhtRunner::Context{});
        }
    }

    ~opendht_host() override {
        for (auto& r : runners_)
            r->shutdown({}, true);
        for (auto& r : runners_)
            r->join();
    }

    std::size_t bootstrap(const std::vector<seed_peer>& seeds) override {
        for (std::size_t i = 0; i < runners_.size(); ++i) {
            if (!seeds.empty())
                runners_[i]->bootstrap(loopback(seeds[rng_.uniform(seeds.size())].port));
            if (i > 0) runners_[i]->bootstrap(loopback(port(0)));
            if (i > 1) runners_[i]->bootstrap(loopback(port(1 + rng_.uniform(i - 1))));
        }
        // OpenDHT joins in the background: wait until every node knows enough nodes (good
        // or not yet confirmed; requiring "good" took minutes for a few nodes).
        const std::size_t others = runners_.size() + seeds.size() - 1;
        const unsigned wanted = static_cast<unsigned>(std::min<std::size_t>(others, 8));
        const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
        std::size_t short_of = runners_.size();
        while (std::chrono::steady_clock::now() < give_up) {
            short_of = 0;
            for (auto& r : runners_)
                if (r->getNodesStats(AF_INET).getKnownNodes() < wanted) ++short_of;
            if (short_of == 0) break;
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
        return short_of;
    }

    std::vector<seed_peer> peers() const override {
        std::vector<seed_peer> out;
        for (std::size_t i = 0; i < runners_.size(); ++i)
            out.push_back({port(i), "-"});
        return out;
    }

    phase_result run_phase(bool store, std::size_t first, std::size_t count) override {
        std::vector<std::size_t> from(count);
        for (std::size_t i = 0; i < count; ++i) {
            const std::size_t key = first + i;
            std::size_t n = rng_.uniform(runners_.size());
            if (!store && runners_.size() > 1)
                if (const auto it = stored_by_.find(key); it != stored_by_.end())
                    n = (it->second + 1 + rng_.uniform(runners_.size() - 1)) % runners_.size();
            if (store) stored_by_[key] = n;
            from[i] = n;
        }
        return run_operations(
            count, config_.concurrency, [&](std::size_t i, std::function<void(bool)> finish) {
                const auto hash = dht::InfoHash::get(key_of(first + i));
                const auto bytes = value_of(first + i, config_.value_size, config_.seed);
                dht::Blob value(bytes.size());
                std::memcpy(value.data(), bytes.data(), bytes.size());
                auto& runner = *runners_[from[i]];
                if (store) {
                    runner.put(hash, std::make_shared<dht::Value>(std::move(value)),
                               [finish](bool ok) { finish(ok); });
                    return;
                }
                // Done at the first matching value (the search is then stopped), or when
                // the search ends without one.
                auto finished = std::make_shared<std::atomic<bool>>(false);
                runner.get(
                    hash,
                    [finish, finished, value = std::move(value)](
                        const std::vector<std::shared_ptr<dht::Value>>& values) {
                        for (const auto& v : values)
                            if (v->data == value) {
                                if (!finished->exchange(true)) finish(true);
                                return false;
                            }
                        return true;
                    },
                    [finish, finished](bool) {
                        if (!finished->exchange(true)) finish(false);
                    });
            });
    }

private:
    std::uint16_t port(std::size_t i) const { return runners_[i]->getBoundPort(AF_INET); }

    host_config config_;
    random_generator rng_;
    std::vector<std::unique_ptr<dht::DhtRunner>> runners_;
    std::map<std::size_t, std::size_t> stored_by_;
};

} // namespace

std::unique_ptr<host> make_opendht_host(const host_config& config) {
    return std::make_unique<opendht_host>(config);
}

} // namespace hivemesh::bench::swarm
