// The averager on a simulated DHT swarm: Moshpit steps reach the exact global mean, a
// scheduled step waits for its trigger, a lonely peer gets too_few_peers, state loads.
#include "support/bytes.hpp"
#include "support/swarm_checks.hpp"

#include <hivemesh/averaging/averager.hpp>
#include <hivemesh/tensor/raw.hpp>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

namespace hivemesh::test {
namespace {

using averager_type = averaging::averager<net::sim::transport>;

struct averager_swarm {
    /// May change peer i's averager options and its RPC node's options before it is made.
    using tuning =
        std::function<void(std::size_t i, averaging::averager_options&, net::node_options&)>;

    swarm<sim_world> dht;
    std::deque<std::vector<float>> first, second; // two tensors per peer
    std::vector<std::unique_ptr<averager_type>> averagers;

    averager_swarm(std::size_t n, std::size_t bits, std::size_t group, const tuning& tune = {}) {
        random_generator rng(3);
        const net::node_options rpc_defaults = dht.rpc_options;
        for (std::size_t i = 0; i < n; ++i) {
            averaging::averager_options o;
            o.prefix = "run";
            o.group_key_length = bits;
            o.initial_bits = averaging::group_bits(i % (std::size_t{1} << bits), bits);
            o.target_group_size = group;
            o.min_group_size = 2;
            o.matchmaking_time = 6s;
            o.bandwidth = 1e8;
            // Exact rounds: no adaptive codec choice, which weighs 1e8 against this build's
            // codec rate.
            o.allreduce.slow_link_codec.reset();
            dht.rpc_options = rpc_defaults;
            if (tune) tune(i, o, dht.rpc_options);
            auto& m = dht.add(500 + i);
            first.emplace_back(300);
            second.emplace_back(77);
            for (auto& v : first.back())
                v = static_cast<float>(rng.normal());
            for (auto& v : second.back())
                v = static_cast<float>(rng.normal());
            std::vector<tensor::tensor_ref> refs;
            refs.emplace_back(first.back());
            refs.emplace_back(second.back());
            averagers.push_back(
                std::make_unique<averager_type>(*m.rpc, *m.dht, m.endpoint, refs, o));
        }
        test::bootstrap(dht, 1);
    }

    std::vector<double> mean() const {
        std::vector<double> out(377, 0.0);
        for (std::size_t i = 0; i < first.size(); ++i)
            for (std::size_t e = 0; e < 377; ++e)
                out[e] += e < 300 ? first[i][e] : second[i][e - 300];
        for (auto& v : out)
            v /= static_cast<double>(first.size());
        return out;
    }
};

} // namespace

TEST_CASE("averager: 16 peers with 2-bit keys reach the exact global mean in 2 steps",
          "[averager]") {
    averager_swarm s(16, 2, 4);
    const auto want = s.mean();
    for (int step = 0; step < 2; ++step) {
        std::size_t pending = 16;
        for (auto& a : s.averagers)
            a->async_step(1.0, [&](std::error_code ec, averaging::step_result r) {
                CHECK_FALSE(ec);
                CHECK(r.group_size == 4);
                CHECK(r.allreduce.fraction_averaged() == 1.0);
                --pending;
            });
        REQUIRE(s.dht.world.run_until([&] { return pending == 0; }, 600s));
    }
    for (std::size_t i = 0; i < 16; ++i)
        for (std::size_t e = 0; e < 377; ++e) {
            const double got = e < 300 ? s.first[i][e] : s.second[i][e - 300];
            REQUIRE(std::abs(got - want[e]) <= 1e-5 * (1 + std::abs(want[e])));
        }
}

TEST_CASE("averager: a scheduled step matches now and averages once triggered", "[averager]") {
    averager_swarm s(4, 0, 4);
    const auto want = s.mean();
    std::size_t pending = 4;
    std::vector<std::shared_ptr<averaging::step_control>> controls;
    for (auto& a : s.averagers) {
        controls.push_back(a->make_control());
        a->async_scheduled_step(controls.back(), [&](std::error_code ec, averaging::step_result) {
            CHECK_FALSE(ec);
            --pending;
        });
    }
    s.dht.world.network.time().run_for(3s);
    CHECK(pending == 4);                // grouped, but nobody triggered
    for (std::size_t i = 0; i < 4; ++i) // values change before the trigger: those count
        s.first[i][0] += 1.0f;
    for (auto& c : controls)
        c->trigger(2.0);
    REQUIRE(s.dht.world.run_until([&] { return pending == 0; }, 600s));
    CHECK(std::abs(s.first[0][0] - (want[0] + 1.0)) <= 1e-5 * (1 + std::abs(want[0])));
    CHECK(s.first[3][0] == s.first[0][0]);
}

TEST_CASE("averager: a lower count of the members expected forms the group at once", "[averager]") {
    // Three peers in groups of up to 4 with 6 s windows; each control expects 4 members.
    averager_swarm s(3, 0, 4);
    const auto start = s.dht.world.now();
    std::size_t pending = 3;
    std::optional<time_point> done;
    std::vector<std::shared_ptr<averaging::step_control>> controls;
    for (auto& a : s.averagers) {
        controls.push_back(a->make_control(0, 4));
        a->async_scheduled_step(controls.back(), [&](std::error_code ec, averaging::step_result r) {
            CHECK_FALSE(ec);
            CHECK(r.group_size == 3);
            if (--pending == 0) done = s.dht.world.now();
        });
    }
    for (auto& c : controls)
        c->trigger();
    s.dht.world.network.time().run_for(3s); // every peer has joined the leader by now
    CHECK(pending == 3);
    SECTION("told after the trigger that 3 are expected") {
        for (auto& c : controls)
            c->expect(3);
        REQUIRE(s.dht.world.run_until([&] { return pending == 0; }, 60s));
        CHECK(*done - start < 4s);
        CHECK(controls[0]->expected_members() == 3);
    }
    SECTION("otherwise the group waits for the fourth member until the window ends") {
        REQUIRE(s.dht.world.run_until([&] { return pending == 0; }, 60s));
        CHECK(*done - start >= 6s);
        CHECK(controls[0]->expected_members() == 4);
    }
}

TEST_CASE("averager: a peer alone gets too_few_peers and keeps its values", "[averager]") {
    averager_swarm s(1, 1, 4);
    const auto before = s.first[0];
    std::optional<std::error_code> got;
    s.averagers[0]->async_step(1.0, [&](std::error_code ec, averaging::step_result) { got = ec; });
    REQUIRE(s.dht.world.run_until([&] { return got.has_value(); }, 600s));
    CHECK(*got == errc::too_few_peers);
    CHECK(s.first[0] == before);
}

TEST_CASE("averager: cancelling a step ends it at once with cancelled", "[averager]") {
    averager_swarm s(1, 0, 4);
    asio::cancellation_signal signal;
    std::optional<std::error_code> got;
    const auto start = s.dht.world.now();
    s.averagers[0]->async_step(
        1.0, asio::bind_cancellation_slot(
                 signal.slot(), [&](std::error_code ec, averaging::step_result) { got = ec; }));
    s.dht.world.network.time().run_for(1s);
    REQUIRE_FALSE(got.has_value()); // still looking: the window is 6 s
    signal.emit(asio::cancellation_type::terminal);
    REQUIRE(s.dht.world.run_until([&] { return got.has_value(); }, 600s));
    CHECK(*got == errc::cancelled);
    CHECK(s.dht.world.now() - start < 3s);
}

TEST_CASE("announced_bandwidths: a client is 0, a member that announced none is unknown",
          "[averager][rate]") {
    averaging::group_info<net::sim::transport::endpoint_type> group;
    for (const auto& [role, bandwidth] : {std::pair{averaging::member_role::node, 2e6},
                                          std::pair{averaging::member_role::client, 3e6},
                                          std::pair{averaging::member_role::node, 0.0},
                                          std::pair{averaging::member_role::aux, 1e6}})
        group.members.push_back({{}, role, bandwidth, {}});
    CHECK(averaging::announced_bandwidths(group) ==
          std::vector<std::optional<double>>{2e6, 0.0, std::nullopt, 1e6});
}

TEST_CASE("averager: a peer's upload cap is the bandwidth it announces, so it reduces a smaller "
          "span",
          "[averager][rate]") {
    // Peer 0 caps its upload and leaves its bandwidth unknown; the others announce 1.25x the
    // cap. The load balancer then gives peer 0 a share of 1/7 and the others 3/7 each. Were
    // the cap not announced, peer 0 would count at the others' mean: 1/3 each.
    constexpr double cap = 1e6, others = 1.25e6;
    averager_swarm s(3, 0, 3,
                     [&](std::size_t i, averaging::averager_options& o, net::node_options& rpc) {
                         if (i == 0) {
                             o.bandwidth = 0;
                             rpc.max_upload_rate = cap;
                         } else {
                             o.bandwidth = others;
                         }
                     });
    CHECK(s.averagers[0]->options().bandwidth == cap);
    std::vector<std::optional<averaging::step_result>> results(3);
    for (std::size_t i = 0; i < 3; ++i)
        s.averagers[i]->async_step(1.0,
                                   [&results, i](std::error_code ec, averaging::step_result r) {
                                       CHECK_FALSE(ec);
                                       results[i] = std::move(r);
                                   });
    const auto all_done = [&] {
        return std::all_of(results.begin(), results.end(),
                           [](const auto& r) { return r.has_value(); });
    };
    REQUIRE(s.dht.world.run_until(all_done, 600s));
    // Members are in the group's order; peer 0 knows its place in it.
    std::vector<double> bandwidths(3, others);
    bandwidths[results[0]->index] = cap;
    std::error_code ec;
    const auto want = averaging::load_balance(377, std::span<const double>(bandwidths), ec);
    REQUIRE_FALSE(ec);
    REQUIRE(want.size() == 3);
    CHECK(want[results[0]->index] > 0);
    CHECK(want[results[0]->index] * 2 < want[(results[0]->index + 1) % 3]);
    for (const auto& r : results) {
        REQUIRE(r->group_size == 3);
        CHECK(r->allreduce.fraction_averaged() == 1.0);
        std::vector<std::size_t> spans(3, 0);
        for (const auto& part : r->allreduce.parts)
            spans[part.reducer] += part.size;
        CHECK(spans == want);
    }
}

TEST_CASE("averager: a newcomer loads the state a peer serves", "[averager]") {
    averager_swarm s(3, 0, 4);
    s.averagers[1]->serve_state(
        [&] {
            averaging::state_snapshot st;
            st.metadata = bytes_of("epoch 7");
            st.tensors = {s.first[1], s.second[1]};
            return st;
        },
        7.0);
    std::optional<std::error_code> advertised;
    s.averagers[1]->state_server_ptr()->async_advertise(
        [&](std::error_code ec) { advertised = ec; });
    REQUIRE(s.dht.world.run_until([&] { return advertised.has_value(); }, 600s));
    REQUIRE_FALSE(*advertised);
    std::optional<std::pair<std::error_code, averaging::downloaded_state>> loaded;
    s.averagers[2]->async_load_state_from_peers(
        {}, [&](std::error_code ec, averaging::downloaded_state d) {
            loaded.emplace(ec, std::move(d));
        });
    REQUIRE(s.dht.world.run_until([&] { return loaded.has_value(); }, 600s));
    REQUIRE_FALSE(loaded->first);
    CHECK(loaded->second.contents.metadata == bytes_of("epoch 7"));
    CHECK(loaded->second.contents.tensors[0] == s.first[1]);
    CHECK(loaded->second.contents.tensors[1] == s.second[1]);
}

} // namespace hivemesh::test
