// A Moshpit swarm on the simulated network: the swarm fixture's hosts (RPC nodes, no DHT),
// each peer with the real butterfly all-reduce service, averaging within given groups all at
// once; peers can crash before a round and come back after it. Shared by
// tests/averaging/moshpit_test.cpp and bench/moshpit_sim_bench.cpp, so it reports instead of
// asserting (no Catch2 here).
#pragma once

#include "support/identities.hpp"
#include "support/swarm.hpp"

#include <hivemesh/averaging/allreduce.hpp>
#include <hivemesh/averaging/group_key.hpp>
#include <hivemesh/averaging/load_balancing.hpp>
#include <hivemesh/core/random.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <span>
#include <system_error>
#include <vector>

namespace hivemesh::test {

/// Lists of peer indices, one per group, each in member order.
using peer_groups = std::vector<std::vector<std::size_t>>;

/// Peers 0..count-1 shuffled by `rng` and cut into groups of `group_size` (the last group
/// takes the remainder).
inline peer_groups random_partition(std::size_t count, std::size_t group_size,
                                    random_generator& rng) {
    std::vector<std::size_t> order(count);
    for (std::size_t i = 0; i < count; ++i)
        order[i] = i;
    rng.shuffle(std::span<std::size_t>(order));
    peer_groups groups;
    for (std::size_t i = 0; i < count; i += group_size) {
        const std::size_t end = std::min(count, i + group_size);
        groups.emplace_back(order.begin() + static_cast<std::ptrdiff_t>(i),
                            order.begin() + static_cast<std::ptrdiff_t>(end));
    }
    return groups;
}

/// Peer i is host members[i] of the swarm with peers[i] on top.
struct moshpit_swarm : swarm<sim_world> {
    using service_type = averaging::allreduce_service<net::sim::transport>;

    /// What a peer adds to its host.
    struct peer_state {
        std::unique_ptr<service_type> service;
        std::vector<float> values;
        averaging::group_bits bits;
        bool down = false; ///< crashed and not restarted yet
    };

    /// What one call to average() saw.
    struct round_report {
        std::vector<averaging::group_id> ids; ///< per group, in the order given
        bool finished = false;                ///< every started all-reduce completed in time
        std::size_t started = 0;              ///< all-reduces started (peers up)
        std::size_t errors = 0;               ///< of those, completed with an error
        double min_fraction = 1.0;            ///< least fraction_averaged() among them
        duration elapsed{};                   ///< virtual time until the last completion
    };

    /// Small parts, so a span of a few thousand elements takes several.
    static averaging::allreduce_options default_options() {
        averaging::allreduce_options options;
        options.part_size_bytes = 4000;
        return options;
    }

    std::deque<peer_state> peers;
    std::size_t size;

    /// `count` peers with `elements` values each, normal(0, 1) from `seed` (identities too).
    moshpit_swarm(std::size_t count, std::size_t elements, std::uint64_t seed,
                  const averaging::allreduce_options& options = default_options(),
                  const net::node_options& node_options = {})
        : size(elements) {
        rpc_options = node_options;
        random_generator draws(seed);
        for (std::size_t i = 0; i < count; ++i) {
            auto& m = add_rpc(random_identity(draws));
            m.endpoint = serve(i, 0);
            auto& p = peers.emplace_back();
            p.service = std::make_unique<service_type>(*m.rpc, options);
            p.values.resize(elements);
            for (auto& v : p.values)
                v = static_cast<float>(draws.normal());
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

    /// Mean over elements of the population variance across all peers (crashed ones too).
    double variance() const {
        const auto mean = global_mean();
        double total = 0;
        for (const auto& p : peers)
            for (std::size_t e = 0; e < size; ++e) {
                const double d = p.values[e] - mean[e];
                total += d * d;
            }
        return total / static_cast<double>(peers.size() * size);
    }

    /// Crashes peer i's simulated node: its listener and connections close, dials to it
    /// time out. Its values stay as they are.
    void crash(std::size_t i) {
        world.network.crash(members[i].transport->node());
        peers[i].down = true;
    }

    /// Brings a crashed peer back with the same identity, listening at the same endpoint.
    void restart(std::size_t i) {
        world.network.restart(members[i].transport->node());
        serve(i, members[i].endpoint.port);
        peers[i].down = false;
    }

    /// Queued connections per listener: SOMAXCONN, as the TCP transport's listen() asks.
    /// The simulated default (128) would refuse most dials when a group of more than ~128
    /// peers starts at the same virtual instant, which the all-reduce does not retry.
    static constexpr std::size_t listen_backlog = 4096;

    /// Peer i serves at `port` of its node (0: a free one).
    net::sim::endpoint serve(std::size_t i, std::uint16_t port) {
        auto& m = members[i];
        auto listener = world.network.listen(m.transport->node(), port, listen_backlog);
        const auto endpoint = listener.local_endpoint();
        m.rpc->serve(std::move(listener));
        return endpoint;
    }

    /// Averages within each group at once, weight 1, spans by load balancing with equal
    /// bandwidths. Crashed members stay in the groups (they crashed after the groups formed)
    /// but start nothing; the others run the real failure semantics around them.
    round_report average(const peer_groups& groups, std::uint64_t round,
                         duration timeout = std::chrono::seconds(60)) {
        // Shared with the completions, which may outlive this call if a round hangs.
        struct tally {
            round_report report;
            std::size_t pending = 0;
        };
        const auto t = std::make_shared<tally>();
        const auto started_at = world.now();
        for (const auto& in_group : groups) {
            averaging::group_info<net::sim::endpoint> group;
            random_generator id_source(round * 1'000'003 + in_group.front());
            for (auto& b : group.id)
                b = static_cast<std::byte>(id_source() & 0xFF);
            for (const auto i : in_group)
                group.members.push_back({.peer = members[i].address(),
                                         .role = averaging::member_role::node,
                                         .bandwidth = 0,
                                         .metadata = {}});
            const std::vector<double> bandwidths(in_group.size(), 1.0);
            const auto spans = averaging::load_balance(size, bandwidths);
            for (std::size_t index = 0; index < in_group.size(); ++index) {
                auto& p = peers[in_group[index]];
                if (p.down) continue;
                ++t->pending;
                ++t->report.started;
                p.service->async_allreduce(
                    group, index, spans, std::span<float>(p.values), 1.0, timeout,
                    [this, t, started_at](std::error_code ec, averaging::allreduce_result r) {
                        if (ec) ++t->report.errors;
                        t->report.min_fraction =
                            std::min(t->report.min_fraction, r.fraction_averaged());
                        t->report.elapsed = std::max(t->report.elapsed, world.now() - started_at);
                        --t->pending;
                    });
            }
            t->report.ids.push_back(group.id);
        }
        // Generous: every round ends by `timeout`, so this only bounds a broken one.
        t->report.finished = world.run_until([&t] { return t->pending == 0; }, 60 * timeout);
        return t->report;
    }

    /// Moshpit groups: the peers sharing a key, ordered by index (ordered by key).
    peer_groups key_groups() const {
        std::map<averaging::group_bits, std::vector<std::size_t>> by_key;
        for (std::size_t i = 0; i < peers.size(); ++i)
            by_key[peers[i].bits].push_back(i);
        peer_groups groups;
        for (auto& [bits, in_group] : by_key)
            groups.push_back(std::move(in_group));
        return groups;
    }

    /// After a round: every member rotates its key with its group's id and its index. A
    /// peer that crashed during the round rotates too: it had the group before it crashed.
    void rotate(const peer_groups& groups, const std::vector<averaging::group_id>& ids) {
        for (std::size_t g = 0; g < groups.size(); ++g)
            for (std::size_t index = 0; index < groups[g].size(); ++index) {
                auto& p = peers[groups[g][index]];
                p.bits = averaging::rotate(p.bits, ids[g], index, groups[g].size());
            }
    }
};

} // namespace hivemesh::test
