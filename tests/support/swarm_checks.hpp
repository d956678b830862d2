// Waiting in a world's time, asserting with Catch2 that what is awaited comes: the swarm
// fixture's waits for the tests.
#pragma once

#include "support/swarm.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <optional>
#include <system_error>
#include <tuple>
#include <vector>

namespace hivemesh::test {

/// Runs `start(handler)` and waits (in the world's time) for the handler's arguments.
template <class... Results, class World, class Start>
std::tuple<Results...> wait_for(World& world, Start start) {
    std::optional<std::tuple<Results...>> out;
    start([&](Results... results) { out.emplace(std::move(results)...); });
    REQUIRE(world.run_until([&] { return out.has_value(); }, std::chrono::seconds(36000)));
    return std::move(*out);
}

/// Runs every started operation to completion; `pending` counts those still running.
template <class World>
void wait_all(World& world, const std::size_t& pending) {
    REQUIRE(world.run_until([&] { return pending == 0; }, std::chrono::seconds(36000)));
}

/// Bootstraps the DHT nodes of members [first, members.size()) from random earlier members,
/// `wave` at a time, so the swarm grows as a real one does; every bootstrap succeeds.
template <class World>
void bootstrap(swarm<World>& s, std::size_t first, std::size_t wave = 50) {
    for (std::size_t begin = first; begin < s.members.size(); begin += wave) {
        const std::size_t end = std::min(s.members.size(), begin + wave);
        std::size_t pending = end - begin;
        for (std::size_t i = begin; i < end; ++i) {
            std::vector<typename swarm<World>::peer> initial{s.members[0].address()};
            if (begin > 1) initial.push_back(s.members[1 + s.rng.uniform(begin - 1)].address());
            s.members[i].dht->async_bootstrap(initial, [&](std::error_code ec) {
                CHECK_FALSE(ec);
                --pending;
            });
        }
        wait_all(s.world, pending);
    }
}

} // namespace hivemesh::test
