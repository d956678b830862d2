// The averager on a simulated DHT swarm: Moshpit steps reach the exact global mean, a
// scheduled step waits for its trigger, a lonely peer gets too_few_peers, state loads.
#include "support/bytes.hpp"
#include "support/swarm_checks.hpp"

#include <hivemesh/averaging/averager.hpp>
#include <hivemesh/tensor/raw.hpp>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <deque>
#include <memory>
#include <vector>

namespace hivemesh::test {
namespace {

using averager_type = averaging::averager<net::sim::transport>;

struct averager_swarm {
    swarm<sim_world> dht;
    std::deque<std::vector<float>> first, second; // two tensors per peer
    std::vector<std::unique_ptr<averager_type>> averagers;

    averager_swarm(std::size_t n, std::size_t bits, std::size_t group) {
        random_generator rng(3);
        for (std::size_t i = 0; i < n; ++i) {
            auto& m = dht.add(500 + i);
            first.emplace_back(300);
            second.emplace_back(77);
            for (auto& v : first.back())
                v = static_cast<float>(rng.normal());
            for (auto& v : second.back())
                v = static_cast<float>(rng.normal());
            averaging::averager_options o;
            o.prefix = "run";
            o.group_key_length = bits;
            o.initial_bits = averaging::group_bits(i % (std::size_t{1} << bits), bits);
            o.target_group_size = group;
            o.min_group_size = 2;
            o.matchmaking_time = 6s;
            o.bandwidth = 1e8;
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
