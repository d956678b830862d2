// The swarm fixture: hosts on one world (the simulated network or loopback TCP), each with an
// RPC node and, when the test wants one, a DHT node. What a test needs beyond that (an
// all-reduce service, a matchmaker, values to average) it keeps beside `members`, index for
// index. Shared by the DHT and averaging tests and by bench/moshpit_sim_bench.cpp, so it
// asserts nothing (no Catch2 here): support/swarm_checks.hpp bootstraps it and waits,
// asserting.
#pragma once

#include "support/identities.hpp"
#include "support/worlds.hpp"

#include <hivemesh/core/random.hpp>
#include <hivemesh/crypto/identity.hpp>
#include <hivemesh/dht/node.hpp>
#include <hivemesh/net/node.hpp>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <utility>

namespace hivemesh::test {

template <class World>
struct swarm {
    using world_type = World;
    using transport_type = typename World::transport_type;
    using rpc_node_type = net::node<transport_type>;
    using dht_node_type = dht::node<transport_type>;
    using endpoint_type = typename transport_type::endpoint_type;
    using peer = typename rpc_node_type::peer;

    struct member {
        transport_type* transport = nullptr;
        std::unique_ptr<rpc_node_type> rpc;
        std::unique_ptr<dht_node_type> dht; ///< none unless added by add()
        endpoint_type endpoint{};           ///< where it serves (none for a client)
        bool client = false;                ///< serves nothing

        peer address() const { return peer{rpc->id(), endpoint}; }
    };

    World world;
    dht::node_options options;     ///< for the DHT nodes added from now on
    net::node_options rpc_options; ///< for the RPC nodes added from now on
    std::deque<member> members;
    random_generator rng{7}; ///< picks bootstrap peers and random members

    swarm() { rpc_options.security.plaintext = false; }

    /// A new host with an RPC node of identity `who`, serving nothing yet (see listen()).
    member& add_rpc(crypto::identity who) {
        auto& m = members.emplace_back();
        m.transport = &world.add_host();
        m.rpc = std::make_unique<rpc_node_type>(*m.transport, std::move(who), rpc_options);
        return m;
    }

    /// Member `m` serves at a fresh endpoint of the world.
    void listen(member& m) { m.endpoint = world.listen(*m.rpc, *m.transport); }

    /// A new host with an RPC node and a DHT node, with the identity of `seed` (the same peer
    /// in every run); a client serves nothing. Not bootstrapped yet (see
    /// support/swarm_checks.hpp).
    member& add(std::uint64_t seed, bool client = false) {
        auto& m = add_rpc(random_identity(seed));
        m.client = client;
        std::optional<endpoint_type> announce;
        if (!client) {
            listen(m);
            announce = m.endpoint;
        }
        m.dht = std::make_unique<dht_node_type>(*m.rpc, announce, options);
        return m;
    }

    /// A random member, or a random serving one.
    std::size_t random_member(bool serving_only = false) {
        while (true) {
            const auto i = static_cast<std::size_t>(rng.uniform(members.size()));
            if (!serving_only || !members[i].client) return i;
        }
    }
};

} // namespace hivemesh::test
