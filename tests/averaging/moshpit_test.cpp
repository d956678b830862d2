// Moshpit rounds on the simulated network: groups by key, the real butterfly all-reduce in
// every group at once, then the group-key rotation. N = M^d peers reach the exact global
// mean after d rounds; random groups shrink the variance every round; a peer that crashes
// before a round is averaged around and takes part again after a restart.
#include "averaging/moshpit_swarm.hpp"

#include <hivemesh/averaging/group_key.hpp>
#include <hivemesh/averaging/load_balancing.hpp>
#include <hivemesh/core/random.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

namespace hivemesh::test {
namespace {

using averaging::group_bits;

/// Every peer finished its round in time, without error, averaging everything.
void require_clean(const moshpit_swarm::round_report& report) {
    REQUIRE(report.finished);
    CHECK(report.errors == 0);
    CHECK(report.min_fraction == 1.0);
}

/// One Moshpit round: groups by key (each of `expected_group_size`), then the rotation.
void moshpit_round(moshpit_swarm& swarm, std::uint64_t round, std::size_t expected_group_size) {
    const auto groups = swarm.key_groups();
    for (const auto& members : groups)
        REQUIRE(members.size() == expected_group_size);
    const auto report = swarm.average(groups, round);
    require_clean(report);
    swarm.rotate(groups, report.ids);
}

void require_at_mean(const moshpit_swarm& swarm, const std::vector<double>& mean) {
    for (const auto& p : swarm.peers)
        for (std::size_t e = 0; e < swarm.size; ++e)
            REQUIRE(std::abs(p.values[e] - mean[e]) <= 1e-5 * (1.0 + std::abs(mean[e])));
}

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
        moshpit_round(swarm, round, m);
        if (round + 1 < d) CHECK(swarm.variance() > 1e-6); // not there yet
    }
    require_at_mean(swarm, mean);
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
        require_clean(swarm.average(random_partition(swarm.peers.size(), 4, rng), round));
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

TEST_CASE("moshpit: a peer that crashes before a round keeps its values, its group averages "
          "without it, and after a restart it takes part again",
          "[moshpit][faults]") {
    const std::size_t n = 16, m = 4, size = 1001;
    moshpit_swarm swarm(n, size, 7);
    for (std::size_t i = 0; i < n; ++i)
        swarm.peers[i].bits = group_bits(i % (n / m), 2);
    const auto mean = swarm.global_mean();
    const auto groups = swarm.key_groups();
    const std::size_t victim_index = 1;
    const auto& group = groups.front();
    const std::size_t victim = group[victim_index];
    std::vector<std::vector<float>> before;
    for (const auto& p : swarm.peers)
        before.push_back(p.values);

    swarm.crash(victim);
    const auto report = swarm.average(groups, 0);
    REQUIRE(report.finished);
    CHECK(report.started == n - 1);
    CHECK(report.errors == 0);
    CHECK(swarm.peers[victim].values == before[victim]);
    // The victim's span stayed local for the survivors; the rest is the mean of the three.
    const auto spans = averaging::load_balance(size, std::vector<double>(m, 1.0));
    std::size_t span_begin = 0;
    for (std::size_t k = 0; k < victim_index; ++k)
        span_begin += spans[k];
    const std::size_t span_end = span_begin + spans[victim_index];
    CHECK(report.min_fraction ==
          static_cast<double>(size - spans[victim_index]) / static_cast<double>(size));
    for (const auto i : group) {
        if (i == victim) continue;
        INFO("peer " << i);
        for (std::size_t e = 0; e < size; ++e) {
            if (e >= span_begin && e < span_end) {
                REQUIRE(swarm.peers[i].values[e] == before[i][e]);
                continue;
            }
            double survivors = 0;
            for (const auto j : group)
                if (j != victim) survivors += before[j][e];
            survivors /= static_cast<double>(m - 1);
            REQUIRE(std::abs(swarm.peers[i].values[e] - survivors) <= 1e-5);
        }
    }
    swarm.rotate(groups, report.ids);

    // Back with the same identity and endpoint: the next round runs without a gap.
    swarm.restart(victim);
    const auto next = swarm.key_groups();
    require_clean(swarm.average(next, 1));
    // Averaging subsets never moves the global mean, crash or not.
    const auto now = swarm.global_mean();
    for (std::size_t e = 0; e < size; ++e)
        REQUIRE(std::abs(now[e] - mean[e]) <= 1e-5);
}

} // namespace hivemesh::test
