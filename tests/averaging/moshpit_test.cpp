// Moshpit rounds on the simulated network: groups by key, the real butterfly all-reduce in
// every group at once, then the group-key rotation. N = M^d peers reach the exact global
// mean after d rounds; random groups shrink the variance every round.
#include "net/test_support.hpp"
#include "net/worlds.hpp"

#include <hivemesh/averaging/allreduce.hpp>
#include <hivemesh/averaging/group_key.hpp>
#include <hivemesh/averaging/load_balancing.hpp>
#include <hivemesh/core/random.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <deque>
#include <map>
#include <memory>
#include <vector>

namespace hivemesh::test {
namespace {

using averaging::group_bits;

struct moshpit_swarm {
    using rpc_type = net::node<net::sim::transport>;
    using service_type = averaging::allreduce_service<net::sim::transport>;

    struct peer {
        net::sim::transport* transport = nullptr;
        std::unique_ptr<rpc_type> rpc;
        std::unique_ptr<service_type> service;
        net::sim::endpoint endpoint{};
        std::vector<float> values;
        group_bits bits;
    };

    sim_world world;
    std::deque<peer> peers;
    std::size_t size;

    moshpit_swarm(std::size_t count, std::size_t elements, std::uint64_t seed)
        : size(elements) {
        random_generator rng(seed);
        averaging::allreduce_options options;
        options.part_size_bytes = 4000;
        for (std::size_t i = 0; i < count; ++i) {
            auto& p = peers.emplace_back();
            p.transport = &world.add_host();
            std::array<std::byte, 32> key{};
            for (auto& b : key)
                b = static_cast<std::byte>(rng() & 0xFF);
            p.rpc = std::make_unique<rpc_type>(*p.transport, crypto::identity::from_seed(key));
            p.endpoint = world.listen(*p.rpc, *p.transport);
            p.service = std::make_unique<service_type>(*p.rpc, options);
            p.values.resize(elements);
            for (auto& v : p.values)
                v = static_cast<float>(rng.normal());
        }
    }

    std::vector<double> global_mean() const {
        std::vector<double> mean(size, 0.0);
        for (const auto& p : peers)
            for (std::size_t e = 0; e < size; ++e)
                mean[e] += p.values[e];
        for (auto& m : mean)
            m /= static_cast<double>(peers.size());
        return mean;
    }

    /// Mean over elements of the variance across peers.
    double variance() const {
        const auto mean = global_mean();
        double total = 0;
        for (const auto& p : peers)
            for (std::size_t e = 0; e < size; ++e)
                total += (p.values[e] - mean[e]) * (p.values[e] - mean[e]);
        return total / static_cast<double>(peers.size() * size);
    }

    /// Averages within each group (lists of peer indices, in group order) at once, weight 1,
    /// spans by load balancing with equal bandwidths; returns the groups' ids.
    std::vector<averaging::group_id> average(const std::vector<std::vector<std::size_t>>& groups,
                                             std::uint64_t round) {
        std::vector<averaging::group_id> ids;
        std::size_t pending = 0;
        for (const auto& members : groups) {
            averaging::group_info<net::sim::endpoint> group;
            random_generator id_source(round * 1'000'003 + members.front());
            for (auto& b : group.id)
                b = static_cast<std::byte>(id_source() & 0xFF);
            for (const auto i : members)
                group.members.push_back({{peers[i].rpc->id(), peers[i].endpoint}, {}, 0, {}});
            const std::vector<double> bandwidths(members.size(), 1.0);
            const auto spans = averaging::load_balance(size, bandwidths);
            for (std::size_t index = 0; index < members.size(); ++index) {
                auto& p = peers[members[index]];
                ++pending;
                p.service->async_allreduce(
                    group, index, spans, std::span<float>(p.values), 1.0, 60s,
                    [&pending](std::error_code ec, averaging::allreduce_result r) {
                        CHECK_FALSE(ec);
                        CHECK(r.fraction_averaged() == 1.0);
                        --pending;
                    });
            }
            ids.push_back(group.id);
        }
        REQUIRE(world.run_until([&] { return pending == 0; }, 3600s));
        return ids;
    }

    /// One Moshpit round: groups are the peers sharing a key, ordered by index; afterwards
    /// every member rotates its key with its group's id.
    void moshpit_round(std::uint64_t round, std::size_t expected_group_size) {
        std::map<group_bits, std::vector<std::size_t>> by_key;
        for (std::size_t i = 0; i < peers.size(); ++i)
            by_key[peers[i].bits].push_back(i);
        std::vector<std::vector<std::size_t>> groups;
        for (auto& [bits, members] : by_key) {
            REQUIRE(members.size() == expected_group_size);
            groups.push_back(members);
        }
        const auto ids = average(groups, round);
        for (std::size_t g = 0; g < groups.size(); ++g)
            for (std::size_t index = 0; index < groups[g].size(); ++index) {
                auto& p = peers[groups[g][index]];
                p.bits = averaging::rotate(p.bits, ids[g], index, groups[g].size());
            }
    }

    void require_at_mean(const std::vector<double>& mean) const {
        for (const auto& p : peers)
            for (std::size_t e = 0; e < size; ++e)
                REQUIRE(std::abs(p.values[e] - mean[e]) <= 1e-5 * (1.0 + std::abs(mean[e])));
    }
};

void run_grid(std::size_t m, std::size_t d) {
    std::size_t n = 1;
    for (std::size_t i = 0; i < d; ++i)
        n *= m;
    const std::size_t key_bits = (d - 1) * static_cast<std::size_t>(std::log2(m));
    moshpit_swarm swarm(n, 1001, n);
    for (std::size_t i = 0; i < n; ++i) // m peers under each key
        swarm.peers[i].bits = group_bits(i % (n / m), key_bits);
    const auto mean = swarm.global_mean();
    for (std::size_t round = 0; round < d; ++round) {
        INFO("round " << round);
        swarm.moshpit_round(round, m);
        if (round + 1 < d) CHECK(swarm.variance() > 1e-6); // not there yet
    }
    swarm.require_at_mean(mean);
}

} // namespace

TEST_CASE("moshpit: 16 peers as 4x4 hold the exact global mean after 2 rounds", "[moshpit]") {
    run_grid(4, 2);
}

TEST_CASE("moshpit: 64 peers as 4x4x4 hold the exact global mean after 3 rounds", "[moshpit]") {
    run_grid(4, 3);
}

TEST_CASE("moshpit: random groups of 4 shrink the variance every round", "[moshpit]") {
    moshpit_swarm swarm(32, 501, 5);
    random_generator rng(11);
    const auto mean = swarm.global_mean();
    double before = swarm.variance();
    for (std::uint64_t round = 0; round < 4; ++round) {
        std::vector<std::size_t> order(swarm.peers.size());
        for (std::size_t i = 0; i < order.size(); ++i)
            order[i] = i;
        rng.shuffle(std::span<std::size_t>(order));
        std::vector<std::vector<std::size_t>> groups;
        for (std::size_t i = 0; i < order.size(); i += 4)
            groups.emplace_back(order.begin() + static_cast<std::ptrdiff_t>(i),
                                order.begin() + static_cast<std::ptrdiff_t>(i + 4));
        swarm.average(groups, round);
        const double after = swarm.variance();
        INFO("round " << round << ": " << before << " -> " << after);
        CHECK(after < before);
        before = after;
    }
    // Averaging never moves the global mean.
    const auto now = swarm.global_mean();
    for (std::size_t e = 0; e < now.size(); ++e)
        REQUIRE(std::abs(now[e] - mean[e]) <= 1e-5);
}

} // namespace hivemesh::test
