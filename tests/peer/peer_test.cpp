// hivemesh::peer over loopback TCP and basic_peer on the simulated network: start-up,
// addresses, bootstrap, the errors a user meets, and shutdown with calls in flight.
#include "support/errors.hpp"
#include "support/identities.hpp"

#include <hivemesh/net/sim.hpp>
#include <hivemesh/peer.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <future>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <unistd.h>

using namespace hivemesh;
using namespace std::chrono_literals;

namespace {

/// Every peer id `p`'s DHT finds near its own id (the whole swarm when it is small).
template <class Peer>
std::set<crypto::peer_id> found_by(Peer& p, std::size_t count) {
    std::set<crypto::peer_id> out;
    for (const auto& c : p.dht().find_nearest(p.dht().id(), count))
        out.insert(c.peer);
    return out;
}

/// The message of the std::system_error `f` throws, and its code.
template <class F>
std::pair<std::error_code, std::string> thrown(F f) {
    try {
        f();
    } catch (const std::system_error& e) {
        return {e.code(), e.what()};
    }
    FAIL("no std::system_error was thrown");
    return {};
}

peer_options loopback_options() {
    peer_options o;
    o.listen = {"/ip4/127.0.0.1/tcp/0"};
    o.bootstrap_timeout = 2s;
    o.dht.maintenance_period = 0s; // nothing in the background the tests do not ask for
    return o;
}

} // namespace

TEST_CASE("a peer listens where it is told and names itself in its addresses", "[peer]") {
    peer first(loopback_options());
    const auto addresses = first.addresses();
    REQUIRE(addresses.size() == 1);
    const auto address = net::peer_address::from_string(addresses.front());
    CHECK(address.proto == net::peer_address::protocol::ip4);
    CHECK(address.host == "127.0.0.1");
    CHECK(address.port != 0); // port 0 resolved to the real one
    REQUIRE(address.peer);
    CHECK(*address.peer == first.id());
    REQUIRE(first.announce_endpoint());
    CHECK(first.announce_endpoint()->port() == address.port);
}

TEST_CASE("a peer on every interface gives a dialable address for each", "[peer]") {
    auto o = loopback_options();
    o.listen = {"/ip4/0.0.0.0/tcp/0"};
    peer any(o);
    const auto addresses = any.addresses();
    REQUIRE_FALSE(addresses.empty());
    for (const auto& text : addresses) {
        const auto a = net::peer_address::from_string(text);
        CHECK(a.host != "0.0.0.0");
        CHECK(a.port != 0);
    }
    // Loopback is among them, and a peer bootstraps through it.
    auto o2 = loopback_options();
    o2.initial_peers = {"/ip4/127.0.0.1/tcp/" + std::to_string(any.announce_endpoint()->port()) +
                        "/p2p/" + any.id().to_string()};
    peer second(o2);
    CHECK(found_by(second, 4).contains(any.id()));
}

TEST_CASE("eight peers started from one address all find each other", "[peer]") {
    std::deque<peer> swarm;
    swarm.emplace_back(loopback_options());
    const std::string entry = swarm.front().addresses().front();
    for (int i = 1; i < 8; ++i) {
        auto o = loopback_options();
        o.initial_peers = {entry};
        swarm.emplace_back(o);
    }
    for (auto& p : swarm) {
        const auto found = found_by(p, 16);
        for (auto& other : swarm)
            if (&other != &p) CHECK(found.contains(other.id()));
    }
}

TEST_CASE("a client peer asks the swarm but serves nothing", "[peer]") {
    peer server(loopback_options());
    auto o = loopback_options();
    o.client_mode = true;
    o.initial_peers = server.addresses();
    peer client(o);
    CHECK(client.addresses().empty());
    CHECK_FALSE(client.announce_endpoint());
    const auto expiration = wall_clock().now() + 60s;
    CHECK(client.dht().store(as_bytes("key"), as_bytes("value"), expiration).replicas == 1);
    const auto entry = server.dht().get(as_bytes("key"));
    REQUIRE(entry);
    REQUIRE(entry->plain);
    CHECK(entry->plain->value == to_buffer(as_bytes("value")));
    CHECK_FALSE(found_by(server, 4).contains(client.id()));
}

TEST_CASE("a peer keeps its identity in the file it is given", "[peer]") {
    const auto dir =
        std::filesystem::temp_directory_path() / ("hivemesh-peer-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    auto o = loopback_options();
    o.identity_path = (dir / "identity.key").string();
    crypto::peer_id first_id;
    {
        peer p(o);
        first_id = p.id();
    }
    peer again(o);
    CHECK(again.id() == first_id);
    std::filesystem::remove_all(dir);
}

TEST_CASE("bad options are refused with a message that names them", "[peer]") {
    SECTION("a malformed listen address") {
        auto o = loopback_options();
        o.listen = {"/ip4/127.0.0.1/udp/0"};
        const auto [ec, what] = thrown([&] { peer p(o); });
        CHECK(ec == errc::invalid_argument);
        CHECK_THAT(what, Catch::Contains("listen address") && Catch::Contains("/udp/0"));
    }
    SECTION("an initial peer without its PeerId") {
        auto o = loopback_options();
        o.initial_peers = {"/ip4/127.0.0.1/tcp/4242"};
        const auto [ec, what] = thrown([&] { peer p(o); });
        CHECK(ec == errc::invalid_argument);
        CHECK_THAT(what, Catch::Contains("lacks /p2p/<PeerId>"));
    }
    SECTION("a DNS name, which a TCP peer does not resolve") {
        auto o = loopback_options();
        o.initial_peers = {"/dns/example.org/tcp/4242/p2p/" +
                           test::identity_of(1).id().to_string()};
        const auto [ec, what] = thrown([&] { peer p(o); });
        CHECK(ec == errc::invalid_argument);
        CHECK_THAT(what, Catch::Contains("not an address of this transport"));
    }
    SECTION("no io thread") {
        auto o = loopback_options();
        o.io_threads = 0;
        CHECK(thrown([&] { peer p(o); }).first == errc::invalid_argument);
    }
    SECTION("a negative or non-finite rate cap") {
        auto o = loopback_options();
        o.rpc.max_upload_rate = -1;
        auto [ec, what] = thrown([&] { peer p(o); });
        CHECK(ec == errc::invalid_argument);
        CHECK_THAT(what, Catch::Contains("rpc.max_upload_rate"));
        o = loopback_options();
        o.rpc.max_download_rate = std::numeric_limits<double>::infinity();
        std::tie(ec, what) = thrown([&] { peer p(o); });
        CHECK(ec == errc::invalid_argument);
        CHECK_THAT(what, Catch::Contains("rpc.max_download_rate"));
    }
}

TEST_CASE("an unreachable bootstrap peer fails the start-up and says why", "[peer]") {
    // A port nobody listens on: a peer that started and stopped leaves its port free.
    std::string gone;
    {
        peer p(loopback_options());
        gone = p.addresses().front();
    }
    auto o = loopback_options();
    o.initial_peers = {gone};
    o.bootstrap_timeout = 1s;
    const auto [ec, what] = thrown([&] { peer p(o); });
    CHECK(ec == errc::no_peers);
    CHECK_THAT(what,
               Catch::Contains(gone) && Catch::Contains(make_error_code(errc::refused).message()));
}

TEST_CASE("a peer with another swarm key cannot join, and is told so", "[peer]") {
    auto o = loopback_options();
    o.swarm_key = "the right secret";
    peer keyed(o);
    SECTION("the same key joins") {
        auto same = o;
        same.initial_peers = keyed.addresses();
        peer p(same);
        CHECK(found_by(p, 4).contains(keyed.id()));
    }
    SECTION("another key does not") {
        auto other = o;
        other.swarm_key = "another secret";
        other.initial_peers = keyed.addresses();
        other.bootstrap_timeout = 1s;
        const auto [ec, what] = thrown([&] { peer p(other); });
        CHECK(ec == errc::no_peers);
        CHECK_THAT(what, Catch::Contains(make_error_code(errc::handshake_failed).message()));
    }
    SECTION("no key does not") {
        auto none = loopback_options();
        none.initial_peers = keyed.addresses();
        none.bootstrap_timeout = 1s;
        CHECK(thrown([&] { peer p(none); }).first == errc::no_peers);
    }
}

TEST_CASE("destroying a peer with calls in flight ends them after the drain deadline",
          "[peer][shutdown]") {
    peer server(loopback_options());
    // A handler that would answer only after a minute.
    server.rpc().add_handler(
        "test.slow",
        [](const net::call_context&, byte_view, byte_buffer&) -> asio::awaitable<std::error_code> {
            asio::steady_timer timer(co_await asio::this_coro::executor);
            timer.expires_after(60s);
            co_await timer.async_wait(default_token_t{});
            co_return std::error_code{};
        });
    auto o = loopback_options();
    o.initial_peers = server.addresses();
    auto caller = std::make_unique<peer>(o);
    std::promise<std::error_code> outcome;
    auto result = outcome.get_future();
    caller->rpc().async_call(
        {server.id(), *server.announce_endpoint()}, "test.slow", {}, 120s,
        [&outcome](std::error_code ec, byte_buffer) { outcome.set_value(ec); });
    std::this_thread::sleep_for(200ms); // the call reaches the server
    const auto start = std::chrono::steady_clock::now();
    caller.reset();
    const auto took = std::chrono::steady_clock::now() - start;
    // The bound is far above what closing takes (the drain deadline, 2 s); it catches a
    // destructor that waits for the call's timeout (two minutes) instead of ending the call.
    CHECK(took < 5s);
    REQUIRE(result.wait_for(0s) == std::future_status::ready);
    const auto ec = result.get();
    CHECK((ec == errc::connection_closed || ec == errc::cancelled));
}

TEST_CASE("a peer destroyed while it serves a call answers it first", "[peer][shutdown]") {
    auto server = std::make_unique<peer>(loopback_options());
    std::promise<void> started;
    server->rpc().add_handler(
        "test.brief",
        [&started](const net::call_context&, byte_view request,
                   byte_buffer& response) -> asio::awaitable<std::error_code> {
            started.set_value();
            asio::steady_timer timer(co_await asio::this_coro::executor);
            timer.expires_after(300ms);
            co_await timer.async_wait(default_token_t{});
            response.assign(request.begin(), request.end());
            co_return std::error_code{};
        });
    auto o = loopback_options();
    o.initial_peers = server->addresses();
    peer caller(o);
    std::promise<std::pair<std::error_code, byte_buffer>> outcome;
    auto result = outcome.get_future();
    const byte_buffer request{std::byte{1}, std::byte{2}, std::byte{3}};
    caller.rpc().async_call({server->id(), *server->announce_endpoint()}, "test.brief", request,
                            60s, [&outcome](std::error_code ec, byte_buffer response) {
                                outcome.set_value({ec, std::move(response)});
                            });
    started.get_future().wait();
    server.reset(); // drains: the call in flight is answered before the connection closes
    REQUIRE(result.wait_for(10s) == std::future_status::ready);
    const auto [ec, response] = result.get();
    CHECK_FALSE(ec);
    CHECK(response == request);
}

TEST_CASE("peers on the simulated network bootstrap through the same code", "[peer][sim]") {
    asio::io_context io;
    net::sim::network network(io, 7);
    using sim_peer = basic_peer<net::sim::transport>;
    std::deque<sim_peer> swarm;
    constexpr int count = 40;
    for (int i = 0; i < count; ++i) {
        const auto node = network.add_node();
        peer_options o;
        o.listen = {"/sim/" + std::to_string(node) + "/port/0"};
        if (i > 0) o.initial_peers = {swarm.front().addresses().front()};
        o.dht.maintenance_period = 0s;
        swarm.emplace_back(net::sim::transport(network, node), o,
                           test::identity_of(static_cast<std::uint8_t>(i + 1)));
    }
    CHECK(swarm.front().addresses().front().starts_with("/sim/0/port/"));
    int bootstrapped = 0;
    for (std::size_t i = 0; i < swarm.size(); ++i) {
        swarm[i].async_bootstrap([&](std::error_code ec, std::string why) {
            CHECK_FALSE(ec);
            CHECK(why.empty());
            ++bootstrapped;
        });
        network.time().run_until([&] { return bootstrapped == static_cast<int>(i + 1); }, 60s);
    }
    REQUIRE(bootstrapped == count);
    // Every peer finds its 20 nearest through the DHT, as it would over TCP.
    int answered = 0;
    for (auto& p : swarm)
        p.dht().async_find_nearest(p.dht().id(), 20, [&](std::error_code ec, const auto& contacts) {
            CHECK_FALSE(ec);
            CHECK(contacts.size() == 20);
            ++answered;
        });
    network.time().run_until([&] { return answered == count; }, 60s);
    CHECK(answered == count);
}

TEST_CASE("a sim peer whose initial peer never answers reports it after the timeout",
          "[peer][sim]") {
    asio::io_context io;
    net::sim::network network(io, 8);
    const auto silent = network.add_node(); // no one listens there
    const auto node = network.add_node();
    peer_options o;
    o.listen = {"/sim/" + std::to_string(node) + "/port/0"};
    o.initial_peers = {"/sim/" + std::to_string(silent) + "/port/9/p2p/" +
                       test::identity_of(9).id().to_string()};
    o.bootstrap_timeout = 20s;
    basic_peer<net::sim::transport> p(net::sim::transport(network, node), o, test::identity_of(1));
    std::optional<std::error_code> result;
    std::string why;
    const time_point start = network.time().now();
    p.async_bootstrap([&](std::error_code ec, std::string text) {
        result = ec;
        why = std::move(text);
    });
    network.time().run_until([&] { return result.has_value(); }, 120s);
    REQUIRE(result);
    CHECK(*result == errc::no_peers);
    CHECK_THAT(why, Catch::Contains(o.initial_peers.front()));
    CHECK(network.time().now() - start >= 16s); // it retried until near the deadline
}
