// The butterfly all-reduce on both transports: exact weighted means for every mix of
// roles, the traffic formula, compression, malformed messages, the fault semantics
// (a peer that fails or is slow before, while sending or while reducing, or cancels), and
// hostile values (non-finite or out-of-bound parts and averages).
#include "support/bytes.hpp"
#include "support/faults.hpp"
#include "support/identities.hpp"
#include "support/swarm.hpp"

#include <hivemesh/averaging/allreduce.hpp>
#include <hivemesh/core/random.hpp>
#include <hivemesh/tensor/raw.hpp>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/post.hpp>
#include <asio/thread_pool.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <deque>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

namespace hivemesh::test {
namespace {

using averaging::allreduce_result;
using averaging::exclusion;
using averaging::member_role;
using averaging::value_fault;

/// A group of peers on one world: the swarm fixture's hosts (RPC nodes, no DHT), each with an
/// all-reduce service on top. Peer i is host members[i].
template <class World>
struct allreduce_group : swarm<World> {
    using endpoint_type = typename swarm<World>::endpoint_type;
    using service_type = averaging::allreduce_service<typename World::transport_type>;

    /// What a peer adds to its host.
    struct peer_state {
        std::unique_ptr<service_type> service;
        member_role role = member_role::node;
        std::vector<float> initial;
        std::vector<float> values;
        double weight = 1;
        std::optional<std::pair<std::error_code, allreduce_result>> outcome;
        time_point finished_at{};
        bool started = false;
    };

    std::deque<peer_state> peers;
    averaging::group_info<endpoint_type> group;
    std::vector<std::size_t> spans;
    time_point started_at{};

    /// Peers with these roles, `size` random values each in [1, 2), weights in [1, 5).
    /// With `post_compute`, compression and reduction are posted to the world's own
    /// executor (as to a thread pool, other handlers run in between) instead of `compute`.
    /// `node_options[i]`, if given, are peer i's RPC node options, `peer_options[i]` its
    /// all-reduce options (else `options`).
    allreduce_group(const std::vector<member_role>& roles, std::size_t size,
                    averaging::allreduce_options options = small_parts(), std::uint64_t seed = 1,
                    std::optional<asio::any_io_executor> compute = std::nullopt,
                    bool post_compute = false,
                    const std::vector<net::node_options>& node_options = {},
                    const std::vector<averaging::allreduce_options>& peer_options = {}) {
        if (post_compute) compute = this->world.io.get_executor();
        random_generator rng(seed);
        for (std::size_t i = 0; i < 32; ++i)
            group.id[i] = static_cast<std::byte>(rng() & 0xFF);
        const net::node_options swarm_default = this->rpc_options;
        for (std::size_t i = 0; i < roles.size(); ++i) {
            this->rpc_options = i < node_options.size() ? node_options[i] : swarm_default;
            auto& m = this->add_rpc(identity_of(static_cast<std::uint8_t>(i + 1)));
            if (roles[i] != member_role::client) this->listen(m);
            auto& p = peers.emplace_back();
            p.service = std::make_unique<service_type>(
                *m.rpc, i < peer_options.size() ? peer_options[i] : options, compute);
            p.role = roles[i];
            if (roles[i] != member_role::aux) {
                p.initial.resize(size);
                for (auto& v : p.initial)
                    v = 1.0f + static_cast<float>(rng.uniform_real());
                p.weight = 1.0 + 4.0 * rng.uniform_real();
            }
            p.values = p.initial;
            group.members.push_back(
                {.peer = m.address(), .role = roles[i], .bandwidth = 0, .metadata = {}});
        }
        spans = equal_spans(roles, size);
    }

    static averaging::allreduce_options small_parts() {
        averaging::allreduce_options o;
        o.part_size_bytes = 1000; // 250 floats: several parts per span
        o.sender_timeout = 2s;
        o.reducer_timeout = 4s;
        return o;
    }

    /// V split as evenly as possible over the members that reduce (all but clients).
    static std::vector<std::size_t> equal_spans(const std::vector<member_role>& roles,
                                                std::size_t size) {
        std::size_t reducers = 0;
        for (auto r : roles)
            reducers += r != member_role::client ? 1 : 0;
        std::vector<std::size_t> out(roles.size(), 0);
        std::size_t given = 0, seen = 0;
        for (std::size_t k = 0; k < roles.size(); ++k) {
            if (roles[k] == member_role::client) continue;
            ++seen;
            out[k] = size * seen / reducers - given;
            given += out[k];
        }
        return out;
    }

    /// Starts peer i's round; `slot` optionally cancels it.
    void start(std::size_t i, duration timeout, asio::cancellation_slot slot = {}) {
        auto& p = peers[i];
        p.started = true;
        p.service->async_allreduce(
            group, i, spans, std::span<float>(p.values), p.weight, timeout,
            asio::bind_cancellation_slot(slot, [this, &p](std::error_code ec, allreduce_result r) {
                p.outcome.emplace(ec, std::move(r));
                p.finished_at = this->world.now();
            }));
    }

    /// Starts every peer not in `skip` and runs until all of them finished.
    void run(duration timeout, const std::vector<std::size_t>& skip = {}) {
        started_at = this->world.now();
        for (std::size_t i = 0; i < peers.size(); ++i)
            if (std::find(skip.begin(), skip.end(), i) == skip.end()) start(i, timeout);
        wait();
    }

    void wait() {
        REQUIRE(this->world.run_until(
            [&] {
                for (auto& p : peers)
                    if (p.started && !p.outcome) return false;
                return true;
            },
            3600s));
    }

    /// The weighted mean of element e over the members `who`, from their initial values.
    double mean_of(std::size_t e, const std::vector<bool>& who) const {
        double sum = 0, weights = 0;
        for (std::size_t j = 0; j < who.size(); ++j)
            if (who[j]) {
                sum += peers[j].weight * static_cast<double>(peers[j].initial[e]);
                weights += peers[j].weight;
            }
        return sum / weights;
    }

    /// Every element of peer i is the mean its part names, or its own initial value.
    void check_consistent(std::size_t i, double tolerance = 1e-6) const {
        const auto& p = peers[i];
        REQUIRE(p.outcome);
        const auto& result = p.outcome->second;
        std::size_t covered = 0;
        for (const auto& part : result.parts) {
            REQUIRE(part.begin == covered);
            covered += part.size;
            for (std::size_t e = part.begin; e < part.begin + part.size; ++e) {
                if (!part.averaged()) {
                    REQUIRE(p.values[e] == p.initial[e]);
                    continue;
                }
                const double want = mean_of(e, part.contributors);
                INFO("peer " << i << " element " << e);
                REQUIRE(std::abs(p.values[e] - want) <= tolerance * std::abs(want));
            }
        }
        REQUIRE(covered == p.values.size());
    }

    /// Peer i's round succeeded, averaged every part, and its values are those means.
    void check_fully_averaged(std::size_t i, double tolerance = 1e-6) const {
        INFO("peer " << i);
        REQUIRE(peers[i].outcome);
        const auto& [ec, result] = *peers[i].outcome;
        REQUIRE_FALSE(ec);
        CHECK(result.fraction_averaged() == 1.0);
        check_consistent(i, tolerance);
    }
};

std::vector<bool> all_but(std::size_t n, std::vector<std::size_t> excluded) {
    std::vector<bool> out(n, true);
    for (auto e : excluded)
        out[e] = false;
    return out;
}

/// Values whose weighted means are exact in float32, float16 and blockwise_8bit: small
/// integers, constant over each run of 64 elements (whole blocks of 64 encode them exactly),
/// different for every peer; `weights` such that any subset used sums to a power of two.
template <class Group>
void set_exact_values(Group& g, const std::vector<double>& weights) {
    for (std::size_t i = 0; i < g.peers.size(); ++i) {
        auto& p = g.peers[i];
        for (std::size_t e = 0; e < p.initial.size(); ++e)
            p.initial[e] = static_cast<float>(1 + (e / 64 * 7 + i * 5) % 40);
        p.values = p.initial;
        p.weight = weights[i];
    }
}

/// Options for exact blockwise_8bit rounds: blocks of 64 and parts of whole blocks.
averaging::allreduce_options exact_options(compression::kind codec) {
    auto options = allreduce_group<sim_world>::small_parts();
    options.codec = codec;
    if (codec == compression::kind::blockwise_8bit) {
        options.codec_options.block_size = 64;
        options.part_size_bytes = 545;
        REQUIRE(averaging::detail::part_elements_for(options.part_size_bytes, codec,
                                                     options.codec_options) == 512);
    }
    return options;
}

bool all_finite(const std::vector<float>& values) {
    return std::all_of(values.begin(), values.end(), [](float v) { return std::isfinite(v); });
}

} // namespace

TEMPLATE_TEST_CASE("allreduce: 4 peers, every mix of 0-2 clients and 0-2 aux, give the exact "
                   "weighted mean of the non-aux peers",
                   "[allreduce]", sim_world, tcp_world) {
    for (int clients = 0; clients <= 2; ++clients)
        for (int aux = 0; aux <= 2; ++aux) {
            std::vector<member_role> roles(4, member_role::node);
            for (int i = 0; i < clients; ++i)
                roles[static_cast<std::size_t>(i)] = member_role::client;
            for (int i = 0; i < aux; ++i)
                roles[static_cast<std::size_t>(3 - i)] = member_role::aux;
            INFO(clients << " clients, " << aux << " aux");
            allreduce_group<TestType> g(roles, 3001);
            g.run(60s);
            std::vector<bool> non_aux(4);
            for (std::size_t i = 0; i < 4; ++i)
                non_aux[i] = roles[i] != member_role::aux;
            for (std::size_t i = 0; i < 4; ++i) {
                auto& [ec, result] = *g.peers[i].outcome;
                REQUIRE_FALSE(ec);
                CHECK(result.participants == non_aux);
                CHECK(result.fraction_averaged() == 1.0);
                for (const auto& part : result.parts)
                    REQUIRE(part.contributors == non_aux);
                if (roles[i] == member_role::aux) {
                    CHECK(result.elements_total == g.spans[i]);
                    continue;
                }
                CHECK(result.elements_total == 3001);
                g.check_consistent(i);
            }
        }
}

TEMPLATE_TEST_CASE("allreduce: traffic at equal shares is 2(N-1)/N of the vector each way",
                   "[allreduce]", sim_world, tcp_world) {
    const std::size_t n = 4, size = 4000;
    allreduce_group<TestType> g(std::vector<member_role>(n, member_role::node), size);
    g.run(60s);
    for (std::size_t i = 0; i < n; ++i) {
        const auto& result = g.peers[i].outcome->second;
        REQUIRE_FALSE(g.peers[i].outcome->first);
        CHECK(result.values_sent == 2 * (n - 1) * size / n);
        CHECK(result.values_received == 2 * (n - 1) * size / n);
        // Uncompressed parts: 4 bytes a value plus a fixed header per message.
        CHECK(result.bytes_sent > 4 * result.values_sent);
        CHECK(result.bytes_sent < 4 * result.values_sent + 64 * 100);
        g.check_consistent(i);
    }
}

TEST_CASE("allreduce on TCP with a compute thread pool: exact, and nothing on the io thread "
          "breaks",
          "[allreduce]") {
    asio::thread_pool compute(2); // outlives the group: strands on it are in its services
    for (const auto codec : {compression::kind::none, compression::kind::float16}) {
        auto options = allreduce_group<tcp_world>::small_parts();
        options.codec = codec;
        allreduce_group<tcp_world> g(
            {member_role::node, member_role::client, member_role::node, member_role::aux}, 5003,
            options, 9, compute.get_executor());
        g.run(60s);
        for (std::size_t i = 0; i < 4; ++i) {
            REQUIRE_FALSE(g.peers[i].outcome->first);
            CHECK(g.peers[i].outcome->second.fraction_averaged() == 1.0);
            if (i != 3) g.check_consistent(i, codec == compression::kind::none ? 1e-6 : 2e-3);
        }
    }
}

TEST_CASE("allreduce with a compute thread pool: a round that compresses nothing does its part "
          "work on the io thread, one that compresses on any link or has large parts uses the "
          "pool",
          "[allreduce]") {
    asio::thread_pool compute(2); // outlives the group: strands on it are in its services
    struct setup {
        compression::kind codec;
        double slow_link; ///< peer 1's announced rate; 0: unknown
        std::size_t part_bytes;
        bool pooled;
    };
    const std::size_t large = averaging::detail::max_inline_part_bytes + 4;
    for (const auto& [codec, slow_link, part_bytes, pooled] :
         {setup{compression::kind::none, 0, 1000, false},
          setup{compression::kind::float16, 0, 1000, true},
          setup{compression::kind::none, 1e6, 1000, true},
          setup{compression::kind::none, 0, large, true}}) {
        INFO(compression::to_string(codec)
             << ", peer 1 announces " << slow_link << ", parts of " << part_bytes << " bytes");
        auto options = allreduce_group<tcp_world>::small_parts();
        options.codec = codec;
        options.codec_rate = 1e9; // blockwise_8bit below 1 GB/s
        options.part_size_bytes = part_bytes;
        allreduce_group<tcp_world> g(std::vector<member_role>(3, member_role::node), 3000, options,
                                     9, compute.get_executor());
        g.group.members[1].bandwidth = slow_link;
        // Called where a part or an average is encoded; it leaves the values as they are.
        std::atomic<int> in_pool{0}, elsewhere{0};
        averaging::allreduce_hooks hooks;
        hooks.rewrite_sent = [&](std::size_t, std::size_t, std::span<float>) {
            ++(compute.get_executor().running_in_this_thread() ? in_pool : elsewhere);
        };
        for (auto& p : g.peers)
            p.service->set_hooks(hooks);
        g.run(60s);
        // Relative errors: float16's, and blockwise_8bit's (sent over peer 1's slow link).
        const double tolerance = slow_link > 0                         ? 0.05
                                 : codec == compression::kind::float16 ? 2e-3
                                                                       : 1e-6;
        for (std::size_t i = 0; i < 3; ++i)
            g.check_fully_averaged(i, tolerance);
        CHECK((pooled ? in_pool : elsewhere) > 0);
        CHECK((pooled ? elsewhere : in_pool) == 0);
    }
}

TEST_CASE("allreduce: blockwise_8bit parts give every peer the same values, close to the mean",
          "[allreduce]") {
    auto options = allreduce_group<sim_world>::small_parts();
    options.codec = compression::kind::blockwise_8bit;
    options.part_size_bytes = 2048;
    // Parts are sized on the wire: about one byte per element, not four.
    const std::size_t per_part = averaging::detail::part_elements_for(
        options.part_size_bytes, options.codec, options.codec_options);
    CHECK(per_part > 2000);
    CHECK(per_part <= 2048);
    CHECK(averaging::detail::part_elements_for(512 << 10, compression::kind::none, {}) == 131072);
    CHECK(averaging::detail::part_elements_for(512 << 10, compression::kind::float16, {}) ==
          262144);
    allreduce_group<sim_world> g(std::vector<member_role>(4, member_role::node), 20000, options);
    g.run(60s);
    const auto everyone = all_but(4, {});
    for (std::size_t i = 0; i < 4; ++i) {
        const auto& result = g.peers[i].outcome->second;
        REQUIRE(result.fraction_averaged() == 1.0);
        CHECK(result.parts.size() == 4 * ((5000 + per_part - 1) / per_part));
        for (const auto& part : result.parts)
            CHECK(part.size <= per_part);
        CHECK(g.peers[i].values == g.peers[0].values); // bit-identical everywhere
        CHECK(result.bytes_sent * 3 < 4 * result.values_sent);
        for (std::size_t e = 0; e < 20000; ++e) {
            // Two quantisations (sender, reducer), each within 0.00703125 of the absmax (< 2.2).
            REQUIRE(std::abs(g.peers[i].values[e] - g.mean_of(e, everyone)) <= 2 * 0.0071 * 2.2);
        }
    }
}

TEST_CASE("allreduce: the adaptive codec choice compresses over links slower than the codec, "
          "and not over faster ones",
          "[allreduce][adaptive]") {
    using compression::kind;
    averaging::allreduce_options o;
    o.codec_rate = 1e9;
    CHECK(o.slow_link_codec == kind::blockwise_8bit); // on by default
    CHECK(averaging::codec_for_link(o, 1e8) == kind::blockwise_8bit);
    CHECK(averaging::codec_for_link(o, 2e9) == kind::none);
    CHECK(averaging::codec_for_link(o, 1e9) == kind::none); // no faster either way
    CHECK(averaging::codec_for_link(o, 0) == kind::none);   // unknown
    o.codec = kind::float16;
    CHECK(averaging::codec_for_link(o, 1e8) == kind::blockwise_8bit);
    CHECK(averaging::codec_for_link(o, 2e9) == kind::float16);
    o.slow_link_codec.reset();
    CHECK(averaging::codec_for_link(o, 1e8) == kind::float16);
    // A link is as slow as its slower known end; what a peer should not announce is unknown.
    using averaging::detail::slower_link;
    CHECK(slower_link(3, 5) == 3);
    CHECK(slower_link(0, 5) == 5);
    CHECK(slower_link(5, -1) == 5);
    CHECK(slower_link(std::numeric_limits<double>::quiet_NaN(), 7) == 7);
    CHECK(slower_link(std::numeric_limits<double>::infinity(), 0) == 0);
}

TEST_CASE("allreduce: over a long, fast link a round on warm connections takes its byte bound "
          "and a few round trips",
          "[averaging][allreduce]") {
    // Two peers, 1 Gbit/s up and down, 100 ms round trips, 32 MB each: a peer sends and
    // receives 16 MB of parts and 16 MB of averages, 0.27 s at the link's rate.
    constexpr std::size_t size = std::size_t{8} << 20;
    const double bound = 2.0 * (size / 2) * sizeof(float) / 125e6;
    const bool growing = GENERATE(true, false);
    CAPTURE(growing);
    averaging::allreduce_options options;
    options.sender_timeout = 60s;
    options.reducer_timeout = 60s;
    net::node_options rpc;
    if (!growing) rpc.mux.max_window = rpc.mux.initial_window;
    allreduce_group<sim_world> g({member_role::node, member_role::node}, size, options, 1,
                                 std::nullopt, false, {rpc, rpc});
    g.world.network.set_default_link({50ms, 0, 0.0});
    for (auto& m : g.members)
        g.world.network.set_node_bandwidth(m.transport->node(), 125'000'000, 125'000'000);
    double seconds = 0;
    for (std::uint8_t round = 0; round < 2; ++round) { // the first one also dials
        for (auto& p : g.peers) {
            p.outcome.reset();
            p.values = p.initial;
        }
        g.group.id[0] = std::byte{round};
        g.run(600s);
        time_point last{};
        for (const auto& p : g.peers) {
            REQUIRE_FALSE(p.outcome->first);
            CHECK(p.outcome->second.fraction_averaged() == 1.0);
            last = std::max(last, p.finished_at);
        }
        seconds = std::chrono::duration<double>(last - g.started_at).count();
    }
    // A 2 MiB window allows 21 MB/s, 16 MB in 0.8 s: the growth is what meets the bound.
    if (growing)
        CHECK(seconds <= bound + 0.3);
    else
        CHECK(seconds >= bound + 0.6);
}

TEST_CASE("allreduce: with the measured codec rate, a group announcing less bandwidth sends "
          "blockwise_8bit, one announcing more sends its values exactly",
          "[allreduce][adaptive]") {
    const double measured = compression::measured_throughput(compression::kind::blockwise_8bit);
    REQUIRE(measured > 0);
    REQUIRE(std::isfinite(measured));
    CHECK(compression::measured_throughput(compression::kind::blockwise_8bit) == measured);
    // Parts of 512 values (sized for `none`), whole blocks of 64: exact values stay exact
    // in 8 bits, so both outcomes are checked exactly and told apart by the bytes sent.
    auto options = allreduce_group<sim_world>::small_parts();
    options.part_size_bytes = 4 * 512;
    options.codec_options.block_size = 64;
    for (const bool slow : {true, false}) {
        INFO((slow ? "below" : "above") << " the measured rate " << measured);
        allreduce_group<sim_world> g(std::vector<member_role>(4, member_role::node), 4096, options);
        CHECK(g.peers[0].service->options().codec_rate == measured);
        for (auto& m : g.group.members)
            m.bandwidth = slow ? measured / 2 : measured * 2;
        set_exact_values(g, {1, 4, 1, 2});
        g.run(60s);
        for (std::size_t i = 0; i < 4; ++i) {
            const auto& [ec, result] = *g.peers[i].outcome;
            REQUIRE_FALSE(ec);
            REQUIRE(result.fraction_averaged() == 1.0);
            g.check_consistent(i);
            if (slow)
                CHECK(result.bytes_sent * 3 < 4 * result.values_sent);
            else
                CHECK(result.bytes_sent > 4 * result.values_sent);
        }
    }
}

TEST_CASE("allreduce: one slow member gets and sends compressed values, the others exchange "
          "theirs exactly, and every average goes out compressed",
          "[allreduce][adaptive]") {
    auto options = allreduce_group<sim_world>::small_parts();
    options.part_size_bytes = 4 * 512;
    options.codec_options.block_size = 64;
    options.codec_rate = 1e9;
    allreduce_group<sim_world> g(std::vector<member_role>(4, member_role::node), 4096, options);
    for (auto& m : g.group.members)
        m.bandwidth = 1e10;
    g.group.members[3].bandwidth = 1e8;
    set_exact_values(g, {1, 4, 1, 2});
    g.run(60s);
    for (std::size_t i = 0; i < 4; ++i) {
        const auto& [ec, result] = *g.peers[i].outcome;
        REQUIRE_FALSE(ec);
        g.check_consistent(i);
        // Values: 1024 to each of 3 reducers; averages: 1024 to each of 3 senders.
        REQUIRE(result.values_sent == 6 * 1024);
        // Member 3 sends everything in 8 bits (about 1 byte a value); the others send 1024
        // values exactly (4 bytes each) to each fast reducer, 8 bits to member 3, and all their
        // averages in 8 bits, since member 3 is among the senders of every span.
        const std::size_t exact_values = i == 3 ? 0 : 2 * 1024;
        const std::size_t compressed_values = result.values_sent - exact_values;
        CHECK(result.bytes_sent >= 4 * exact_values + compressed_values);
        CHECK(result.bytes_sent < 4 * exact_values + 2 * compressed_values);
    }
}

TEST_CASE("allreduce: a reducer that stages uncompressed parts also averages a sender's "
          "compressed ones (a sender whose codec is faster than the links compresses)",
          "[allreduce][adaptive]") {
    auto options = allreduce_group<sim_world>::small_parts();
    options.part_size_bytes = 4 * 512;
    options.codec_options.block_size = 64; // exact values stay exact in 8 bits
    options.codec_rate = 0.5e9;            // below the links: `none`, parts staged
    auto fast_codec = options;
    fast_codec.codec_rate = 2e9; // above them: blockwise_8bit to everyone
    allreduce_group<sim_world> g(std::vector<member_role>(4, member_role::node), 4096, options, 1,
                                 std::nullopt, false, {}, {fast_codec});
    for (auto& m : g.group.members)
        m.bandwidth = 1e9;
    set_exact_values(g, {1, 4, 1, 2});
    g.run(60s);
    for (std::size_t i = 0; i < 4; ++i) {
        INFO("peer " << i);
        const auto& [ec, result] = *g.peers[i].outcome;
        REQUIRE_FALSE(ec);
        REQUIRE(result.fraction_averaged() == 1.0);
        for (const auto& part : result.parts)
            REQUIRE(part.contributors == all_but(4, {}));
        g.check_consistent(i, 0.0);
        if (i == 0)
            CHECK(result.bytes_sent < 2 * result.values_sent);
        else
            CHECK(result.bytes_sent > 4 * result.values_sent);
    }
}

TEST_CASE("allreduce: invalid arguments are refused with invalid_argument", "[allreduce]") {
    allreduce_group<sim_world> g(std::vector<member_role>(3, member_role::node), 300);
    auto expect_refused = [&](auto&& mutate) {
        auto group = g.group;
        auto spans = g.spans;
        std::size_t me = 0;
        double weight = 1;
        std::vector<float> values = g.peers[0].initial;
        mutate(group, spans, me, weight, values);
        std::optional<std::error_code> got;
        g.peers[0].service->async_allreduce(
            group, me, spans, std::span<float>(values), weight, 10s,
            [&](std::error_code ec, allreduce_result) { got = ec; });
        REQUIRE(g.world.run_until([&] { return got.has_value(); }, 60s));
        CHECK(*got == errc::invalid_argument);
    };
    using G = decltype(g.group);
    using S = std::vector<std::size_t>;
    using V = std::vector<float>;
    expect_refused([](G&, S& s, std::size_t&, double&, V&) { s[0] += 1; });    // sum != V
    expect_refused([](G&, S& s, std::size_t&, double&, V&) { s.pop_back(); }); // count
    expect_refused([](G&, S&, std::size_t& me, double&, V&) { me = 1; });      // not us
    expect_refused([](G&, S&, std::size_t& me, double&, V&) { me = 7; });      // out of range
    expect_refused([](G&, S&, std::size_t&, double& w, V&) { w = 0; });
    expect_refused([](G&, S&, std::size_t&, double& w, V&) { w = std::nan(""); });
    expect_refused([](G&, S&, std::size_t&, double& w, V&) { w = 1e39; }); // not a float
    expect_refused([](G& group, S&, std::size_t&, double&, V&) {
        group.members[2].peer.id = group.members[1].peer.id; // duplicate member
    });
    expect_refused([](G& group, S&, std::size_t&, double&, V&) {
        group.members[1].role = member_role::client; // a client with a span
    });
}

TEST_CASE("allreduce: a non-finite value of our own ends our round with invalid_argument where "
          "it is read, and never reaches the others",
          "[allreduce]") {
    // 4 nodes, 4 spans of 1000, parts of 250. Peer 1's bad value lies either in reducer 2's
    // span (found when peer 1 packs that part) or in its own (found when it starts the sums).
    struct case_t {
        std::size_t element;
        std::size_t reducer;
    };
    for (const auto codec :
         {compression::kind::none, compression::kind::float16, compression::kind::blockwise_8bit})
        for (const case_t c : {case_t{2600, 2}, case_t{1600, 1}}) {
            INFO(compression::to_string(codec) << ", bad element " << c.element);
            auto options = allreduce_group<sim_world>::small_parts();
            options.codec = codec;
            const double tolerance = codec == compression::kind::none      ? 1e-6
                                     : codec == compression::kind::float16 ? 2e-3
                                                                           : 0.035;
            allreduce_group<sim_world> g(std::vector<member_role>(4, member_role::node), 4000,
                                         options);
            const float bad = c.reducer == 1 ? -INFINITY : INFINITY;
            g.peers[1].initial[c.element] = g.peers[1].values[c.element] = bad;
            g.run(60s);
            CHECK(g.peers[1].outcome->first == errc::invalid_argument);
            CHECK(g.peers[1].values[c.element] == bad);
            for (std::size_t i = 0; i < 4; ++i) {
                if (i != 1) REQUIRE_FALSE(g.peers[i].outcome->first);
                g.check_consistent(i, tolerance); // averaged, or the peer's own value
                const auto& result = g.peers[i].outcome->second;
                for (const auto& part : result.parts) {
                    if (c.element < part.begin || c.element >= part.begin + part.size) continue;
                    // Peer 1 stopped there: another reducer averages that part without it.
                    if (i == 1 || c.reducer == 1)
                        CHECK_FALSE(part.averaged());
                    else
                        CHECK(part.contributors == all_but(4, {1}));
                }
                for (std::size_t e = 0; e < 4000; ++e)
                    if (i != 1) REQUIRE(std::isfinite(g.peers[i].values[e]));
            }
        }
}

TEST_CASE("allreduce: senders wait past join_wait for a member that expects the group",
          "[allreduce]") {
    // Member 2 starts 3 s after the others, as a scheduled step triggered late: expecting the
    // group, it still gets every part; not expecting it, the others give up on it after 1 s.
    for (const bool expecting : {true, false}) {
        INFO("expecting: " << expecting);
        auto options = allreduce_group<sim_world>::small_parts();
        options.join_wait = 1s;
        options.sender_timeout = 8s;
        options.reducer_timeout = 10s;
        allreduce_group<sim_world> g(std::vector<member_role>(3, member_role::node), 1000, options);
        using service_type = allreduce_group<sim_world>::service_type;
        std::optional<service_type::expectation> expected;
        if (expecting) expected.emplace(g.peers[2].service->expect(g.group.id));
        g.start(0, 60s);
        g.start(1, 60s);
        g.world.network.time().run_for(3s);
        g.start(2, 60s);
        g.wait();
        expected.reset();
        for (std::size_t i = 0; i < 3; ++i) {
            INFO("peer " << i);
            REQUIRE_FALSE(g.peers[i].outcome->first);
            const auto& result = g.peers[i].outcome->second;
            g.check_consistent(i);
            if (expecting) {
                CHECK(result.fraction_averaged() == 1.0);
            } else if (i != 2) { // member 2's span came back to no one
                CHECK(result.parts.back().reducer == 2);
                CHECK_FALSE(result.parts.back().averaged());
            }
        }
    }
}

TEST_CASE("allreduce: a member of another group, a stranger and malformed parts are refused",
          "[allreduce]") {
    auto options = allreduce_group<sim_world>::small_parts();
    options.sender_timeout = 60s; // member 0 connects late, by hand
    options.reducer_timeout = 120s;
    allreduce_group<sim_world> g(std::vector<member_role>(2, member_role::node), 1000, options);
    auto& server = g.peers[1];
    g.start(1, 100s);
    g.world.settle();

    auto call = [&](std::size_t from, std::vector<byte_buffer> messages) {
        net::call_stream stream;
        std::optional<std::error_code> status;
        asio::co_spawn(
            g.world.io,
            [&]() -> asio::awaitable<void> {
                if (auto ec = co_await g.members[from].rpc->open_call(
                        g.group.members[1].peer, "hivemesh.allreduce", 20s, stream)) {
                    status = ec;
                    co_return;
                }
                for (auto& m : messages)
                    co_await stream.write(std::move(m));
                co_await stream.close_write();
                byte_buffer reply;
                while (true) {
                    const auto ec = co_await stream.read(reply);
                    if (!ec) continue;
                    status = ec == asio::error::eof ? std::error_code{} : ec;
                    break;
                }
            },
            asio::detached);
        REQUIRE(g.world.run_until([&] { return status.has_value(); }, 60s));
        return *status;
    };
    averaging::begin_message begin;
    begin.group = g.group.id;
    begin.group_size = 2;
    begin.sender = 0;
    begin.reducer = 1;
    begin.weight = 1;
    begin.span_begin = g.spans[0];
    begin.span_size = g.spans[1];
    begin.part_elements = 250;

    auto wrong_group = begin;
    wrong_group.group[0] ^= std::byte{1};
    CHECK(call(0, {encode(wrong_group)}) == errc::unknown_group);
    auto wrong_span = begin;
    wrong_span.span_size += 1;
    CHECK(call(0, {encode(wrong_span)}) == errc::protocol_violation);
    CHECK(call(0, {bytes_of({2, 1, 2})}) == errc::protocol_violation);

    // A non-member claiming to be member 0: its key proves otherwise.
    g.add_rpc(identity_of(99));
    CHECK(call(2, {encode(begin)}) == errc::refused);

    // Member 0 sends a part whose payload is garbage: dropped as a sender.
    byte_buffer bad_part;
    averaging::encode_part_head(bad_part, 0);
    bad_part.push_back(std::byte{7});
    CHECK(call(0, {encode(begin), bad_part}) == errc::protocol_violation);
    g.wait();
    // The reducer went on without member 0: its own span stayed its own values.
    const auto& result = server.outcome->second;
    CHECK_FALSE(server.outcome->first);
    CHECK(result.participants == std::vector<bool>{false, true});
}

TEST_CASE("allreduce faults (5 peers, one a client): healthy peers finish by their deadline "
          "and every element ends averaged or local, as the result says",
          "[allreduce][faults]") {
    const std::vector<member_role> roles{member_role::node, member_role::node, member_role::node,
                                         member_role::node, member_role::client};
    const duration timeout = 30s;
    // Inline compute, and compute posted so that failures land while a part is being added
    // (a part added for a sender that failed meanwhile must still count it).
    for (const bool posted : {false, true})
        for (const auto f : all_faults) {
            const bool reducing_fault = f == fault::fail_reducing || f == fault::slow_reducing;
            for (const std::size_t victim : {std::size_t{1}, std::size_t{4}}) {
                if (reducing_fault && victim == 4) continue; // a client reduces nothing
                INFO(to_string(f) << ", victim " << victim << (posted ? ", posted compute" : ""));
                allreduce_group<sim_world> g(roles, 5000, allreduce_group<sim_world>::small_parts(),
                                             1, std::nullopt, posted);
                auto& v = g.peers[victim];
                auto crash = [&g, victim] {
                    g.world.network.crash(g.members[victim].transport->node());
                };
                asio::cancellation_signal cancel;
                averaging::allreduce_hooks hooks;
                bool crashed = false;
                switch (f) {
                case fault::fail_before:
                    crash();
                    crashed = true;
                    break;
                case fault::fail_sending:
                    hooks.before_send = [&](std::size_t, std::size_t part) {
                        if (part == 2 && !crashed) {
                            crashed = true;
                            crash();
                        }
                        return duration::zero();
                    };
                    break;
                case fault::slow_sending:
                    hooks.before_send = [](std::size_t, std::size_t part) {
                        return part >= 2 ? duration(5s) : duration::zero();
                    };
                    break;
                case fault::fail_reducing:
                    hooks.before_reduce = [&](std::size_t part) {
                        if (part == 2 && !crashed) {
                            crashed = true;
                            crash();
                        }
                        return duration::zero();
                    };
                    break;
                case fault::slow_reducing:
                    hooks.before_reduce = [](std::size_t part) {
                        return part >= 1 ? duration(6s) : duration::zero();
                    };
                    break;
                case fault::cancel:
                    hooks.before_send = [&](std::size_t, std::size_t part) {
                        if (part == 2) cancel.emit(asio::cancellation_type::terminal);
                        return duration::zero();
                    };
                    break;
                }
                v.service->set_hooks(hooks);
                g.started_at = g.world.now();
                for (std::size_t i = 0; i < g.peers.size(); ++i) {
                    if (i == victim && f == fault::fail_before) continue;
                    g.start(i, timeout, i == victim ? cancel.slot() : asio::cancellation_slot{});
                }
                g.wait();

                for (std::size_t i = 0; i < g.peers.size(); ++i) {
                    if (i == victim && crashed) continue;
                    INFO("peer " << i);
                    const auto& [ec, result] = *g.peers[i].outcome;
                    CHECK(g.peers[i].finished_at - g.started_at <= timeout);
                    // Nobody waits longer than the reducer timeout plus a little here.
                    if (i != victim) CHECK(g.peers[i].finished_at - g.started_at <= 5s);
                    if (i == victim && f == fault::cancel)
                        CHECK(ec == errc::cancelled);
                    else
                        CHECK_FALSE(ec);
                    g.check_consistent(i);
                    if (i != victim) CHECK(result.fraction_averaged() > 0.5);
                }
                // Spans of 1250 elements, parts of 250: part q of a span is (begin % 1250) / 250.
                const auto part_index = [](const averaging::part_outcome& part) {
                    return (part.begin % 1250) / 250;
                };
                if (f == fault::slow_sending) {
                    // Parts 0 and 1 came in time and include the victim; later ones do not.
                    for (std::size_t i = 0; i < g.peers.size(); ++i) {
                        if (i == victim) continue;
                        for (const auto& part : g.peers[i].outcome->second.parts) {
                            REQUIRE(part.averaged());
                            if (part.reducer == victim) continue; // it reduced its own span fully
                            CHECK(part.contributors[victim] == (part_index(part) < 2));
                        }
                    }
                }
                if (f == fault::slow_reducing) {
                    // Part 0 of the victim's span came back in time, parts 1-4 stayed local.
                    for (std::size_t i = 0; i < g.peers.size(); ++i) {
                        if (i == victim) continue;
                        CHECK(g.peers[i].outcome->second.fraction_averaged() == 0.8);
                        for (const auto& part : g.peers[i].outcome->second.parts)
                            CHECK(part.averaged() ==
                                  (part.reducer != victim || part_index(part) == 0));
                    }
                    // The victim itself averaged its whole span, slowly, within its deadline.
                    CHECK(g.peers[victim].outcome->second.fraction_averaged() == 1.0);
                }
                if (f == fault::fail_before) {
                    // Exactly: the victim's span (if it had one) stayed local, the rest is the
                    // mean of everyone else.
                    for (std::size_t i = 0; i < g.peers.size(); ++i) {
                        if (i == victim) continue;
                        const auto& result = g.peers[i].outcome->second;
                        CHECK(result.participants == all_but(5, {victim}));
                        const double expected = victim == 4 ? 1.0 : 0.75;
                        CHECK(result.fraction_averaged() == expected);
                    }
                }
            }
        }
}

TEST_CASE("allreduce: a member whose process is gone (dials refused, its connections reset) is "
          "dropped at once, not after sender_timeout",
          "[allreduce][faults]") {
    auto options = allreduce_group<sim_world>::small_parts();
    options.sender_timeout = 30s; // waiting for the victim would show
    options.reducer_timeout = 60s;
    const std::size_t victim = 2;
    for (const bool mid_round : {false, true}) {
        INFO((mid_round ? "gone while sending its part 2" : "gone before the round"));
        allreduce_group<sim_world> g(std::vector<member_role>(4, member_role::node), 5000, options);
        // Its node closes without draining, as when its process is killed: the host stays up,
        // so dials to it are refused and its connections are reset.
        auto gone = [&g] { g.members[victim].rpc->close_now(); };
        if (mid_round) {
            averaging::allreduce_hooks hooks;
            bool closed = false;
            hooks.before_send = [&](std::size_t, std::size_t part) {
                if (part == 2 && !closed) {
                    closed = true;
                    asio::post(g.world.io, gone);
                }
                return duration::zero();
            };
            g.peers[victim].service->set_hooks(hooks);
            g.run(120s);
        } else {
            gone();
            g.run(120s, {victim});
        }
        for (std::size_t i = 0; i < g.peers.size(); ++i) {
            if (i == victim) continue;
            INFO("peer " << i);
            const auto& [ec, result] = *g.peers[i].outcome;
            CHECK_FALSE(ec);
            CHECK(g.peers[i].finished_at - g.started_at < 1s);
            g.check_consistent(i);
            // Our own spans are averaged over the three that remain; the victim's stayed ours
            // (mid-round, a part it sent before it went may count for a span).
            CHECK(result.fraction_averaged() == 0.75);
            if (!mid_round) CHECK(result.participants == all_but(4, {victim}));
        }
    }
}

TEST_CASE("allreduce: a sender's streams, and a reducer's result streams, keep pace with their "
          "slowest: none goes more than allreduce_pace_parts ahead of it, the slow one is not "
          "held, the round is exact",
          "[allreduce]") {
    const std::size_t parts = 40, slow = 1;
    const duration delay = 50ms; // before each of peer 0's parts or averages to member 1
    for (const bool results : {false, true})
        for (const double bound : {0.0, 10.0}) { // with the bound, reducers stage parts
            INFO((results ? "results" : "parts") << ", max_norm_ratio " << bound);
            auto options = allreduce_group<sim_world>::small_parts();
            options.max_norm_ratio = bound;
            // Spans of 10,000 floats: 40 parts of 250 each way between every two members.
            allreduce_group<sim_world> g(std::vector<member_role>(4, member_role::node), 40'000,
                                         options);
            // While stream `slow` waits here before part q, it has written q parts.
            std::size_t slow_part = 0, largest_lead = 0, others_started = 0;
            auto before = [&](std::size_t member, std::size_t p) {
                if (member == slow) {
                    slow_part = p;
                    return delay;
                }
                ++others_started;
                largest_lead = std::max(largest_lead, p - std::min(p, slow_part));
                return duration::zero();
            };
            averaging::allreduce_hooks hooks;
            (results ? hooks.before_result : hooks.before_send) = before;
            g.peers[0].service->set_hooks(hooks);
            g.run(60s);

            CHECK(others_started == 2 * parts);
            CHECK(largest_lead == averaging::allreduce_pace_parts);
            for (std::size_t i = 0; i < g.peers.size(); ++i)
                g.check_fully_averaged(i);
            // The slow stream's delays add up to 2 s; pacing holds the others, not it. Held
            // parts hold peer 0's own round; held averages the others' rounds.
            const std::vector<std::size_t> held =
                results ? std::vector<std::size_t>{1, 2, 3} : std::vector<std::size_t>{0};
            for (const std::size_t i : held) {
                INFO("peer " << i);
                const std::size_t waited = results && i != slow ? parts - 3 : parts;
                CHECK(g.peers[i].finished_at - g.started_at >= waited * delay);
                CHECK(g.peers[i].finished_at - g.started_at < parts * delay + 500ms);
            }
        }
}

TEST_CASE("allreduce: a part or result stream that stops making progress holds its sender's "
          "or reducer's others for a quarter of sender_timeout at most",
          "[allreduce][faults]") {
    const std::size_t stalled = 1;
    for (const bool results : {false, true}) {
        INFO((results ? "a result stream" : "a part stream") << " stalls");
        const auto options = allreduce_group<sim_world>::small_parts(); // sender_timeout 2 s
        allreduce_group<sim_world> g(std::vector<member_role>(4, member_role::node), 40'000,
                                     options);
        averaging::allreduce_hooks hooks;
        (results ? hooks.before_result : hooks.before_send) = [&](std::size_t k, std::size_t p) {
            return k == stalled && p == 2 ? duration(3s) : duration::zero();
        };
        g.peers[0].service->set_hooks(hooks);
        g.run(60s);

        if (results) {
            for (std::size_t i = 0; i < g.peers.size(); ++i)
                g.check_fully_averaged(i);
            // Member 1 gets peer 0's averages 3 s late (within its reducer_timeout of 4 s);
            // the others' streams were held for 0.5 s at most.
            CHECK(g.peers[1].finished_at - g.started_at >= 3s);
            for (const std::size_t i : {std::size_t{2}, std::size_t{3}}) {
                INFO("peer " << i);
                CHECK(g.peers[i].finished_at - g.started_at < 2s);
            }
            continue;
        }
        // Spans of 10,000 floats, parts of 250: part q of a span is (begin % 10000) / 250.
        for (std::size_t i = 0; i < g.peers.size(); ++i) {
            INFO("peer " << i);
            const auto& [ec, result] = *g.peers[i].outcome;
            CHECK_FALSE(ec);
            g.check_consistent(i);
            for (const auto& part : result.parts) {
                if (part.reducer == 0) continue;
                INFO("reducer " << part.reducer << ", part " << (part.begin % 10'000) / 250);
                // Member 1 dropped peer 0 after 2 s of silence (peer 0 keeps that span's
                // later parts local); the others had all its parts.
                const bool kept = part.reducer != stalled || (part.begin % 10'000) / 250 < 2;
                CHECK(part.averaged() == (kept || i != 0));
                if (part.averaged()) CHECK(part.contributors[0] == kept);
            }
        }
    }
}

TEST_CASE("allreduce: a round that ends while its values are being written from where they are "
          "closes that connection, so nothing reads them after it, and the next round redials",
          "[allreduce][faults]") {
    // Plaintext writes go out straight from the values; the client's upload cap keeps one
    // under way for seconds, and the round's deadline comes first.
    std::vector<net::node_options> nodes(2);
    for (auto& o : nodes)
        o.security.plaintext = true;
    nodes[0].max_upload_rate = 100e3;
    auto options = allreduce_group<sim_world>::small_parts();
    options.part_size_bytes = 64 << 10;
    allreduce_group<sim_world> g({member_role::client, member_role::node}, 100'000, options, 1,
                                 std::nullopt, false, nodes);
    g.started_at = g.world.now();
    g.start(0, 500ms);
    g.start(1, 60s);
    REQUIRE(g.world.run_until([&] { return g.peers[0].outcome.has_value(); }, 60s));
    CHECK(g.peers[0].outcome->second.fraction_averaged() < 1);
    CHECK(g.members[0].rpc->statistics().open_connections == 0);
    // The round is over: its values may go (ASan would see a later read of them).
    g.peers[0].values = {};
    g.peers[0].values.shrink_to_fit();
    g.wait();

    for (auto& p : g.peers) {
        p.values = p.initial;
        p.outcome.reset();
    }
    g.group.id[0] ^= std::byte{1}; // a new round
    g.run(60s);
    for (std::size_t i = 0; i < 2; ++i)
        g.check_fully_averaged(i);
}

TEST_CASE("allreduce over a list of tensors writes the averages back into each tensor",
          "[allreduce]") {
    allreduce_group<sim_world> g(std::vector<member_role>(3, member_role::node), 1000);
    std::deque<std::vector<float>> a, b;
    std::size_t pending = 3;
    for (std::size_t i = 0; i < 3; ++i) {
        auto& p = g.peers[i];
        a.emplace_back(p.initial.begin(), p.initial.begin() + 400);
        b.emplace_back(p.initial.begin() + 400, p.initial.end());
        std::vector<tensor::tensor_ref> refs;
        refs.emplace_back(a.back());
        refs.emplace_back(b.back());
        p.service->async_allreduce(g.group, i, g.spans, refs, p.weight, 30s,
                                   [&pending](std::error_code ec, allreduce_result r) {
                                       CHECK_FALSE(ec);
                                       CHECK(r.fraction_averaged() == 1.0);
                                       --pending;
                                   });
    }
    REQUIRE(g.world.run_until([&] { return pending == 0; }, 600s));
    const auto everyone = all_but(3, {});
    for (std::size_t i = 0; i < 3; ++i)
        for (std::size_t e = 0; e < 1000; ++e) {
            const float got = e < 400 ? a[i][e] : b[i][e - 400];
            REQUIRE(std::abs(got - g.mean_of(e, everyone)) <= 1e-6 * g.mean_of(e, everyone));
        }
}

TEST_CASE("allreduce: a sender's NaN or infinity leaves it out of that part's mean, weight and "
          "all, every result names it, and no tensor gets a non-finite value",
          "[allreduce][hostile]") {
    struct case_t {
        compression::kind codec;
        float bad;
        bool large_parts = false; ///< too large to work inline: added as they arrive
    };
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (const case_t c :
         {case_t{compression::kind::none, nan}, case_t{compression::kind::none, INFINITY},
          case_t{compression::kind::none, -INFINITY}, case_t{compression::kind::none, nan, true},
          case_t{compression::kind::float16, nan}})
        for (const double bound : {0.0, 10.0}) {
            INFO(compression::to_string(c.codec)
                 << ", " << c.bad << ", bound " << bound << ", large parts " << c.large_parts);
            auto options = exact_options(c.codec);
            options.max_norm_ratio = bound;
            if (c.large_parts)
                options.part_size_bytes = averaging::detail::max_inline_part_bytes + 4;
            allreduce_group<sim_world> g(std::vector<member_role>(4, member_role::node), 4096,
                                         options);
            // Honest weights sum to 4, everyone's to 8: both exact denominators.
            set_exact_values(g, {1, 4, 1, 2});
            averaging::allreduce_hooks hooks;
            hooks.rewrite_sent = [&](std::size_t reducer, std::size_t, std::span<float> values) {
                if (reducer != 1) values[values.size() / 2] = c.bad; // one bad value a part
            };
            g.peers[1].service->set_hooks(hooks);
            g.run(60s);
            const std::vector<exclusion> named{{1, value_fault::non_finite}};
            for (std::size_t i = 0; i < 4; ++i) {
                INFO("peer " << i);
                const auto& [ec, result] = *g.peers[i].outcome;
                REQUIRE_FALSE(ec);
                CHECK(result.fraction_averaged() == 1.0);
                CHECK(result.excluded == std::vector<bool>{false, true, false, false});
                CHECK(result.parts_refused == 0);
                for (const auto& part : result.parts) {
                    // Member 1 reduces its own span honestly, with its true values.
                    const bool own_span = part.reducer == 1;
                    REQUIRE(part.contributors == all_but(4, own_span
                                                                ? std::vector<std::size_t>{}
                                                                : std::vector<std::size_t>{1}));
                    REQUIRE(part.excluded == (own_span ? std::vector<exclusion>{} : named));
                    REQUIRE_FALSE(part.refused);
                }
                g.check_consistent(i, 0.0); // exactly the mean of the contributors named
                CHECK(all_finite(g.peers[i].values));
            }
        }
}

TEST_CASE("allreduce: with max_norm_ratio a part 1000 times the others' norm is left out of the "
          "mean, and without the bound it counts",
          "[allreduce][hostile]") {
    for (const auto codec :
         {compression::kind::none, compression::kind::float16, compression::kind::blockwise_8bit})
        for (const double bound : {10.0, 0.0}) {
            INFO(compression::to_string(codec) << ", bound " << bound);
            auto options = exact_options(codec);
            options.max_norm_ratio = bound;
            allreduce_group<sim_world> g(std::vector<member_role>(4, member_role::node), 4096,
                                         options);
            set_exact_values(g, {1, 4, 1, 2});
            averaging::allreduce_hooks hooks;
            hooks.rewrite_sent = [](std::size_t reducer, std::size_t, std::span<float> values) {
                if (reducer != 1)
                    for (float& v : values)
                        v *= 1000;
            };
            g.peers[1].service->set_hooks(hooks);
            g.run(60s);
            const std::vector<exclusion> named{{1, value_fault::norm_bound}};
            for (std::size_t i = 0; i < 4; ++i) {
                INFO("peer " << i);
                const auto& [ec, result] = *g.peers[i].outcome;
                REQUIRE_FALSE(ec);
                CHECK(result.fraction_averaged() == 1.0);
                CHECK(result.excluded == std::vector<bool>{false, bound > 0, false, false});
                for (const auto& part : result.parts) {
                    const bool left_out = bound > 0 && part.reducer != 1;
                    REQUIRE(part.contributors == all_but(4, left_out ? std::vector<std::size_t>{1}
                                                                     : std::vector<std::size_t>{}));
                    REQUIRE(part.excluded == (left_out ? named : std::vector<exclusion>{}));
                    REQUIRE_FALSE(part.refused);
                    if (left_out || part.reducer == 1) continue;
                    // Counted: the mean holds member 1's values times 1000 (float16 rounds them).
                    for (std::size_t e = part.begin; e < part.begin + part.size; ++e) {
                        double sum = 0;
                        for (std::size_t j = 0; j < 4; ++j)
                            sum += g.peers[j].weight * g.peers[j].initial[e] * (j == 1 ? 1000 : 1);
                        const double want = sum / 8;
                        const double tolerance = codec == compression::kind::float16 ? 2e-3 : 0;
                        INFO("element " << e);
                        REQUIRE(std::abs(g.peers[i].values[e] - want) <= tolerance * want);
                    }
                }
                if (bound > 0) g.check_consistent(i, 0.0);
                CHECK(all_finite(g.peers[i].values));
            }
        }
}

TEST_CASE("allreduce: a reducer's non-finite or absurd averages are refused: the senders keep "
          "their own values for those parts and say why",
          "[allreduce][hostile]") {
    struct case_t {
        compression::kind codec;
        double bound;
        float bad;     ///< part 1's averages become this (0: 1e6 times the true ones)
        bool carry_on; ///< the part after it is still averaged
    };
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (const case_t c : {case_t{compression::kind::none, 0, nan, false},
                           case_t{compression::kind::none, 0, INFINITY, false},
                           case_t{compression::kind::float16, 0, nan, false},
                           case_t{compression::kind::none, 10, nan, false},
                           case_t{compression::kind::none, 10, 0, true},
                           case_t{compression::kind::float16, 10, 0, true}}) {
        INFO(compression::to_string(c.codec) << ", bound " << c.bound << ", " << c.bad);
        auto options = exact_options(c.codec);
        options.max_norm_ratio = c.bound;
        allreduce_group<sim_world> g(std::vector<member_role>(4, member_role::node), 4096, options);
        set_exact_values(g, {1, 4, 1, 2});
        averaging::allreduce_hooks hooks;
        hooks.rewrite_sent = [&](std::size_t reducer, std::size_t part, std::span<float> values) {
            if (reducer != 1 || part != 1) return; // member 1's averages of its part 1
            for (float& v : values)
                v = c.bad == 0 ? v * 1e6f : c.bad;
        };
        g.peers[1].service->set_hooks(hooks);
        g.run(60s);
        const std::size_t per_part = averaging::detail::part_elements_for(
            options.part_size_bytes, options.codec, options.codec_options);
        const auto fault = c.bad == 0 ? value_fault::norm_bound : value_fault::non_finite;
        for (std::size_t i = 0; i < 4; ++i) {
            INFO("peer " << i);
            const auto& [ec, result] = *g.peers[i].outcome;
            REQUIRE_FALSE(ec);
            CHECK(all_finite(g.peers[i].values));
            if (i == 1) continue; // applied its own true averages
            CHECK(result.parts_refused == 1);
            CHECK(result.excluded == std::vector<bool>(4, false));
            for (const auto& part : result.parts) {
                const std::size_t q = (part.begin - g.spans[0] * part.reducer) / per_part;
                INFO("reducer " << part.reducer << ", part " << q);
                CHECK(part.excluded.empty());
                if (part.reducer != 1 || q == 0 || (q > 1 && c.carry_on)) {
                    CHECK(part.contributors == all_but(4, {}));
                    CHECK_FALSE(part.refused);
                } else if (q == 1) {
                    CHECK_FALSE(part.averaged());
                    CHECK(part.refused == fault);
                } else { // a reducer that sent non-finite values is not heard any more
                    CHECK_FALSE(part.averaged());
                    CHECK_FALSE(part.refused);
                }
            }
            g.check_consistent(i, 0.0); // averaged exactly, or our own values
        }
    }
}

TEST_CASE("allreduce: finite values whose sum overflows are neither applied nor returned, and "
          "the norm bound leaves them out",
          "[allreduce][hostile]") {
    for (const auto codec : {compression::kind::none, compression::kind::blockwise_8bit})
        for (const double bound : {0.0, 10.0})
            for (const bool large_parts : {false, true}) {
                INFO(compression::to_string(codec)
                     << ", bound " << bound << ", large parts " << large_parts);
                auto options = exact_options(codec);
                options.max_norm_ratio = bound;
                if (large_parts) // too large to work inline: added as they arrive
                    options.part_size_bytes = averaging::detail::max_inline_part_bytes + 4;
                allreduce_group<sim_world> g(std::vector<member_role>(4, member_role::node), 4096,
                                             options);
                set_exact_values(g, {1, 4, 1, 2});
                averaging::allreduce_hooks hooks;
                hooks.rewrite_sent = [](std::size_t reducer, std::size_t part,
                                        std::span<float> values) {
                    // Times its weight 4, the largest float overflows member 0's sums of part 0.
                    if (reducer == 0 && part == 0)
                        std::fill(values.begin(), values.end(), std::numeric_limits<float>::max());
                };
                g.peers[1].service->set_hooks(hooks);
                g.run(60s);
                for (std::size_t i = 0; i < 4; ++i) {
                    INFO("peer " << i);
                    REQUIRE_FALSE(g.peers[i].outcome->first);
                    CHECK(all_finite(g.peers[i].values));
                    g.check_consistent(i, 0.0);
                }
                const auto& first = g.peers[0].outcome->second.parts.front();
                if (bound > 0) {
                    CHECK(first.excluded == std::vector<exclusion>{{1, value_fault::norm_bound}});
                    CHECK(first.contributors == all_but(4, {1}));
                    for (std::size_t i = 0; i < 4; ++i)
                        CHECK(g.peers[i].outcome->second.fraction_averaged() == 1.0);
                } else {
                    // Member 0 applied and returned nothing for its part 0; the senders then had
                    // no more of its span, and its other parts held only its own values.
                    CHECK(first.refused == value_fault::non_finite);
                    CHECK_FALSE(first.averaged());
                    for (std::size_t i = 1; i < 4; ++i)
                        for (const auto& part : g.peers[i].outcome->second.parts)
                            CHECK(part.averaged() == (part.reducer != 0));
                }
            }
}

TEST_CASE("allreduce on TCP with a compute thread pool and the norm bound: a hostile client's "
          "parts are left out at every reducer, an aux one too",
          "[allreduce][hostile]") {
    asio::thread_pool compute(2); // outlives the group: strands on it are in its services
    auto options = allreduce_group<tcp_world>::small_parts();
    options.max_norm_ratio = 10;
    allreduce_group<tcp_world> g(
        {member_role::node, member_role::client, member_role::node, member_role::aux}, 5003,
        options, 9, compute.get_executor());
    averaging::allreduce_hooks hooks;
    hooks.rewrite_sent = [](std::size_t, std::size_t part, std::span<float> values) {
        if (part % 2 == 0)
            values[0] = std::numeric_limits<float>::quiet_NaN();
        else
            for (float& v : values)
                v *= 1000;
    };
    g.peers[1].service->set_hooks(hooks);
    g.run(60s);
    std::vector<std::size_t> span_begin{0};
    for (const std::size_t size : g.spans)
        span_begin.push_back(span_begin.back() + size);
    for (std::size_t i = 0; i < 4; ++i) {
        INFO("peer " << i);
        const auto& [ec, result] = *g.peers[i].outcome;
        REQUIRE_FALSE(ec);
        CHECK(result.fraction_averaged() == 1.0);
        CHECK(result.excluded == std::vector<bool>{false, true, false, false});
        for (const auto& part : result.parts) {
            const std::size_t q = (part.begin - span_begin[part.reducer]) / 250;
            const auto fault = q % 2 == 0 ? value_fault::non_finite : value_fault::norm_bound;
            REQUIRE(part.contributors == std::vector<bool>{true, false, true, false});
            REQUIRE(part.excluded == std::vector<exclusion>{{1, fault}});
        }
        if (i != 3) g.check_consistent(i);
        CHECK(all_finite(g.peers[i].values));
    }
}

TEST_CASE("allreduce: the norm bound compares each norm with the lower median of all, holds none "
          "while that is 0, and is 0 or at least 1",
          "[allreduce][hostile]") {
    using averaging::detail::beyond_norm_bound;
    using B = std::vector<bool>;
    CHECK(beyond_norm_bound({}, 10).empty());
    CHECK(beyond_norm_bound({1, 2, 1000}, 10) == B{false, false, true});
    CHECK(beyond_norm_bound({1000, 2, 3, 1}, 10) == B{true, false, false, false});
    CHECK(beyond_norm_bound({2, 3, 30}, 10) == B{false, false, false});
    CHECK(beyond_norm_bound({2, 3, 30.5}, 10) == B{false, false, true});
    CHECK(beyond_norm_bound({1, 1000}, 10) == B{false, true}); // two: against the smaller
    CHECK(beyond_norm_bound({0, 5}, 10) == B{false, false});
    CHECK(beyond_norm_bound({0, 0, 7, 1e30}, 10) == B{false, false, false, false});
    CHECK(averaging::detail::l2_norm(std::vector<float>{3, 4}) == 5);
    CHECK(std::isnan(averaging::detail::l2_norm(
        std::vector<float>{1, std::numeric_limits<float>::quiet_NaN()})));

    allreduce_group<sim_world> g(std::vector<member_role>(1, member_role::node), 10);
    using service_type = allreduce_group<sim_world>::service_type;
    for (const double bad : {0.5, -1.0, std::nan(""), double(INFINITY)}) {
        averaging::allreduce_options options;
        options.method = "other";
        options.max_norm_ratio = bad;
        CHECK_THROWS_AS(service_type(*g.members[0].rpc, options), std::invalid_argument);
    }
    averaging::allreduce_options options;
    options.method = "other";
    options.max_norm_ratio = 1;
    CHECK_NOTHROW(service_type(*g.members[0].rpc, options));
}

TEST_CASE("allreduce: a part's mean in one pass is bit for bit the sums added one by one and "
          "scaled, and stops at a NaN, an infinity or an overflow",
          "[allreduce]") {
    using averaging::detail::weighted_mean_into;
    using averaging::detail::weighted_values;
    random_generator rng(11);
    auto random_floats = [&rng](std::size_t n) {
        std::vector<float> v(n);
        for (auto& x : v) // signs and magnitudes mixed, so every sum rounds
            x = static_cast<float>((rng.uniform_real() - 0.5) *
                                   std::ldexp(1.0, static_cast<int>(rng.uniform(20))));
        return v;
    };
    for (const std::size_t n : {std::size_t{1}, std::size_t{2047}, std::size_t{2048},
                                std::size_t{2049}, std::size_t{5000}})
        for (std::size_t senders = 0; senders <= 3; ++senders)
            for (const bool with_own : {true, false}) {
                INFO(n << " values, " << senders << " senders, own " << with_own);
                const auto own = random_floats(n);
                const float own_weight = 1.7f;
                std::vector<std::vector<float>> theirs;
                std::vector<float> weights;
                // Each sender's values one byte into a buffer: unaligned, as in a message.
                std::vector<byte_buffer> messages;
                std::vector<weighted_values> others;
                for (std::size_t j = 0; j < senders; ++j) {
                    theirs.push_back(random_floats(n));
                    weights.push_back(0.3f + static_cast<float>(j));
                    messages.emplace_back(4 * n + 1);
                    std::memcpy(messages.back().data() + 1, theirs.back().data(), 4 * n);
                }
                for (std::size_t j = 0; j < senders; ++j)
                    others.push_back({messages[j].data() + 1, weights[j]});
                const float scale = 1.0f / 3.1f;
                std::vector<float> expected(n, 0.0f); // as part_sums and decompress_add do
                if (with_own)
                    for (std::size_t i = 0; i < n; ++i)
                        expected[i] = own_weight * own[i];
                for (std::size_t j = 0; j < senders; ++j)
                    for (std::size_t i = 0; i < n; ++i)
                        expected[i] += weights[j] * theirs[j][i];
                for (auto& v : expected)
                    v *= scale;
                std::vector<float> out(n, -1.0f);
                REQUIRE(weighted_mean_into(
                    out, with_own ? std::span<const float>(own) : std::span<const float>{},
                    own_weight, others, scale));
                REQUIRE(std::memcmp(out.data(), expected.data(), 4 * n) == 0);
                if (senders == 0) continue;
                // A NaN, an infinity, or a finite value that overflows once weighted, in the
                // first chunk or the last.
                auto skewed = others;
                skewed.back().weight = 4.0f;
                std::byte* last = messages.back().data() + 1;
                for (const float bad :
                     {std::numeric_limits<float>::quiet_NaN(),
                      -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::max()})
                    for (const std::size_t at : {std::size_t{0}, n - 1}) {
                        std::memcpy(last + 4 * at, &bad, 4);
                        CHECK_FALSE(weighted_mean_into(out, {}, 0, skewed, 1.0f));
                        std::memcpy(last + 4 * at, &theirs.back()[at], 4);
                    }
            }
}

TEST_CASE("allreduce wire: a result's exclusions round-trip, and malformed ones are refused",
          "[allreduce]") {
    const std::vector<bool> who{true, false, true, false, false};
    const std::vector<exclusion> excluded{{1, value_fault::non_finite},
                                          {3, value_fault::norm_bound}};
    byte_buffer message;
    averaging::encode_result_head(message, 7, who, excluded);
    message.push_back(std::byte{9}); // the payload, not looked into here
    averaging::part_message m;
    REQUIRE_FALSE(decode_part(message, averaging::allreduce_message::result, 5, m));
    CHECK(m.part == 7);
    CHECK(m.contributors == who);
    CHECK(m.excluded == excluded);
    CHECK(m.payload.size() == 1);
    message[0] = std::byte{1}; // results without exclusions
    CHECK(decode_part(message, averaging::allreduce_message::result, 5, m) ==
          errc::unsupported_version);
    message[0] = std::byte{averaging::allreduce_wire_version};
    message.resize(message.size() - 2); // into the last exclusion
    CHECK(decode_part(message, averaging::allreduce_message::result, 5, m) ==
          errc::truncated_input);

    auto refused = [&who](std::vector<exclusion> list) {
        byte_buffer bytes;
        averaging::encode_result_head(bytes, 0, who, list);
        averaging::part_message out;
        return decode_part(bytes, averaging::allreduce_message::result, 5, out) ==
               errc::protocol_violation;
    };
    CHECK(refused({{3, value_fault::norm_bound}, {1, value_fault::norm_bound}})); // unordered
    CHECK(refused({{1, value_fault::norm_bound}, {1, value_fault::non_finite}})); // twice
    CHECK(refused({{5, value_fault::norm_bound}}));                               // no member
    CHECK(refused({{2, value_fault::norm_bound}}));                               // contributed
    CHECK(refused({{1, static_cast<value_fault>(3)}}));                           // no fault
    CHECK(refused({{1, static_cast<value_fault>(0)}}));
}

} // namespace hivemesh::test
