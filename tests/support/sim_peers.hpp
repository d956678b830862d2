// Peers (hivemesh::basic_peer) on one simulated network, each bootstrapped from the first, in
// virtual time: the fixture of the tests of the layers built on the peer (progress, optim) and
// of bench/collaborative_sim_bench.cpp, so it throws instead of asserting (no Catch2 here).
#pragma once

#include "support/identities.hpp"

#include <hivemesh/net/sim.hpp>
#include <hivemesh/peer.hpp>

#include <asio/io_context.hpp>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

namespace hivemesh::test {

using sim_peer = basic_peer<net::sim::transport>;

struct sim_peers {
    explicit sim_peers(std::uint64_t seed)
        : network(io, seed) {
        using namespace std::chrono_literals;
        dht_options.maintenance_period = 0s; // nothing in the background the tests do not ask for
    }

    /// A new peer, bootstrapped from the first. Throws std::runtime_error unless bootstrapping
    /// succeeds, with nothing to report, within a virtual minute.
    sim_peer& add_peer(bool client_mode = false) {
        using namespace std::chrono_literals;
        auto& p = new_peer(client_mode);
        bool done = false;
        std::error_code error;
        std::string problem;
        p.async_bootstrap([&](std::error_code ec, std::string why) {
            error = ec;
            problem = std::move(why);
            done = true;
        });
        network.time().run_until([&] { return done; }, 60s);
        const std::string who = "sim_peers: peer " + std::to_string(peers.size() - 1);
        if (!done) throw std::runtime_error(who + " did not bootstrap within a virtual minute");
        if (error || !problem.empty())
            throw std::runtime_error(who + " bootstrapped with " +
                                     (error ? error.message() : std::string("no error")) + ": " +
                                     problem);
        return p;
    }

    /// A new peer on a new node, not bootstrapped yet (its initial peer is the first).
    sim_peer& new_peer(bool client_mode = false) {
        const auto node = network.add_node();
        if (on_node_added) on_node_added(node);
        peer_options o;
        o.listen = {"/sim/" + std::to_string(node) + "/port/0"};
        o.client_mode = client_mode;
        if (!peers.empty()) o.initial_peers = {peers.front().addresses().front()};
        o.dht = dht_options;
        auto& p =
            peers.emplace_back(net::sim::transport(network, node), o, identity_for(peers.size()));
        nodes.push_back(node);
        return p;
    }

    time_point now() const { return network.time().now(); }
    template <class Predicate>
    bool run_until(Predicate done, duration max) {
        return network.time().run_until(done, max);
    }
    void run_for(duration d) { network.time().run_for(d); }

    /// Peer i's identity: identity_of(i + 1) for the first 255, then pseudo-random ones.
    static crypto::identity identity_for(std::size_t i) {
        return i < 255 ? identity_of(static_cast<std::uint8_t>(i + 1)) : random_identity(i);
    }

    /// The DHT settings of the peers added from now on.
    dht::node_options dht_options;
    /// Called with each new peer's node before it bootstraps (e.g. to set its links).
    std::function<void(net::sim::node_id)> on_node_added;
    asio::io_context io;
    net::sim::network network;
    std::deque<sim_peer> peers;
    std::vector<net::sim::node_id> nodes;
};

} // namespace hivemesh::test
