// A swarm of DHT nodes in one process, on the simulated network or loopback TCP.
#pragma once

#include "net/test_support.hpp"
#include "net/worlds.hpp"

#include <hivemesh/core/random.hpp>
#include <hivemesh/dht/node.hpp>

#include <catch2/catch.hpp>

#include <array>
#include <memory>
#include <optional>
#include <tuple>
#include <vector>

namespace hivemesh::test {

/// An identity made from a 64-bit seed: the same peer in every run.
inline crypto::identity identity_from(std::uint64_t seed) {
    random_generator rng(seed);
    std::array<std::byte, 32> bytes{};
    for (auto& b : bytes)
        b = static_cast<std::byte>(rng() & 0xFF);
    return crypto::identity::from_seed(bytes);
}

template <class World>
struct swarm {
    using transport_type = typename World::transport_type;
    using rpc_type = net::node<transport_type>;
    using dht_type = dht::node<transport_type>;
    using endpoint_type = typename transport_type::endpoint_type;
    using peer = typename rpc_type::peer;

    struct member {
        transport_type* transport = nullptr;
        std::unique_ptr<rpc_type> rpc;
        std::unique_ptr<dht_type> dht;
        endpoint_type endpoint{};
        bool client = false;

        peer address() const { return peer{rpc->id(), endpoint}; }
    };

    World world;
    dht::node_options options;
    net::node_options rpc_options;
    std::deque<member> members;
    random_generator rng{7};

    swarm() { rpc_options.security.plaintext = false; }

    /// Starts a node with the identity of `seed` (a client serves nothing).
    member& add(std::uint64_t seed, bool client = false) {
        auto& m = members.emplace_back();
        m.transport = &world.add_host();
        m.rpc = std::make_unique<rpc_type>(*m.transport, identity_from(seed), rpc_options);
        m.client = client;
        std::optional<endpoint_type> announce;
        if (!client) {
            m.endpoint = world.listen(*m.rpc, *m.transport);
            announce = m.endpoint;
        }
        m.dht = std::make_unique<dht_type>(*m.rpc, announce, options);
        return m;
    }

    /// Runs `start(handler)` and waits (in the world's time) for the handler's arguments.
    template <class... Results, class Start>
    std::tuple<Results...> wait(Start start) {
        std::optional<std::tuple<Results...>> out;
        start([&](Results... results) { out.emplace(std::move(results)...); });
        REQUIRE(world.run_until([&] { return out.has_value(); }, 36000s));
        return std::move(*out);
    }

    /// Runs every started operation to completion; `pending` counts those still running.
    void wait_all(const std::size_t& pending) {
        REQUIRE(world.run_until([&] { return pending == 0; }, 36000s));
    }

    /// Bootstraps members [first, members.size()) from random earlier members, `wave`
    /// at a time, so the swarm grows as a real one does.
    void bootstrap(std::size_t first, std::size_t wave = 50) {
        for (std::size_t begin = first; begin < members.size(); begin += wave) {
            const std::size_t end = std::min(members.size(), begin + wave);
            std::size_t pending = end - begin;
            for (std::size_t i = begin; i < end; ++i) {
                std::vector<peer> initial{members[0].address()};
                if (begin > 1) initial.push_back(members[1 + rng.uniform(begin - 1)].address());
                members[i].dht->async_bootstrap(initial, [&](std::error_code ec) {
                    CHECK_FALSE(ec);
                    --pending;
                });
            }
            wait_all(pending);
        }
    }

    /// The time the nodes see (virtual on the simulated network).
    time_point now() const {
        const auto& t = *members.front().transport;
        if constexpr (requires { t.clock(); })
            return t.clock().now();
        else
            return typename transport_type::clock_type().now();
    }

    std::size_t random_member(bool serving_only = false) {
        while (true) {
            const auto i = static_cast<std::size_t>(rng.uniform(members.size()));
            if (!serving_only || !members[i].client) return i;
        }
    }
};

} // namespace hivemesh::test
