// Tests of the simulated network transport: virtual time, timers, streams over links with
// latency, bandwidth and loss, backpressure, partitions, crashes, determinism and scale.
#include "support/bytes.hpp"
#include "support/errors.hpp"

#include <hivemesh/core/random.hpp>
#include <hivemesh/net/sim.hpp>

#include <catch2/catch.hpp>

#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/awaitable_operators.hpp>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace sim = hivemesh::net::sim;
using namespace std::chrono_literals;
using hivemesh::duration;
using hivemesh::time_point;
using hivemesh::test::random_bytes;

static_assert(hivemesh::clock_like<sim::clock>);
static_assert(std::is_same_v<sim::transport::stream_type, sim::stream>);
static_assert(std::is_same_v<sim::transport::listener_type, sim::listener>);
static_assert(std::is_same_v<sim::transport::timer_type, sim::timer>);
static_assert(std::is_same_v<sim::transport::clock_type, sim::clock>);
static_assert(std::is_same_v<sim::transport::endpoint_type, sim::endpoint>);
static_assert(std::is_nothrow_move_constructible_v<sim::stream>);
static_assert(std::is_nothrow_move_constructible_v<sim::listener>);
static_assert(!std::is_copy_constructible_v<sim::stream>);
static_assert(std::is_same_v<sim::transport::datagram_socket_type, sim::datagram_socket>);
static_assert(std::is_nothrow_move_constructible_v<sim::datagram_socket>);
static_assert(!std::is_copy_constructible_v<sim::datagram_socket>);

namespace {

constexpr auto tuple_awaitable = asio::experimental::as_tuple(asio::use_awaitable);

// Spawns a coroutine whose exceptions (failed REQUIREs included) escape the run loop.
template <class Awaitable>
void spawn(const asio::any_io_executor& executor, Awaitable&& awaitable) {
    asio::co_spawn(executor, std::forward<Awaitable>(awaitable), [](std::exception_ptr e) {
        if (e) std::rethrow_exception(e);
    });
}

// An io_context with a network on it; the io_context outlives the network.
struct simulation {
    explicit simulation(std::uint64_t seed = 1, const sim::network_config& config = {})
        : net(io, seed, config)
        , time(net.time())
        , start(time.now()) {}

    duration elapsed() const { return time.now() - start; }

    asio::io_context io;
    sim::network net;
    sim::virtual_time& time;
    time_point start;
};

struct stream_pair {
    sim::stream dialer;
    sim::stream acceptor;
};

// Connects `from` to a fresh listener on `to` and runs until both ends exist.
stream_pair connect(simulation& s, sim::node_id from, sim::node_id to) {
    auto listener = s.net.listen(to, 0);
    std::optional<sim::stream> dialer, acceptor;
    s.net.async_connect(from, {to, listener.local_port()}, [&](std::error_code ec, sim::stream st) {
        REQUIRE_FALSE(ec);
        dialer.emplace(std::move(st));
    });
    listener.async_accept([&](std::error_code ec, sim::stream st) {
        REQUIRE_FALSE(ec);
        acceptor.emplace(std::move(st));
    });
    s.time.run();
    REQUIRE(dialer);
    REQUIRE(acceptor);
    return {std::move(*dialer), std::move(*acceptor)};
}

} // namespace

// ------------------------------------------------------------------------------------
// Virtual time

TEST_CASE("virtual time fires timers in expiry order, ties in creation order", "[net][sim][time]") {
    asio::io_context io;
    auto& time = asio::use_service<sim::virtual_time>(io);
    const auto start = time.now();
    CHECK(start == sim::virtual_time::default_epoch);
    CHECK(hivemesh::to_seconds(start) == 1767225600.0); // 2026-01-01T00:00:00Z

    const duration delays[] = {30ms, 10ms, 20ms, 10ms, 0ms};
    std::vector<std::pair<int, time_point>> fired;
    std::vector<std::unique_ptr<sim::timer>> timers;
    for (int i = 0; i < 5; ++i) {
        auto t = std::make_unique<sim::timer>(io.get_executor());
        t->expires_after(delays[i]);
        CHECK(t->expiry() == start + delays[i]);
        t->async_wait([&fired, &time, i](std::error_code ec) {
            CHECK_FALSE(ec);
            fired.emplace_back(i, time.now());
        });
        timers.push_back(std::move(t));
    }
    CHECK(fired.empty()); // never completed inline
    CHECK(time.pending() == 5);
    time.run();
    const std::vector<std::pair<int, time_point>> expected = {
        {4, start}, {1, start + 10ms}, {3, start + 10ms}, {2, start + 20ms}, {0, start + 30ms}};
    CHECK(fired == expected);
    CHECK(time.now() == start + 30ms);
    CHECK(time.pending() == 0);

    // An expiry in the past completes at the current instant.
    sim::timer late(io.get_executor(), start);
    bool late_fired = false;
    late.async_wait([&](std::error_code ec) { late_fired = !ec; });
    time.run();
    CHECK(late_fired);
    CHECK(time.now() == start + 30ms);
}

TEST_CASE("virtual time can start at a chosen instant", "[net][sim][time]") {
    asio::io_context io;
    auto& time = sim::virtual_time::install(io, time_point{100s});
    CHECK(&asio::use_service<sim::virtual_time>(io) == &time);
    CHECK(time.now() == time_point{100s});
    CHECK_THROWS_AS(sim::virtual_time::install(io, time_point{}), asio::service_already_exists);

    const sim::clock clock(io.get_executor());
    sim::timer t(io.get_executor(), 250ms);
    t.async_wait([](std::error_code) {});
    time.run();
    CHECK(clock.now() == time_point{100250ms});
}

TEST_CASE("timer cancel, re-arming and destruction abort pending waits", "[net][sim][time]") {
    asio::io_context io;
    auto& time = asio::use_service<sim::virtual_time>(io);
    const auto start = time.now();
    std::vector<std::pair<std::string, std::error_code>> results;
    auto record = [&results](std::string name) {
        return [&results, name](std::error_code ec) { results.emplace_back(name, ec); };
    };
    const std::error_code aborted = asio::error::operation_aborted;

    sim::timer a(io), b(io);
    a.expires_after(1s);
    b.expires_after(1s);
    a.async_wait(record("a1"));
    a.async_wait(record("a2"));
    b.async_wait(record("b1"));
    CHECK(a.cancel() == 2);
    CHECK(a.cancel() == 0);
    CHECK(results.empty()); // posted, not invoked inline
    time.poll();
    CHECK(results == decltype(results){{"a1", aborted}, {"a2", aborted}});
    CHECK(time.now() == start);

    CHECK(b.expires_after(2s) == 1); // re-arming cancels
    b.async_wait(record("b2"));
    {
        sim::timer doomed(io.get_executor());
        doomed.expires_after(5s);
        doomed.async_wait(record("doomed"));
    }
    time.run();
    CHECK(results == decltype(results){{"a1", aborted},
                                       {"a2", aborted},
                                       {"b1", aborted},
                                       {"doomed", aborted},
                                       {"b2", std::error_code()}});
    // The destroyed timer's wait left the queue, so time stopped at b's expiry.
    CHECK(time.now() == start + 2s);

    // A moved timer keeps its waits; the moved-from one has none.
    sim::timer c(io);
    c.expires_after(1s);
    c.async_wait(record("c"));
    sim::timer moved(std::move(c));
    CHECK(c.cancel() == 0);
    CHECK(moved.expiry() == start + 3s);
    time.run();
    CHECK(results.back() == std::pair<std::string, std::error_code>{"c", std::error_code()});
}

namespace {

asio::awaitable<void> race_two_timers(sim::virtual_time& time, time_point start, bool& done) {
    using namespace asio::experimental::awaitable_operators;
    const auto executor = co_await asio::this_coro::executor;
    sim::timer slow(executor), fast(executor);
    slow.expires_after(10s);
    fast.expires_after(2s);
    const auto winner =
        co_await (slow.async_wait(asio::use_awaitable) || fast.async_wait(asio::use_awaitable));
    CHECK(winner.index() == 1);
    CHECK(time.now() == start + 2s);
    done = true;
}

} // namespace

TEST_CASE("timer waits obey per-operation cancellation", "[net][sim][time]") {
    asio::io_context io;
    auto& time = asio::use_service<sim::virtual_time>(io);
    const auto start = time.now();

    SECTION("awaitable operators cancel the losing wait") {
        bool done = false;
        spawn(io.get_executor(), race_two_timers(time, start, done));
        time.run();
        CHECK(done);
        CHECK(time.now() == start + 2s); // the 10 s wait was removed, not left to expire
        CHECK(time.pending() == 0);
    }

    SECTION("a bound cancellation slot aborts the wait") {
        asio::cancellation_signal signal;
        sim::timer t(io);
        t.expires_after(1h);
        std::optional<std::error_code> result;
        t.async_wait(
            asio::bind_cancellation_slot(signal.slot(), [&](std::error_code ec) { result = ec; }));
        time.run_for(1s);
        CHECK_FALSE(result);
        signal.emit(asio::cancellation_type::terminal);
        CHECK_FALSE(result); // posted
        time.poll();
        REQUIRE(result);
        CHECK(*result == asio::error::operation_aborted);
        CHECK(time.pending() == 0);
        signal.emit(asio::cancellation_type::terminal); // after completion: harmless
        time.run();
        CHECK(time.now() == start + 1s);
    }

    SECTION("a timer made from a strand, as the RPC node does") {
        auto strand = asio::make_strand(io.get_executor());
        sim::timer t(strand);
        t.expires_after(3s);
        bool fired = false;
        t.async_wait([&](std::error_code ec) { fired = !ec; });
        time.run();
        CHECK(fired);
        CHECK(time.now() == start + 3s);
    }
}

TEST_CASE("run_until and run_for stop where told", "[net][sim][time]") {
    asio::io_context io;
    auto& time = asio::use_service<sim::virtual_time>(io);
    const auto start = time.now();
    sim::timer t(io);
    int fired = 0;
    t.expires_after(5s);
    t.async_wait([&](std::error_code ec) { fired += ec ? 0 : 1; });

    CHECK(time.run_until([&] { return fired == 1; }, 10s));
    CHECK(time.now() == start + 5s); // the instant the predicate became true
    CHECK_FALSE(time.run_until([] { return false; }, 3s));
    CHECK(time.now() == start + 8s); // a false predicate leaves the clock at the deadline
    CHECK(time.run_until([] { return true; }, 1h));
    CHECK(time.now() == start + 8s); // already true: nothing runs

    time.run_for(2s); // no events: the clock still moves
    CHECK(time.now() == start + 10s);

    t.expires_after(5s);
    t.async_wait([&](std::error_code ec) { fired += ec ? 0 : 1; });
    time.run_until(start + 12s);
    CHECK(fired == 1);
    CHECK(time.now() == start + 12s);
    time.run();
    CHECK(fired == 2);
    CHECK(time.now() == start + 15s);

    std::vector<time_point> calls;
    time.call_at(start + 20s, [&] { calls.push_back(time.now()); });
    time.call_after(1s, [&] { calls.push_back(time.now()); });
    time.run();
    CHECK(calls == std::vector<time_point>{start + 16s, start + 20s});
}

namespace {

asio::awaitable<void> tick(sim::virtual_time& time, time_point start, int ticks, int& finished,
                           int& late_ticks) {
    sim::timer t(co_await asio::this_coro::executor);
    for (int i = 1; i <= ticks; ++i) {
        t.expires_after(1s);
        co_await t.async_wait(asio::use_awaitable);
        if (time.now() != start + i * 1s) ++late_ticks;
    }
    ++finished;
}

} // namespace

TEST_CASE("an hour of virtual timers runs at once", "[net][sim][time]") {
    asio::io_context io;
    auto& time = asio::use_service<sim::virtual_time>(io);
    const auto start = time.now();
    constexpr int tickers = 100;
    int finished = 0;
    int late_ticks = 0;
    for (int i = 0; i < tickers; ++i)
        spawn(io.get_executor(), tick(time, start, 3600, finished, late_ticks));
    time.run();
    CHECK(finished == tickers);
    CHECK(late_ticks == 0);
    CHECK(time.now() == start + 1h);
}

// ------------------------------------------------------------------------------------
// Streams

namespace {

asio::awaitable<void> send_all(sim::stream& s, const std::vector<hivemesh::byte_buffer>& messages) {
    for (const auto& m : messages)
        co_await asio::async_write(s, asio::buffer(m), asio::use_awaitable);
    s.shutdown(asio::socket_base::shutdown_send);
}

asio::awaitable<void> receive_all(sim::stream& s,
                                  const std::vector<hivemesh::byte_buffer>& messages, int& matching,
                                  bool& saw_eof) {
    for (const auto& expected : messages) {
        hivemesh::byte_buffer got(expected.size());
        co_await asio::async_read(s, asio::buffer(got), asio::use_awaitable);
        matching += got == expected ? 1 : 0;
    }
    std::array<char, 16> extra{};
    auto [ec, n] = co_await s.async_read_some(asio::buffer(extra), tuple_awaitable);
    saw_eof = ec == asio::error::eof && n == 0;
}

asio::awaitable<void> accept_one(sim::listener& l, std::optional<sim::stream>& out) {
    out.emplace(co_await l.async_accept(asio::use_awaitable));
}

asio::awaitable<void> dial_one(sim::transport& t, sim::endpoint to,
                               std::optional<sim::stream>& out) {
    out.emplace(co_await t.async_connect(to, asio::use_awaitable));
}

} // namespace

TEST_CASE("streams deliver exact bytes both ways through async_read and async_write",
          "[net][sim][stream]") {
    sim::network_config config;
    config.default_link = {20ms, 10'000'000, 0.0};
    simulation s(1, config);
    const auto a = s.net.add_node();
    const auto b = s.net.add_node();
    sim::transport ta(s.net, a), tb(s.net, b);

    auto l = tb.listen(0);
    CHECK(l.is_open());
    CHECK(l.local_endpoint() == sim::endpoint{b, sim::detail::node_state::first_ephemeral_port});
    std::error_code ec;
    auto duplicate = tb.listen(l.local_port(), ec);
    CHECK(ec == asio::error::address_in_use);
    CHECK_FALSE(duplicate.is_open());
    ta.listen(sim::endpoint{b, 80}, ec);
    CHECK(ec == std::error_code(EADDRNOTAVAIL, asio::error::get_system_category()));

    std::optional<sim::stream> client, server;
    spawn(ta.executor(), dial_one(ta, l.local_endpoint(), client));
    spawn(tb.executor(), accept_one(l, server));
    s.time.run();
    REQUIRE(client);
    REQUIRE(server);
    CHECK(client->local_node() == a);
    CHECK(client->remote_endpoint() == l.local_endpoint());
    CHECK(server->remote_endpoint() == client->local_endpoint());

    hivemesh::random_generator random(42);
    std::vector<hivemesh::byte_buffer> to_server, to_client;
    for (int i = 0; i < 24; ++i) {
        to_server.push_back(random_bytes(random, 1 + random.uniform(300'000)));
        to_client.push_back(random_bytes(random, 1 + random.uniform(300'000)));
    }
    int server_matching = 0, client_matching = 0;
    bool server_eof = false, client_eof = false;
    spawn(ta.executor(), send_all(*client, to_server));
    spawn(tb.executor(), send_all(*server, to_client));
    spawn(tb.executor(), receive_all(*server, to_server, server_matching, server_eof));
    spawn(ta.executor(), receive_all(*client, to_client, client_matching, client_eof));
    s.time.run();
    CHECK(server_matching == 24);
    CHECK(client_matching == 24);
    CHECK(server_eof);
    CHECK(client_eof);
    std::uint64_t total = 0;
    for (std::size_t i = 0; i < to_server.size(); ++i)
        total += to_server[i].size() + to_client[i].size();
    CHECK(s.net.statistics().bytes_delivered == total);
    CHECK(s.net.statistics().segments_lost == 0);
}

TEST_CASE("arrival time is latency plus serialisation at the bottleneck", "[net][sim][stream]") {
    sim::network_config config;
    config.default_link = {50ms, 1'000'000, 0.0}; // 1 MB/s: 1 byte per microsecond
    simulation s(1, config);
    const auto a = s.net.add_node();
    const auto b = s.net.add_node();

    // Connection set-up: the acceptor's side after one latency, the dialer's after two.
    auto l = s.net.listen(b, 7);
    std::optional<time_point> accepted_at, connected_at;
    std::optional<sim::stream> client, server;
    s.net.async_connect(a, {b, 7}, [&](std::error_code ec, sim::stream st) {
        REQUIRE_FALSE(ec);
        connected_at = s.time.now();
        client.emplace(std::move(st));
    });
    l.async_accept([&](std::error_code ec, sim::stream st) {
        REQUIRE_FALSE(ec);
        accepted_at = s.time.now();
        server.emplace(std::move(st));
    });
    s.time.run();
    REQUIRE(server);
    CHECK(accepted_at == s.start + 50ms);
    CHECK(connected_at == s.start + 100ms);

    hivemesh::random_generator random(3);
    const auto small = random_bytes(random, 10'000);
    hivemesh::byte_buffer got(small.size());
    std::optional<time_point> read_at;
    const auto t1 = s.time.now();
    asio::async_read(*server, asio::buffer(got), [&](std::error_code ec, std::size_t n) {
        CHECK_FALSE(ec);
        CHECK(n == small.size());
        read_at = s.time.now();
    });
    asio::async_write(*client, asio::buffer(small),
                      [](std::error_code ec, std::size_t) { CHECK_FALSE(ec); });
    s.time.run();
    CHECK(read_at == t1 + 10ms + 50ms); // 10,000 bytes at 1 MB/s, then the latency
    CHECK(got == small);

    // 100,000 bytes are two segments, 65,536 + 34,464 bytes, sent back to back.
    const auto large = random_bytes(random, 100'000);
    hivemesh::byte_buffer first(large.size());
    std::vector<std::pair<std::size_t, time_point>> reads;
    const auto t2 = s.time.now();
    server->async_read_some(asio::buffer(first), [&](std::error_code ec, std::size_t n) {
        CHECK_FALSE(ec);
        reads.emplace_back(n, s.time.now());
        asio::async_read(*server, asio::buffer(first.data() + n, first.size() - n),
                         [&](std::error_code ec2, std::size_t n2) {
                             CHECK_FALSE(ec2);
                             reads.emplace_back(n2, s.time.now());
                         });
    });
    asio::async_write(*client, asio::buffer(large), [](std::error_code, std::size_t) {});
    s.time.run();
    const std::vector<std::pair<std::size_t, time_point>> expected = {
        {65'536, t2 + 65'536us + 50ms}, {34'464, t2 + 100ms + 50ms}};
    CHECK(reads == expected);
    CHECK(first == large);
}

TEST_CASE("node upload and download caps are shared by all connections", "[net][sim][stream]") {
    sim::network_config config;
    config.default_link = {10ms, 0, 0.0};
    simulation s(1, config);
    const auto a = s.net.add_node();
    const auto b = s.net.add_node();
    const auto c = s.net.add_node();
    const auto d = s.net.add_node();
    hivemesh::random_generator random(5);
    const auto payload = random_bytes(random, 65'536);

    struct arrival {
        hivemesh::byte_buffer bytes = hivemesh::byte_buffer(65'536);
        std::optional<time_point> at;
    };
    auto expect = [&](sim::stream& reader, arrival& into) {
        asio::async_read(reader, asio::buffer(into.bytes), [&](std::error_code ec, std::size_t) {
            CHECK_FALSE(ec);
            into.at = s.time.now();
        });
    };

    SECTION("upload: a's two connections take turns on its 1 MB/s uplink") {
        s.net.set_node_bandwidth(a, 1'000'000, 0);
        auto ab = connect(s, a, b);
        auto ac = connect(s, a, c);
        arrival at_b, at_c;
        expect(ab.acceptor, at_b);
        expect(ac.acceptor, at_c);
        const auto t = s.time.now();
        asio::async_write(ab.dialer, asio::buffer(payload), [](std::error_code, std::size_t) {});
        asio::async_write(ac.dialer, asio::buffer(payload), [](std::error_code, std::size_t) {});
        s.time.run();
        CHECK(at_b.at == t + 65'536us + 10ms);
        CHECK(at_c.at == t + 131'072us + 10ms);
        CHECK(at_b.bytes == payload);
        CHECK(at_c.bytes == payload);
    }

    SECTION("download: d's 1 MB/s downlink serves b and c in arrival order") {
        s.net.set_node_bandwidth(d, 0, 1'000'000);
        auto bd = connect(s, b, d);
        auto cd = connect(s, c, d);
        arrival from_b, from_c;
        expect(bd.acceptor, from_b);
        expect(cd.acceptor, from_c);
        const auto t = s.time.now();
        asio::async_write(bd.dialer, asio::buffer(payload), [](std::error_code, std::size_t) {});
        asio::async_write(cd.dialer, asio::buffer(payload), [](std::error_code, std::size_t) {});
        s.time.run();
        CHECK(from_b.at == t + 10ms + 65'536us);
        CHECK(from_c.at == t + 10ms + 131'072us);
        CHECK(from_b.bytes == payload);
        CHECK(from_c.bytes == payload);
    }
}

namespace {

// Sends `data` from dialer to acceptor on a fresh simulation; returns when the last byte was
// read, the bytes read, and the network statistics.
struct transfer_result {
    duration took{};
    hivemesh::byte_buffer received;
    sim::network_statistics stats;
};

transfer_result transfer(std::uint64_t seed, const sim::link_properties& link,
                         const hivemesh::byte_buffer& data) {
    sim::network_config config;
    config.default_link = link;
    simulation s(seed, config);
    const auto a = s.net.add_node();
    const auto b = s.net.add_node();
    auto pair = connect(s, a, b);
    transfer_result result;
    result.received.resize(data.size());
    const auto t = s.time.now();
    asio::async_read(pair.acceptor, asio::buffer(result.received),
                     [&](std::error_code ec, std::size_t) {
                         CHECK_FALSE(ec);
                         result.took = s.time.now() - t;
                     });
    asio::async_write(pair.dialer, asio::buffer(data),
                      [](std::error_code ec, std::size_t) { CHECK_FALSE(ec); });
    s.time.run();
    result.stats = s.net.statistics();
    return result;
}

} // namespace

TEST_CASE("loss adds retransmission delays but the bytes stay exact and ordered",
          "[net][sim][stream]") {
    hivemesh::random_generator random(11);
    const auto data = random_bytes(random, 2 << 20); // 32 segments of 64 KiB

    const auto clean = transfer(7, {10ms, 0, 0.0}, data);
    CHECK(clean.took == 10ms); // unlimited bandwidth: every segment leaves at once
    CHECK(clean.received == data);
    CHECK(clean.stats.segments_sent == 32);

    const auto lossy = transfer(7, {10ms, 0, 0.2}, data);
    CHECK(lossy.received == data);
    REQUIRE(lossy.stats.segments_lost > 0);
    // Every loss costs exactly one more transmission of the same segment.
    CHECK(lossy.stats.segments_sent - lossy.stats.segments_lost == 32);
    // At least one retransmission timeout (min 200 ms > 2 x RTT) delayed the end.
    CHECK(lossy.took >= 10ms + 200ms);
    CHECK(lossy.stats.bytes_delivered == data.size());
}

namespace {

asio::awaitable<void> write_until_done(sim::stream& s, const hivemesh::byte_buffer& data,
                                       std::size_t& accepted) {
    while (accepted < data.size()) {
        const auto chunk = std::min<std::size_t>(64 << 10, data.size() - accepted);
        accepted += co_await s.async_write_some(asio::buffer(data.data() + accepted, chunk),
                                                asio::use_awaitable);
    }
}

} // namespace

TEST_CASE("a writer to a peer that does not read stalls at the send buffer size",
          "[net][sim][stream]") {
    sim::network_config config;
    config.default_link = {5ms, 0, 0.0};
    config.send_buffer_size = 256 << 10;
    simulation s(1, config);
    const auto a = s.net.add_node();
    const auto b = s.net.add_node();
    auto pair = connect(s, a, b);
    hivemesh::random_generator random(9);
    const auto data = random_bytes(random, 1 << 20);
    std::size_t accepted = 0;
    spawn(s.net.get_executor(), write_until_done(pair.dialer, data, accepted));

    s.time.run_for(10s);
    CHECK(accepted == (256u << 10)); // stalled: the reader has not read anything

    hivemesh::byte_buffer got(data.size());
    bool first_read = false;
    asio::async_read(pair.acceptor, asio::buffer(got.data(), 100'000),
                     [&](std::error_code ec, std::size_t) { first_read = !ec; });
    s.time.run_for(1s);
    CHECK(first_read);
    CHECK(accepted == (256u << 10) + 100'000); // exactly what was read was refilled

    bool rest_read = false;
    asio::async_read(pair.acceptor, asio::buffer(got.data() + 100'000, got.size() - 100'000),
                     [&](std::error_code ec, std::size_t) { rest_read = !ec; });
    s.time.run();
    CHECK(rest_read);
    CHECK(accepted == data.size());
    CHECK(got == data);
}

TEST_CASE("dials are refused after one round trip and time out when nobody answers",
          "[net][sim][stream]") {
    simulation s;
    const auto a = s.net.add_node();
    const auto b = s.net.add_node();
    s.net.set_link(a, b, {30ms, 0, 0.0});
    s.net.set_link(b, a, {20ms, 0, 0.0});
    std::optional<std::pair<std::error_code, time_point>> outcome;
    auto dial = [&](sim::endpoint to, std::optional<duration> timeout = std::nullopt) {
        outcome.reset();
        auto handler = [&](std::error_code ec, sim::stream st) {
            CHECK(st.is_open() == !ec);
            outcome.emplace(ec, s.time.now());
        };
        if (timeout)
            s.net.async_connect(a, to, *timeout, handler);
        else
            s.net.async_connect(a, to, handler);
        const auto t = s.time.now();
        s.time.run();
        REQUIRE(outcome);
        return std::pair{outcome->first, outcome->second - t};
    };

    CHECK(dial({b, 9}) ==
          std::pair{std::error_code(asio::error::connection_refused), duration(50ms)});
    CHECK(s.net.statistics().connections_refused == 1);

    auto l = s.net.listen(b, 9, 1); // backlog of one
    std::optional<sim::stream> first;
    s.net.async_connect(a, {b, 9}, [&](std::error_code ec, sim::stream st) {
        CHECK_FALSE(ec);
        first.emplace(std::move(st));
    });
    s.time.run();
    REQUIRE(first);
    CHECK(dial({b, 9}).first == asio::error::connection_refused); // backlog full

    s.net.crash(b);
    CHECK_FALSE(l.is_open());
    CHECK(dial({b, 9}) == std::pair{std::error_code(asio::error::timed_out), duration(3s)});
    CHECK(dial({b, 9}, 500ms) ==
          std::pair{std::error_code(asio::error::timed_out), duration(500ms)});
    CHECK(s.net.statistics().connect_timeouts == 2);

    s.net.restart(b);
    auto again = s.net.listen(b, 9);
    s.net.partition({b});
    CHECK_FALSE(s.net.reachable(a, b));
    CHECK(dial({b, 9}) == std::pair{std::error_code(asio::error::timed_out), duration(3s)});
    s.net.heal();
    CHECK(dial({b, 9}).first == std::error_code());

    CHECK(dial({42, 1}) == std::pair{std::error_code(asio::error::host_unreachable), duration(0s)});
    s.net.crash(a);
    CHECK(dial({b, 9}).first == asio::error::network_down);
}

namespace {

asio::awaitable<void> read_counting(sim::stream& s, hivemesh::byte_buffer& into,
                                    std::size_t& received) {
    while (received < into.size()) {
        const auto n = co_await s.async_read_some(
            asio::buffer(into.data() + received, into.size() - received), asio::use_awaitable);
        received += n;
    }
}

} // namespace

TEST_CASE("a partition holds bytes in flight and healing releases them", "[net][sim][stream]") {
    sim::network_config config;
    config.default_link = {10ms, 1'000'000, 0.0};
    simulation s(1, config);
    const auto a = s.net.add_node();
    const auto b = s.net.add_node();
    auto pair = connect(s, a, b);
    hivemesh::random_generator random(13);
    const auto data = random_bytes(random, 500'000);
    hivemesh::byte_buffer got(data.size());
    std::size_t received = 0;
    spawn(s.net.get_executor(), read_counting(pair.acceptor, got, received));
    asio::async_write(pair.dialer, asio::buffer(data),
                      [](std::error_code ec, std::size_t) { CHECK_FALSE(ec); });

    s.time.run_for(200ms);
    CHECK(received > 0);
    CHECK(received < data.size());
    s.net.partition({b});
    const auto before = received;
    s.time.run_for(10s);
    CHECK(received == before); // nothing crosses
    CHECK(s.net.statistics().segments_held > 0);
    CHECK(pair.dialer.is_open());

    s.net.heal();
    s.time.run();
    CHECK(received == data.size());
    CHECK(got == data);
    CHECK(s.net.statistics().bytes_delivered == data.size());
}

TEST_CASE("a crash resets the peer and a restart makes the node reachable again",
          "[net][sim][stream]") {
    sim::network_config config;
    config.default_link = {25ms, 0, 0.0};
    simulation s(1, config);
    const auto a = s.net.add_node();
    const auto b = s.net.add_node();
    auto l = s.net.listen(b, 80);
    std::optional<sim::stream> client, server;
    s.net.async_connect(a, {b, 80}, [&](std::error_code ec, sim::stream st) {
        REQUIRE_FALSE(ec);
        client.emplace(std::move(st));
    });
    l.async_accept([&](std::error_code ec, sim::stream st) {
        REQUIRE_FALSE(ec);
        server.emplace(std::move(st));
    });
    s.time.run();
    REQUIRE(client);
    REQUIRE(server);

    std::array<char, 32> client_buffer{}, server_buffer{};
    std::optional<std::pair<std::error_code, time_point>> client_read, server_read, accept;
    client->async_read_some(asio::buffer(client_buffer), [&](std::error_code ec, std::size_t) {
        client_read.emplace(ec, s.time.now());
    });
    server->async_read_some(asio::buffer(server_buffer), [&](std::error_code ec, std::size_t) {
        server_read.emplace(ec, s.time.now());
    });
    l.async_accept([&](std::error_code ec, sim::stream) { accept.emplace(ec, s.time.now()); });
    s.time.run_for(1s);
    const auto crash_at = s.time.now();
    s.net.crash(b);
    CHECK_FALSE(s.net.is_up(b));
    CHECK_FALSE(server->is_open());
    CHECK_FALSE(l.is_open());
    s.time.run();
    const auto aborted = std::pair{std::error_code(asio::error::operation_aborted), crash_at};
    CHECK(server_read == aborted);
    CHECK(accept == aborted);
    CHECK(client_read ==
          std::pair{std::error_code(asio::error::connection_reset), crash_at + 25ms});
    CHECK(client->is_open()); // reset, not closed: its owner closes it

    std::optional<std::error_code> write_error;
    asio::async_write(*client, asio::buffer("x", 1),
                      [&](std::error_code ec, std::size_t) { write_error = ec; });
    s.time.run();
    CHECK(write_error == std::error_code(asio::error::connection_reset));

    std::optional<std::error_code> dial_error;
    s.net.async_connect(a, {b, 80}, [&](std::error_code ec, sim::stream) { dial_error = ec; });
    s.time.run();
    CHECK(dial_error == std::error_code(asio::error::timed_out));
    std::error_code listen_error;
    s.net.listen(b, 80, listen_error);
    CHECK(listen_error == asio::error::network_down);

    s.net.restart(b);
    auto pair = [&] {
        auto l2 = s.net.listen(b, 80); // same port as before the crash
        std::optional<sim::stream> c2, s2;
        s.net.async_connect(a, {b, 80}, [&](std::error_code ec, sim::stream st) {
            REQUIRE_FALSE(ec);
            c2.emplace(std::move(st));
        });
        l2.async_accept([&](std::error_code ec, sim::stream st) {
            REQUIRE_FALSE(ec);
            s2.emplace(std::move(st));
        });
        s.time.run();
        REQUIRE(c2);
        REQUIRE(s2);
        return stream_pair{std::move(*c2), std::move(*s2)};
    }();
    std::array<char, 5> hello{};
    bool hello_read = false;
    asio::async_read(pair.acceptor, asio::buffer(hello),
                     [&](std::error_code ec, std::size_t) { hello_read = !ec; });
    asio::async_write(pair.dialer, asio::buffer("hello", 5), [](std::error_code, std::size_t) {});
    s.time.run();
    CHECK(hello_read);
    CHECK(std::string(hello.data(), hello.size()) == "hello");
}

TEST_CASE("a reset across a partition waits for the partition to heal", "[net][sim][stream]") {
    sim::network_config config;
    config.default_link = {25ms, 0, 0.0};
    simulation s(1, config);
    const auto a = s.net.add_node();
    const auto b = s.net.add_node();
    auto pair = connect(s, a, b);
    std::array<char, 8> buffer{};
    std::optional<std::pair<std::error_code, time_point>> read;
    pair.dialer.async_read_some(asio::buffer(buffer), [&](std::error_code ec, std::size_t) {
        read.emplace(ec, s.time.now());
    });
    s.net.partition({b});
    s.net.crash(b);
    s.time.run_for(10s);
    CHECK_FALSE(read); // the reset cannot cross
    CHECK(pair.dialer.is_open());
    const auto healed_at = s.time.now();
    s.net.heal();
    s.time.run();
    CHECK(read == std::pair{std::error_code(asio::error::connection_reset), healed_at + 25ms});
}

namespace {

asio::awaitable<void> read_with_deadline(sim::stream& s, sim::virtual_time& time, time_point start,
                                         std::string& later) {
    using namespace asio::experimental::awaitable_operators;
    std::array<char, 64> buffer{};
    sim::timer deadline(co_await asio::this_coro::executor);
    deadline.expires_after(1s);
    const auto result = co_await (s.async_read_some(asio::buffer(buffer), asio::use_awaitable) ||
                                  deadline.async_wait(asio::use_awaitable));
    CHECK(result.index() == 1);
    CHECK(time.now() == start + 1s);
    // The cancelled read took nothing: the bytes sent at 2 s all arrive.
    const auto n = co_await s.async_read_some(asio::buffer(buffer), asio::use_awaitable);
    later.assign(buffer.data(), n);
}

} // namespace

TEST_CASE("pending reads and writes can be cancelled", "[net][sim][stream]") {
    sim::network_config config;
    config.default_link = {10ms, 0, 0.0};
    config.send_buffer_size = 1000;
    simulation s(1, config);
    const auto a = s.net.add_node();
    const auto b = s.net.add_node();
    auto pair = connect(s, a, b);
    const auto start = s.time.now();

    SECTION("a read raced against a timer") {
        std::string later;
        spawn(s.net.get_executor(), read_with_deadline(pair.acceptor, s.time, start, later));
        s.time.call_at(start + 2s, [&] {
            asio::async_write(pair.dialer, asio::buffer("late bytes", 10),
                              [](std::error_code, std::size_t) {});
        });
        s.time.run();
        CHECK(later == "late bytes");
    }

    SECTION("a write waiting for buffer space, through a cancellation slot") {
        const std::string fill(1000, 'f');
        std::size_t filled = 0;
        pair.dialer.async_write_some(asio::buffer(fill),
                                     [&](std::error_code, std::size_t n) { filled = n; });
        s.time.run();
        CHECK(filled == 1000);
        asio::cancellation_signal signal;
        std::optional<std::pair<std::error_code, std::size_t>> result;
        pair.dialer.async_write_some(
            asio::buffer("more", 4),
            asio::bind_cancellation_slot(
                signal.slot(), [&](std::error_code ec, std::size_t n) { result.emplace(ec, n); }));
        s.time.run_for(1s);
        CHECK_FALSE(result); // waiting: the buffer is full
        signal.emit(asio::cancellation_type::terminal);
        s.time.run();
        CHECK(result == std::pair{std::error_code(asio::error::operation_aborted), std::size_t{0}});
        // Nothing of the cancelled write was sent: the reader gets exactly the 1000 bytes.
        std::string got(2000, '\0');
        std::optional<std::pair<std::error_code, std::size_t>> read;
        pair.dialer.shutdown(asio::socket_base::shutdown_send);
        asio::async_read(pair.acceptor, asio::buffer(got),
                         [&](std::error_code ec, std::size_t n) { read.emplace(ec, n); });
        s.time.run();
        CHECK(read == std::pair{std::error_code(asio::error::eof), std::size_t{1000}});
    }

    SECTION("cancel() aborts both directions' pending operations") {
        std::array<char, 8> buffer{};
        std::optional<std::error_code> read;
        pair.acceptor.async_read_some(asio::buffer(buffer),
                                      [&](std::error_code ec, std::size_t) { read = ec; });
        s.time.run_for(1s);
        pair.acceptor.cancel();
        s.time.run();
        CHECK(read == std::error_code(asio::error::operation_aborted));
        CHECK(pair.acceptor.is_open());
    }
}

namespace {

// The RPC node's pattern: a dial raced against a deadline timer.
asio::awaitable<void> dial_with_deadline(sim::transport t, sim::endpoint to, duration deadline,
                                         std::optional<std::error_code>& dial_result,
                                         bool& deadline_won) {
    using namespace asio::experimental::awaitable_operators;
    sim::timer timer(asio::make_strand(t.executor()));
    timer.expires_after(deadline);
    auto result =
        co_await (t.async_connect(to, tuple_awaitable) || timer.async_wait(tuple_awaitable));
    deadline_won = result.index() == 1;
    if (result.index() == 0) dial_result = std::get<0>(std::get<0>(result));
}

} // namespace

TEST_CASE("dials and accepts obey per-operation cancellation", "[net][sim][stream]") {
    sim::network_config config;
    config.default_link = {10ms, 0, 0.0};
    simulation s(1, config);
    const auto a = s.net.add_node();
    const auto b = s.net.add_node();
    auto l = s.net.listen(b, 80);

    SECTION("a dial to a crashed node loses to the deadline and leaves nothing behind") {
        s.net.crash(b);
        std::optional<std::error_code> dial_result;
        bool deadline_won = false;
        spawn(s.net.get_executor(),
              dial_with_deadline(sim::transport(s.net, a), {b, 80}, 1s, dial_result, deadline_won));
        s.time.run();
        CHECK(deadline_won);
        CHECK_FALSE(dial_result);
        // The cancelled dial dropped its 3 s connect timeout: time stopped at the deadline.
        CHECK(s.time.now() == s.start + 1s);
        CHECK(s.net.statistics().connect_timeouts == 0);
    }

    SECTION("a dial that answers first wins the race") {
        std::optional<std::error_code> dial_result;
        bool deadline_won = false;
        spawn(s.net.get_executor(),
              dial_with_deadline(sim::transport(s.net, a), {b, 80}, 1s, dial_result, deadline_won));
        std::optional<sim::stream> accepted;
        l.async_accept([&](std::error_code ec, sim::stream st) {
            CHECK_FALSE(ec);
            accepted.emplace(std::move(st));
        });
        s.time.run();
        CHECK_FALSE(deadline_won);
        CHECK(dial_result == std::error_code());
        CHECK(accepted);
        // Not 1 s: the losing timer was cancelled. The dialer's stream closed when the
        // coroutine ended at 20 ms, and its FIN reached the acceptor one latency later.
        CHECK(s.time.now() == s.start + 30ms);
    }

    SECTION("an accept cancelled through its slot") {
        asio::cancellation_signal signal;
        std::optional<std::error_code> accept;
        l.async_accept(
            asio::bind_cancellation_slot(signal.slot(), [&](std::error_code ec, sim::stream st) {
                CHECK_FALSE(st.is_open());
                accept = ec;
            }));
        s.time.run_for(1s);
        CHECK_FALSE(accept);
        signal.emit(asio::cancellation_type::terminal);
        s.time.run();
        CHECK(accept == std::error_code(asio::error::operation_aborted));
        CHECK(l.is_open()); // cancelling an accept does not close the listener
    }
}

TEST_CASE("shutdown, close and reset semantics", "[net][sim][stream]") {
    sim::network_config config;
    config.default_link = {10ms, 0, 0.0};
    simulation s(1, config);
    const auto a = s.net.add_node();
    const auto b = s.net.add_node();
    auto pair = connect(s, a, b);
    auto& client = pair.dialer;
    auto& server = pair.acceptor;
    using result = std::optional<std::pair<std::error_code, std::size_t>>;
    auto into = [](result& r) {
        return [&r](std::error_code ec, std::size_t n) { r.emplace(ec, n); };
    };
    const std::error_code ok;

    SECTION("zero-length operations complete at once without error") {
        result read, write;
        client.async_read_some(asio::mutable_buffer(), into(read));
        client.async_write_some(asio::const_buffer(), into(write));
        CHECK_FALSE(read); // posted, not inline
        s.time.poll();
        CHECK(read == std::pair{ok, std::size_t{0}});
        CHECK(write == std::pair{ok, std::size_t{0}});
    }

    SECTION("a second pending read is refused") {
        std::array<char, 4> b1{}, b2{};
        result first, second;
        client.async_read_some(asio::buffer(b1), into(first));
        client.async_read_some(asio::buffer(b2), into(second));
        s.time.run_for(1s);
        CHECK_FALSE(first);
        CHECK(second == std::pair{std::error_code(asio::error::already_started), std::size_t{0}});
        client.cancel();
        s.time.run();
    }

    SECTION("shutdown(send): the peer reads the bytes then eof; later writes fail") {
        result write;
        asio::async_write(client, asio::buffer("abc", 3), into(write));
        client.shutdown(asio::socket_base::shutdown_send);
        std::array<char, 16> got{};
        result read;
        asio::async_read(server, asio::buffer(got), into(read));
        s.time.run();
        CHECK(write == std::pair{ok, std::size_t{3}});
        CHECK(read == std::pair{std::error_code(asio::error::eof), std::size_t{3}});
        result late;
        client.async_write_some(asio::buffer("d", 1), into(late));
        s.time.run();
        CHECK(late == std::pair{std::error_code(asio::error::broken_pipe), std::size_t{0}});
        // The other direction still works.
        result back;
        asio::async_write(server, asio::buffer("xyz", 3), into(back));
        std::array<char, 3> reply{};
        result reply_read;
        asio::async_read(client, asio::buffer(reply), into(reply_read));
        s.time.run();
        CHECK(reply_read == std::pair{ok, std::size_t{3}});
    }

    SECTION("close: local operations abort, the peer gets in-flight bytes then eof") {
        std::array<char, 16> server_buffer{};
        result server_read;
        server.async_read_some(asio::buffer(server_buffer), into(server_read));
        result write;
        asio::async_write(server, asio::buffer("bye", 3), into(write));
        s.time.poll(); // the write is accepted
        server.close();
        CHECK_FALSE(server.is_open());
        s.time.run();
        CHECK(server_read ==
              std::pair{std::error_code(asio::error::operation_aborted), std::size_t{0}});
        result after;
        server.async_read_some(asio::buffer(server_buffer), into(after));
        s.time.run();
        CHECK(after == std::pair{std::error_code(asio::error::bad_descriptor), std::size_t{0}});

        std::array<char, 16> client_buffer{};
        result client_read;
        asio::async_read(client, asio::buffer(client_buffer), into(client_read));
        s.time.run();
        CHECK(client_read == std::pair{std::error_code(asio::error::eof), std::size_t{3}});
        CHECK(std::string(client_buffer.data(), 3) == "bye");

        // Bytes sent to the closed end are answered with a reset, one round trip later.
        const auto t = s.time.now();
        result sent;
        client.async_write_some(asio::buffer("ping", 4), into(sent));
        s.time.run();
        CHECK(sent == std::pair{ok, std::size_t{4}});
        std::optional<time_point> reset_at;
        result reset;
        client.async_read_some(asio::buffer(client_buffer), [&](std::error_code ec, std::size_t n) {
            reset.emplace(ec, n);
            reset_at = s.time.now();
        });
        s.time.run();
        CHECK(reset == std::pair{std::error_code(asio::error::connection_reset), std::size_t{0}});
        CHECK(reset_at == t + 20ms);
        CHECK(s.net.statistics().resets == 1);
    }

    SECTION("a stream that was never connected") {
        sim::stream lone(s.net.get_executor());
        CHECK_FALSE(lone.is_open());
        CHECK_THROWS_AS(lone.remote_endpoint(), std::system_error);
        std::array<char, 4> buffer{};
        result r;
        lone.async_read_some(asio::buffer(buffer), into(r));
        s.time.run();
        CHECK(r == std::pair{std::error_code(asio::error::bad_descriptor), std::size_t{0}});
    }
}

TEST_CASE("closing a listener or the network aborts what is pending", "[net][sim][stream]") {
    asio::io_context io;
    auto& time = asio::use_service<sim::virtual_time>(io);
    auto net = std::make_unique<sim::network>(io, 1);
    const auto a = net->add_node();
    const auto b = net->add_node();

    auto l = net->listen(b, 5);
    std::optional<std::error_code> accept;
    l.async_accept([&](std::error_code ec, sim::stream) { accept = ec; });
    l.close();
    time.run();
    CHECK(accept == std::error_code(asio::error::operation_aborted));
    std::error_code ec;
    auto reopened = net->listen(b, 5, ec); // the port is free again
    CHECK_FALSE(ec);

    std::optional<sim::stream> client;
    net->async_connect(a, {b, 5}, [&](std::error_code e, sim::stream st) {
        REQUIRE_FALSE(e);
        client.emplace(std::move(st));
    });
    time.run();
    REQUIRE(client);
    // Connected but never accepted: closing the listener resets it.
    std::array<char, 4> buffer{};
    std::optional<std::error_code> read;
    client->async_read_some(asio::buffer(buffer),
                            [&](std::error_code e, std::size_t) { read = e; });
    reopened.close();
    time.run();
    CHECK(read == std::error_code(asio::error::connection_reset));

    // Destroying the network completes everything still pending.
    auto l2 = net->listen(b, 6);
    std::optional<std::error_code> accept2, dial;
    l2.async_accept([&](std::error_code e, sim::stream) { accept2 = e; });
    net->async_connect(a, {b, 5}, [&](std::error_code e, sim::stream) { dial = e; });
    net.reset();
    time.run();
    CHECK(accept2 == std::error_code(asio::error::operation_aborted));
    CHECK(dial == std::error_code(asio::error::operation_aborted));
    CHECK_FALSE(l2.is_open());
    std::optional<std::error_code> after;
    client->async_read_some(asio::buffer(buffer),
                            [&](std::error_code e, std::size_t) { after = e; });
    time.run();
    CHECK(after == std::error_code(asio::error::network_down));
}

// ------------------------------------------------------------------------------------
// Datagrams

namespace {

// How a receive completed: its error, size, sender and instant, and the bytes it kept.
struct receipt {
    std::error_code ec;
    std::size_t size = 0;
    sim::endpoint from{};
    time_point at{};
    hivemesh::byte_buffer bytes;
};

// Starts one receive into a buffer of `capacity` bytes; `into` is set when it completes.
void receive_one(sim::datagram_socket& socket, sim::virtual_time& time, std::size_t capacity,
                 std::optional<receipt>& into) {
    auto buffer = std::make_shared<hivemesh::byte_buffer>(capacity);
    auto from = std::make_shared<sim::endpoint>();
    socket.async_receive_from(
        asio::buffer(*buffer), *from,
        [&time, &into, buffer, from](std::error_code ec, std::size_t n) {
            buffer->resize(n);
            into.emplace(receipt{
                .ec = ec, .size = n, .from = *from, .at = time.now(), .bytes = std::move(*buffer)});
        });
}

// Receives `count` datagrams one after the other, stopping at an error other than
// truncation.
asio::awaitable<void> receive_n(sim::datagram_socket& socket, sim::virtual_time& time, int count,
                                std::size_t capacity, std::vector<receipt>& into) {
    for (int i = 0; i < count; ++i) {
        hivemesh::byte_buffer buffer(capacity);
        sim::endpoint from;
        auto [ec, n] =
            co_await socket.async_receive_from(asio::buffer(buffer), from, tuple_awaitable);
        buffer.resize(n);
        into.push_back(receipt{
            .ec = ec, .size = n, .from = from, .at = time.now(), .bytes = std::move(buffer)});
        if (ec && ec != asio::error::message_size) co_return;
    }
}

// Sends `bytes` and checks that the send succeeded (a dropped datagram still does).
void send_checked(sim::datagram_socket& socket, const hivemesh::byte_buffer& bytes,
                  sim::endpoint to) {
    socket.async_send_to(asio::buffer(bytes), to,
                         [size = bytes.size()](std::error_code ec, std::size_t n) {
                             CHECK_FALSE(ec);
                             CHECK(n == size);
                         });
}

// Echoes `count` datagrams to their senders: a template over the transport, as the protocols
// over datagrams will be.
template <class Transport>
asio::awaitable<void> echo_datagrams(typename Transport::datagram_socket_type& socket, int count) {
    std::array<std::byte, 2048> buffer{};
    for (int i = 0; i < count; ++i) {
        typename Transport::endpoint_type from;
        auto [ec, n] =
            co_await socket.async_receive_from(asio::buffer(buffer), from, tuple_awaitable);
        if (ec) co_return;
        auto [send_error, sent] =
            co_await socket.async_send_to(asio::buffer(buffer.data(), n), from, tuple_awaitable);
        CHECK_FALSE(send_error);
        CHECK(sent == n);
    }
}

} // namespace

TEST_CASE("a datagram arrives after latency plus serialisation, from the sender's endpoint",
          "[net][sim][datagram]") {
    sim::network_config config;
    config.default_link = {50ms, 1'000'000, 0.0}; // 1 MB/s: 1 byte per microsecond
    simulation s(1, config);
    const auto a = s.net.add_node();
    const auto b = s.net.add_node();
    sim::transport ta(s.net, a), tb(s.net, b);
    auto sa = ta.open_datagram({a, 0});
    auto sb = tb.open_datagram({b, 7});
    CHECK(sa.is_open());
    CHECK(sa.local_endpoint() == sim::endpoint{a, sim::detail::node_state::first_ephemeral_port});
    CHECK(sb.local_endpoint() == sim::endpoint{b, 7});
    const std::error_code ok;

    SECTION("one datagram: sent at once, received after serialisation and latency") {
        const auto payload = random_bytes(10'000, 1);
        std::optional<receipt> got;
        receive_one(sb, s.time, 20'000, got);
        std::optional<std::pair<std::error_code, std::size_t>> sent;
        std::optional<time_point> sent_at;
        const auto t = s.time.now();
        sa.async_send_to(asio::buffer(payload), sb.local_endpoint(),
                         [&](std::error_code ec, std::size_t n) {
                             sent.emplace(ec, n);
                             sent_at = s.time.now();
                         });
        CHECK_FALSE(sent); // posted, never inline
        s.time.run();
        CHECK(sent == std::pair{ok, std::size_t{10'000}});
        CHECK(sent_at == t);
        REQUIRE(got);
        CHECK(got->ec == ok);
        CHECK(got->size == 10'000);
        CHECK(got->from == sa.local_endpoint());
        CHECK(got->at == t + 10ms + 50ms);
        CHECK(got->bytes == payload);
        const auto& stats = s.net.statistics();
        CHECK(stats.datagrams_sent == 1);
        CHECK(stats.datagrams_delivered == 1);
        CHECK(stats.datagrams_dropped == 0);
        CHECK(stats.segments_sent == 0);
    }

    SECTION("two datagrams queue on a's uplink, then on b's downlink") {
        s.net.set_default_link({10ms, 0, 0.0});
        s.net.set_node_bandwidth(a, 1'000'000, 0); // 10,000 bytes take 10 ms
        s.net.set_node_bandwidth(b, 0, 500'000);   // and 20 ms
        const auto first = random_bytes(10'000, 2);
        const auto second = random_bytes(10'000, 3);
        std::vector<receipt> got;
        spawn(s.net.get_executor(), receive_n(sb, s.time, 2, 10'000, got));
        const auto t = s.time.now();
        send_checked(sa, first, sb.local_endpoint());
        send_checked(sa, second, sb.local_endpoint());
        s.time.run();
        REQUIRE(got.size() == 2);
        // The first's bytes reach b from 10 ms on and leave its downlink at 30 ms; the
        // second's from 20 ms on, after the first's, so at 50 ms.
        CHECK(got[0].at == t + 30ms);
        CHECK(got[1].at == t + 50ms);
        CHECK(got[0].bytes == first);
        CHECK(got[1].bytes == second);
        CHECK(got[1].from == sa.local_endpoint());
    }

    SECTION("a datagram and a stream take turns on the uplink") {
        s.net.set_default_link({10ms, 0, 0.0});
        s.net.set_node_bandwidth(a, 1'000'000, 0);
        auto pair = connect(s, a, b);
        const auto datagram = random_bytes(10'000, 4);
        const auto bytes = random_bytes(10'000, 5);
        std::optional<receipt> got;
        receive_one(sb, s.time, 10'000, got);
        hivemesh::byte_buffer read(bytes.size());
        std::optional<time_point> read_at;
        asio::async_read(pair.acceptor, asio::buffer(read), [&](std::error_code ec, std::size_t) {
            CHECK_FALSE(ec);
            read_at = s.time.now();
        });
        const auto t = s.time.now();
        send_checked(sa, datagram, sb.local_endpoint());
        asio::async_write(pair.dialer, asio::buffer(bytes),
                          [](std::error_code ec, std::size_t) { CHECK_FALSE(ec); });
        s.time.run();
        REQUIRE(got);
        CHECK(got->at == t + 10ms + 10ms);
        CHECK(read_at == t + 20ms + 10ms); // behind the datagram
        CHECK(read == bytes);
    }
}

TEST_CASE("datagrams reach the socket of their node and port, and echoes come back",
          "[net][sim][datagram]") {
    simulation s;
    const auto a = s.net.add_node();
    const auto b = s.net.add_node();
    const auto c = s.net.add_node();
    s.net.set_links_between(a, b, {10ms, 0, 0.0});
    s.net.set_links_between(a, c, {30ms, 0, 0.0});
    sim::transport ta(s.net, a), tb(s.net, b), tc(s.net, c);
    auto sa = ta.open_datagram({a, 5});
    auto b1 = tb.open_datagram({b, 1});
    auto b2 = tb.open_datagram({b, 2});
    auto c1 = tc.open_datagram({c, 1});
    spawn(s.net.get_executor(), echo_datagrams<sim::transport>(b1, 1));
    spawn(s.net.get_executor(), echo_datagrams<sim::transport>(c1, 1));
    std::optional<receipt> at_b2;
    receive_one(b2, s.time, 64, at_b2);
    std::vector<receipt> echoes;
    spawn(s.net.get_executor(), receive_n(sa, s.time, 2, 64, echoes));
    const auto t = s.time.now();
    send_checked(sa, hivemesh::test::bytes_of("to c1"), {c, 1});
    send_checked(sa, hivemesh::test::bytes_of("to b1"), {b, 1});
    s.time.run();
    REQUIRE(echoes.size() == 2);
    CHECK(echoes[0].bytes == hivemesh::test::bytes_of("to b1"));
    CHECK(echoes[0].from == sim::endpoint{b, 1});
    CHECK(echoes[0].at == t + 20ms);
    CHECK(echoes[1].bytes == hivemesh::test::bytes_of("to c1"));
    CHECK(echoes[1].from == sim::endpoint{c, 1});
    CHECK(echoes[1].at == t + 60ms);
    CHECK_FALSE(at_b2); // nothing was sent to b's port 2
    CHECK(s.net.statistics().datagrams_sent == 4);
    CHECK(s.net.statistics().datagrams_delivered == 4);
    b2.close();
    s.time.run();
    REQUIRE(at_b2);
    CHECK(at_b2->ec == asio::error::operation_aborted);
}

TEST_CASE("datagram ports: port 0, address_in_use, and apart from listening ports",
          "[net][sim][datagram]") {
    sim::network_config config;
    config.default_link = {10ms, 0, 0.0};
    simulation s(1, config);
    const auto a = s.net.add_node();
    const auto b = s.net.add_node();
    sim::transport ta(s.net, a), tb(s.net, b);
    constexpr auto first_port = sim::detail::node_state::first_ephemeral_port;
    using hivemesh::test::thrown_code;

    auto l = tb.listen(0);
    auto d0 = tb.open_datagram({b, 0});
    auto d1 = tb.open_datagram({b, 0});
    CHECK(l.local_endpoint() == sim::endpoint{b, first_port});
    CHECK(d0.local_endpoint() == sim::endpoint{b, first_port}); // apart from the listener's
    CHECK(d1.local_endpoint() == sim::endpoint{b, first_port + 1});

    std::error_code ec;
    auto taken = tb.open_datagram({b, first_port}, ec);
    CHECK(ec == asio::error::address_in_use);
    CHECK_FALSE(taken.is_open());
    CHECK(thrown_code([&] { taken.local_endpoint(); }) == asio::error::bad_descriptor);
    CHECK(thrown_code([&] { tb.open_datagram({b, first_port}); }) == asio::error::address_in_use);
    ta.open_datagram({b, 9}, ec);
    CHECK(ec == std::error_code(EADDRNOTAVAIL, asio::error::get_system_category()));
    CHECK(ta.datagram_endpoint_for({b, 80}) == sim::endpoint{a, 0}); // for a client's socket

    // A listener and a datagram socket on port 80 both work.
    auto stream_80 = tb.listen(80);
    auto datagram_80 = tb.open_datagram({b, 80});
    std::optional<sim::stream> accepted;
    stream_80.async_accept([&](std::error_code e, sim::stream st) {
        CHECK_FALSE(e);
        accepted.emplace(std::move(st));
    });
    ta.async_connect({b, 80}, [](std::error_code e, sim::stream) { CHECK_FALSE(e); });
    std::optional<receipt> got;
    receive_one(datagram_80, s.time, 16, got);
    auto sa = ta.open_datagram({a, 80});
    send_checked(sa, hivemesh::test::bytes_of("udp"), {b, 80});
    s.time.run();
    CHECK(accepted);
    REQUIRE(got);
    CHECK(got->bytes == hivemesh::test::bytes_of("udp"));
    CHECK(got->from == sim::endpoint{a, 80});

    // Closing frees the port; moving keeps it; assigning over an open socket closes it.
    d0.close();
    d0.close(); // idempotent
    CHECK_FALSE(d0.is_open());
    CHECK(d0.local_endpoint() == sim::endpoint{b, first_port}); // still says where it was
    auto reopened = tb.open_datagram({b, first_port});
    CHECK(reopened.is_open());
    sim::datagram_socket moved(std::move(d1));
    CHECK_FALSE(d1.is_open()); // NOLINT(bugprone-use-after-move): moved from on purpose
    CHECK(moved.local_endpoint() == sim::endpoint{b, first_port + 1});
    moved = std::move(reopened);
    CHECK(moved.local_endpoint() == sim::endpoint{b, first_port});
    CHECK_FALSE(thrown_code([&] { tb.open_datagram({b, first_port + 1}); }));

    // A crashed node opens nothing until it restarts.
    s.net.crash(b);
    CHECK_FALSE(moved.is_open());
    CHECK_FALSE(datagram_80.is_open());
    tb.open_datagram({b, 80}, ec);
    CHECK(ec == asio::error::network_down);
    s.net.restart(b);
    CHECK(tb.open_datagram({b, 80}).is_open());
}

TEST_CASE("a datagram longer than the receive buffers is truncated with message_size",
          "[net][sim][datagram]") {
    simulation s;
    const auto a = s.net.add_node();
    const auto b = s.net.add_node();
    auto sa = s.net.open_datagram(a, 1);
    auto sb = s.net.open_datagram(b, 2);
    const std::error_code ok;
    using hivemesh::test::bytes_of;
    using result = std::optional<std::pair<std::error_code, std::size_t>>;
    auto into = [](result& r) {
        return [&r](std::error_code ec, std::size_t n) { r.emplace(ec, n); };
    };
    sim::endpoint from;

    send_checked(sa, bytes_of("0123456789"), sb.local_endpoint());
    std::array<char, 4> small{};
    result truncated;
    sb.async_receive_from(asio::buffer(small), from, into(truncated));
    s.time.run();
    CHECK(truncated == std::pair{std::error_code(asio::error::message_size), std::size_t{4}});
    CHECK(std::string(small.data(), small.size()) == "0123");
    CHECK(from == sa.local_endpoint());

    // The rest of it is gone: the next receive gets the next datagram, here gathered from
    // two buffers and scattered into two.
    const std::array<asio::const_buffer, 2> parts = {asio::buffer("abc", 3),
                                                     asio::buffer("defgh", 5)};
    sa.async_send_to(parts, sb.local_endpoint(), [](std::error_code, std::size_t) {});
    std::array<char, 3> head{};
    std::array<char, 6> tail{};
    const std::array<asio::mutable_buffer, 2> scatter = {asio::buffer(head), asio::buffer(tail)};
    result whole;
    sb.async_receive_from(scatter, from, into(whole));
    s.time.run();
    CHECK(whole == std::pair{ok, std::size_t{8}});
    CHECK(std::string(head.data(), 3) + std::string(tail.data(), 5) == "abcdefgh");

    // An empty datagram is a datagram; an empty buffer takes a datagram and keeps nothing.
    result empty;
    sa.async_send_to(asio::const_buffer(), sb.local_endpoint(), into(empty));
    result got_empty;
    sb.async_receive_from(asio::buffer(small), from, into(got_empty));
    s.time.run();
    CHECK(empty == std::pair{ok, std::size_t{0}});
    CHECK(got_empty == std::pair{ok, std::size_t{0}});
    send_checked(sa, bytes_of("xyz"), sb.local_endpoint());
    send_checked(sa, bytes_of("next"), sb.local_endpoint());
    result nothing_kept, next;
    sb.async_receive_from(asio::mutable_buffer(), from, into(nothing_kept));
    s.time.run();
    sb.async_receive_from(asio::buffer(small), from, into(next));
    s.time.run();
    CHECK(nothing_kept == std::pair{std::error_code(asio::error::message_size), std::size_t{0}});
    CHECK(next == std::pair{ok, std::size_t{4}});
    CHECK(std::string(small.data(), 4) == "next");
    CHECK(s.net.statistics().datagrams_delivered == 5);
}

TEST_CASE("a datagram larger than max_datagram_size is refused with message_size",
          "[net][sim][datagram]") {
    CHECK(sim::network_config{}.max_datagram_size == 65507);
    CHECK(sim::network_config{}.datagram_queue_bytes == 256u << 10);
    asio::io_context io;
    sim::network_config invalid;
    invalid.max_datagram_size = 0;
    CHECK_THROWS_AS(sim::network(io, 1, invalid), std::invalid_argument);
    invalid.max_datagram_size = (16u << 20) + 1;
    CHECK_THROWS_AS(sim::network(io, 1, invalid), std::invalid_argument);
    invalid = {};
    invalid.datagram_queue_bytes = 0;
    CHECK_THROWS_AS(sim::network(io, 1, invalid), std::invalid_argument);

    sim::network_config config;
    config.max_datagram_size = 1000;
    simulation s(1, config);
    const auto a = s.net.add_node();
    const auto b = s.net.add_node();
    auto sa = s.net.open_datagram(a, 1);
    auto sb = s.net.open_datagram(b, 1);
    std::optional<receipt> got;
    receive_one(sb, s.time, 2000, got);
    std::optional<std::pair<std::error_code, std::size_t>> too_large, largest;
    sa.async_send_to(asio::buffer(random_bytes(1001, 6)), sb.local_endpoint(),
                     [&](std::error_code ec, std::size_t n) { too_large.emplace(ec, n); });
    CHECK_FALSE(too_large); // posted, never inline
    sa.async_send_to(asio::buffer(random_bytes(1000, 7)), sb.local_endpoint(),
                     [&](std::error_code ec, std::size_t n) { largest.emplace(ec, n); });
    s.time.run();
    CHECK(too_large == std::pair{std::error_code(asio::error::message_size), std::size_t{0}});
    CHECK(largest == std::pair{std::error_code(), std::size_t{1000}});
    REQUIRE(got);
    CHECK(got->bytes == random_bytes(1000, 7));
    CHECK(s.net.statistics().datagrams_sent == 1);
}

namespace {

struct datagram_outcome {
    std::size_t received = 0;
    sim::network_statistics stats;
    std::uint64_t hash = 0;
};

// Sends `count` datagrams from a to b over `link` and counts those received.
datagram_outcome send_datagrams(std::uint64_t seed, const sim::link_properties& link, int count) {
    sim::network_config config;
    config.default_link = link;
    simulation s(seed, config);
    const auto a = s.net.add_node();
    const auto b = s.net.add_node();
    auto sa = s.net.open_datagram(a, 1);
    auto sb = s.net.open_datagram(b, 1);
    std::vector<receipt> got;
    spawn(s.net.get_executor(), receive_n(sb, s.time, count, 64, got));
    for (int i = 0; i < count; ++i)
        send_checked(sa, random_bytes(32, static_cast<std::uint64_t>(i)), sb.local_endpoint());
    s.time.run_for(10s);
    datagram_outcome outcome{got.size(), s.net.statistics(), s.net.trace_hash()};
    for (const auto& r : got)
        CHECK(r.ec == std::error_code());
    sb.close(); // ends receive_n if it still waits
    s.time.run();
    return outcome;
}

} // namespace

TEST_CASE("loss drops datagrams silently, counted, drawn from the seeded source",
          "[net][sim][datagram]") {
    const auto all_lost = send_datagrams(1, {10ms, 0, 1.0}, 10);
    CHECK(all_lost.received == 0);
    CHECK(all_lost.stats.datagrams_sent == 10);
    CHECK(all_lost.stats.datagrams_dropped == 10);
    CHECK(all_lost.stats.datagrams_delivered == 0);

    // One draw per datagram from the network's generator, seeded by the network seed.
    hivemesh::random_generator draws(7);
    std::size_t expected_lost = 0;
    for (int i = 0; i < 1000; ++i)
        expected_lost += draws.uniform_real() < 0.3 ? 1 : 0;
    const auto lossy = send_datagrams(7, {10ms, 0, 0.3}, 1000);
    CHECK(lossy.stats.datagrams_dropped == expected_lost);
    CHECK(lossy.received == 1000 - expected_lost);
    CHECK(lossy.stats.datagrams_delivered == lossy.received);
    CHECK(expected_lost > 250);
    CHECK(expected_lost < 350);
    const auto again = send_datagrams(7, {10ms, 0, 0.3}, 1000);
    CHECK(again.hash == lossy.hash);
    CHECK(send_datagrams(8, {10ms, 0, 0.3}, 1000).hash != lossy.hash);
}

TEST_CASE("datagrams across a partition, from or to a crashed node, or to no socket are dropped",
          "[net][sim][datagram]") {
    sim::network_config config;
    config.default_link = {10ms, 0, 0.0};
    simulation s(1, config);
    const auto a = s.net.add_node();
    const auto b = s.net.add_node();
    auto sa = s.net.open_datagram(a, 1);
    auto sb = s.net.open_datagram(b, 1);
    const auto& stats = s.net.statistics();
    const auto payload = hivemesh::test::bytes_of("payload");

    SECTION("across a partition: dropped, not held until it heals") {
        std::optional<receipt> got;
        receive_one(sb, s.time, 64, got);
        s.net.partition({b});
        send_checked(sa, payload, sb.local_endpoint());
        s.time.run();
        CHECK(stats.datagrams_dropped == 1);
        s.net.heal();
        s.time.run_for(10s);
        CHECK_FALSE(got);
        // Sent before the partition, arriving during it.
        send_checked(sa, payload, sb.local_endpoint());
        s.time.call_after(5ms, [&] { s.net.partition({b}); });
        s.time.run_for(1s);
        CHECK(stats.datagrams_dropped == 2);
        s.net.heal();
        s.time.run_for(10s);
        CHECK_FALSE(got);
        const auto t = s.time.now();
        send_checked(sa, payload, sb.local_endpoint());
        s.time.run();
        REQUIRE(got);
        CHECK(got->at == t + 10ms);
        CHECK(stats.datagrams_delivered == 1);
    }

    SECTION("to a crashed node: its socket closes and what arrives is dropped") {
        std::optional<receipt> got;
        receive_one(sb, s.time, 64, got);
        s.time.run_for(1s);
        const auto crash_at = s.time.now();
        s.net.crash(b);
        CHECK_FALSE(sb.is_open());
        s.time.run();
        REQUIRE(got);
        CHECK(got->ec == asio::error::operation_aborted); // as the node's streams and accepts
        CHECK(got->at == crash_at);
        send_checked(sa, payload, {b, 1});
        s.time.run();
        CHECK(stats.datagrams_dropped == 1);
        s.net.restart(b);
        auto reopened = s.net.open_datagram(b, 1);
        std::optional<receipt> after;
        receive_one(reopened, s.time, 64, after);
        send_checked(sa, payload, {b, 1});
        s.time.run();
        REQUIRE(after);
        CHECK(after->bytes == payload);
    }

    SECTION("from a node that crashed while the datagram was on its way") {
        std::optional<receipt> got;
        receive_one(sb, s.time, 64, got);
        send_checked(sa, payload, sb.local_endpoint());
        s.time.call_after(5ms, [&] { s.net.crash(a); });
        s.time.call_after(6ms, [&] { s.net.restart(a); }); // back before the arrival
        s.time.run_for(1s);
        CHECK_FALSE(got);
        CHECK(stats.datagrams_dropped == 1);
        CHECK_FALSE(sa.is_open());
        sb.close();
        s.time.run();
    }

    SECTION("to a port without a socket, or to no node") {
        send_checked(sa, payload, {b, 99});
        send_checked(sa, payload, {42, 1});
        s.time.run();
        CHECK(stats.datagrams_sent == 2);
        CHECK(stats.datagrams_dropped == 2);
    }

    SECTION("to a socket destroyed while the datagram is on its way") {
        auto doomed = std::make_unique<sim::datagram_socket>(s.net.open_datagram(b, 2));
        std::optional<receipt> got;
        receive_one(*doomed, s.time, 64, got);
        send_checked(sa, payload, {b, 2});
        s.time.call_after(5ms, [&] { doomed.reset(); });
        s.time.run();
        REQUIRE(got);
        CHECK(got->ec == asio::error::operation_aborted);
        CHECK(stats.datagrams_dropped == 1);
        CHECK(stats.datagrams_delivered == 0);
    }
}

TEST_CASE("a socket whose queue is full drops what arrives", "[net][sim][datagram]") {
    sim::network_config config;
    config.default_link = {10ms, 0, 0.0};
    config.datagram_queue_bytes = 1000;
    simulation s(1, config);
    const auto a = s.net.add_node();
    const auto b = s.net.add_node();
    auto sa = s.net.open_datagram(a, 1);
    auto sb = s.net.open_datagram(b, 1);
    std::vector<hivemesh::byte_buffer> sent;
    for (std::uint64_t i = 0; i < 5; ++i) {
        sent.push_back(random_bytes(300, 10 + i));
        send_checked(sa, sent.back(), sb.local_endpoint());
    }
    s.time.run();
    // 0, 300, 600 and 900 bytes queued are below the limit; 1,200 are not.
    CHECK(s.net.statistics().datagrams_delivered == 4);
    CHECK(s.net.statistics().datagrams_dropped == 1);
    std::vector<receipt> got;
    spawn(s.net.get_executor(), receive_n(sb, s.time, 5, 300, got));
    s.time.run();
    REQUIRE(got.size() == 4);
    for (std::size_t i = 0; i < 4; ++i)
        CHECK(got[i].bytes == sent[i]);
    send_checked(sa, sent[4], sb.local_endpoint()); // room again
    s.time.run();
    REQUIRE(got.size() == 5);
    CHECK(got[4].bytes == sent[4]);
}

namespace {

asio::awaitable<void> receive_with_deadline(sim::datagram_socket& socket, sim::virtual_time& time,
                                            time_point start, std::string& later) {
    using namespace asio::experimental::awaitable_operators;
    std::array<char, 64> buffer{};
    sim::endpoint from;
    sim::timer deadline(co_await asio::this_coro::executor);
    deadline.expires_after(1s);
    const auto result =
        co_await (socket.async_receive_from(asio::buffer(buffer), from, asio::use_awaitable) ||
                  deadline.async_wait(asio::use_awaitable));
    CHECK(result.index() == 1);
    CHECK(time.now() == start + 1s);
    const auto n =
        co_await socket.async_receive_from(asio::buffer(buffer), from, asio::use_awaitable);
    later.assign(buffer.data(), n);
}

} // namespace

TEST_CASE("close and cancellation abort a pending receive", "[net][sim][datagram]") {
    sim::network_config config;
    config.default_link = {10ms, 0, 0.0};
    simulation s(1, config);
    const auto a = s.net.add_node();
    const auto b = s.net.add_node();
    auto sa = s.net.open_datagram(a, 1);
    auto sb = s.net.open_datagram(b, 1);
    using result = std::optional<std::pair<std::error_code, std::size_t>>;
    auto into = [](result& r) {
        return [&r](std::error_code ec, std::size_t n) { r.emplace(ec, n); };
    };
    const auto aborted = std::pair{std::error_code(asio::error::operation_aborted), std::size_t{0}};
    const auto closed = std::pair{std::error_code(asio::error::bad_descriptor), std::size_t{0}};
    std::array<char, 16> buffer{};
    sim::endpoint from;

    SECTION("close: the pending receive aborts, later operations fail with bad_descriptor") {
        result pending, second;
        sb.async_receive_from(asio::buffer(buffer), from, into(pending));
        sb.async_receive_from(asio::buffer(buffer), from, into(second));
        s.time.run_for(1s);
        CHECK_FALSE(pending);
        CHECK(second == std::pair{std::error_code(asio::error::already_started), std::size_t{0}});
        sb.close();
        CHECK_FALSE(sb.is_open());
        s.time.run();
        CHECK(pending == aborted);
        result receive_after, send_after;
        sb.async_receive_from(asio::buffer(buffer), from, into(receive_after));
        sb.async_send_to(asio::buffer("x", 1), sa.local_endpoint(), into(send_after));
        s.time.run();
        CHECK(receive_after == closed);
        CHECK(send_after == closed);
        send_checked(sa, hivemesh::test::bytes_of("late"), {b, 1}); // no socket there now
        s.time.run();
        CHECK(s.net.statistics().datagrams_dropped == 1);
        sim::datagram_socket never_opened(s.net.get_executor());
        result unopened;
        never_opened.async_send_to(asio::buffer("x", 1), sa.local_endpoint(), into(unopened));
        s.time.run();
        CHECK(unopened == closed);
    }

    SECTION("close discards the queued datagrams") {
        send_checked(sa, hivemesh::test::bytes_of("queued"), {b, 1});
        s.time.run();
        CHECK(s.net.statistics().datagrams_delivered == 1);
        sb.close();
        auto reopened = s.net.open_datagram(b, 1);
        result got;
        reopened.async_receive_from(asio::buffer(buffer), from, into(got));
        s.time.run_for(1s);
        CHECK_FALSE(got);
        reopened.close();
        s.time.run();
        CHECK(got == aborted);
    }

    SECTION("a receive cancelled through its slot takes no datagram") {
        asio::cancellation_signal signal;
        result cancelled;
        sb.async_receive_from(asio::buffer(buffer), from,
                              asio::bind_cancellation_slot(signal.slot(), into(cancelled)));
        s.time.run_for(1s);
        CHECK_FALSE(cancelled);
        signal.emit(asio::cancellation_type::terminal);
        s.time.run();
        CHECK(cancelled == aborted);
        CHECK(sb.is_open());
        signal.emit(asio::cancellation_type::terminal); // late: does nothing
        send_checked(sa, hivemesh::test::bytes_of("after"), {b, 1});
        result got;
        sb.async_receive_from(asio::buffer(buffer), from, into(got));
        s.time.run();
        CHECK(got == std::pair{std::error_code(), std::size_t{5}});
        CHECK(from == sa.local_endpoint());
    }

    SECTION("a receive raced against a timer") {
        const auto start = s.time.now();
        std::string later;
        spawn(s.net.get_executor(), receive_with_deadline(sb, s.time, start, later));
        s.time.call_at(start + 2s, [&] {
            send_checked(sa, hivemesh::test::bytes_of("late bytes"), {b, 1});
        });
        s.time.run();
        CHECK(later == "late bytes");
    }
}

TEST_CASE("destroying the network with datagram sockets open is safe", "[net][sim][datagram]") {
    asio::io_context io;
    auto& time = asio::use_service<sim::virtual_time>(io);
    auto net = std::make_unique<sim::network>(io, 1);
    const auto a = net->add_node();
    const auto b = net->add_node();
    auto sa = net->open_datagram(a, 1);
    auto sb = net->open_datagram(b, 1);
    auto queued = net->open_datagram(b, 2);
    send_checked(sa, hivemesh::test::bytes_of("queued"), {b, 2});
    time.run();
    std::optional<receipt> pending;
    receive_one(sb, time, 64, pending);
    send_checked(sa, hivemesh::test::bytes_of("in flight"), {b, 1});
    time.run_for(5ms); // the datagram is half-way
    net.reset();
    time.run();
    REQUIRE(pending);
    CHECK(pending->ec == asio::error::operation_aborted);
    CHECK_FALSE(sb.is_open());
    CHECK_FALSE(queued.is_open());
    CHECK(sb.local_endpoint() == sim::endpoint{b, 1});
    using result = std::optional<std::pair<std::error_code, std::size_t>>;
    result send_after, receive_after;
    std::array<char, 4> buffer{};
    sim::endpoint from;
    sa.async_send_to(asio::buffer("x", 1), sim::endpoint{b, 1},
                     [&](std::error_code ec, std::size_t n) { send_after.emplace(ec, n); });
    queued.async_receive_from(asio::buffer(buffer), from, [&](std::error_code ec, std::size_t n) {
        receive_after.emplace(ec, n);
    });
    time.run();
    const auto down = std::pair{std::error_code(asio::error::network_down), std::size_t{0}};
    CHECK(send_after == down);
    CHECK(receive_after == down);

    // A datagram still on its way when everything, io_context included, is destroyed.
    asio::io_context io2;
    auto net2 = std::make_unique<sim::network>(io2, 1);
    const auto c = net2->add_node();
    auto sc = net2->open_datagram(c, 1);
    send_checked(sc, hivemesh::test::bytes_of("never"), {c, 1});
    io2.poll();
    CHECK(asio::use_service<sim::virtual_time>(io2).pending() == 1);
    net2.reset();
}

TEST_CASE("datagram sends, drops and notices are in the trace", "[net][sim][datagram]") {
    sim::network_config config;
    config.trace_log_capacity = 3;
    simulation s(1, config);
    const auto a = s.net.add_node();
    const auto b = s.net.add_node();
    auto sa = s.net.open_datagram(a, 0);
    send_checked(sa, hivemesh::test::bytes_of("abc"), {b, 99});
    s.time.run();
    const auto log = s.net.trace_log();
    REQUIRE(log.size() == 3);
    CHECK(log[0] == "0.000000000 datagram_sent 1 0 1 196707"); // port 99 | 3 bytes << 16
    CHECK(log[1] == "0.010000000 datagram_dropped 1 4 0 0");   // no socket at the port
    CHECK(log[2] == "0.020000000 notice_delivered 1 0 0 0");   // back at the sender
    CHECK(s.net.events() == 5);
}

TEST_CASE("a datagram that finds no socket at its port brings a notice back to its sender",
          "[net][sim][datagram]") {
    sim::network_config config;
    config.default_link = {10ms, 0, 0.0};
    simulation s(1, config);
    const auto a = s.net.add_node();
    const auto b = s.net.add_node();
    auto sa = s.net.open_datagram(a, 1);
    const auto& stats = s.net.statistics();
    const auto payload = hivemesh::test::bytes_of("payload");
    struct notice {
        std::error_code ec, reported;
        sim::endpoint about;
        time_point at;
    };
    std::optional<notice> got;
    auto wait = [&](sim::datagram_socket& socket) {
        auto about = std::make_shared<sim::endpoint>();
        socket.async_receive_error(*about,
                                   [&, about](std::error_code ec, std::error_code reported) {
                                       got.emplace(notice{ec, reported, *about, s.time.now()});
                                   });
    };

    SECTION("one round trip later, naming where the datagram went") {
        wait(sa);
        send_checked(sa, payload, {b, 99});
        s.time.run();
        REQUIRE(got);
        CHECK_FALSE(got->ec);
        CHECK(got->reported == asio::error::connection_refused);
        CHECK(got->about == sim::endpoint{b, 99});
        CHECK(got->at == s.start + 20ms);
        CHECK(stats.notices_delivered == 1);
        // Queued when nobody waits, in order, and handed to the next wait.
        send_checked(sa, payload, {b, 7});
        send_checked(sa, payload, {b, 8});
        s.time.run();
        for (const std::uint16_t port : {7, 8}) {
            got.reset();
            wait(sa);
            s.time.run();
            REQUIRE(got);
            CHECK(got->about == sim::endpoint{b, port});
        }
        CHECK(stats.notices_delivered == 3);
    }

    SECTION("none from a crashed node, across a partition, or when notices are off") {
        wait(sa);
        s.net.crash(b);
        send_checked(sa, payload, {b, 99});
        s.time.run();
        s.net.restart(b);
        s.net.partition({b});
        send_checked(sa, payload, {b, 99});
        s.time.run();
        s.net.heal();
        CHECK_FALSE(got);
        CHECK(stats.notices_delivered == 0);

        sim::network_config quiet = config;
        quiet.port_unreachable_notices = false;
        simulation q(1, quiet);
        const auto qa = q.net.add_node();
        const auto qb = q.net.add_node();
        auto socket = q.net.open_datagram(qa, 1);
        sim::endpoint about;
        std::optional<std::error_code> ended;
        socket.async_receive_error(about, [&](std::error_code ec, std::error_code) { ended = ec; });
        send_checked(socket, payload, {qb, 99});
        q.time.run();
        CHECK(q.net.statistics().datagrams_dropped == 1);
        CHECK(q.net.statistics().notices_delivered == 0);
        CHECK_FALSE(ended);
        socket.close();
        q.time.run();
        CHECK(ended == std::error_code(asio::error::operation_aborted));
    }

    SECTION("none to a sender that closed, or crashed and came back, meanwhile") {
        send_checked(sa, payload, {b, 99});
        s.time.call_after(15ms, [&] { sa.close(); });
        s.time.run();
        auto reopened = s.net.open_datagram(a, 1);
        wait(reopened);
        send_checked(reopened, payload, {b, 99});
        s.time.call_after(15ms, [&] {
            s.net.crash(a);
            s.net.restart(a);
        });
        s.time.run();
        REQUIRE(got); // the crash closed the socket: the wait aborted, no notice came
        CHECK(got->ec == asio::error::operation_aborted);
        CHECK(stats.notices_delivered == 0);
    }

    SECTION("close and cancellation end a wait; a second wait is refused") {
        wait(sa);
        std::optional<std::error_code> second;
        sim::endpoint unused;
        sa.async_receive_error(unused, [&](std::error_code ec, std::error_code) { second = ec; });
        s.time.run();
        CHECK(second == std::error_code(asio::error::already_started));
        sa.close();
        s.time.run();
        REQUIRE(got);
        CHECK(got->ec == asio::error::operation_aborted);

        auto other = s.net.open_datagram(a, 2);
        asio::cancellation_signal cancel;
        std::optional<std::error_code> cancelled;
        other.async_receive_error(
            unused,
            asio::bind_cancellation_slot(
                cancel.slot(), [&](std::error_code ec, std::error_code) { cancelled = ec; }));
        s.time.run();
        CHECK_FALSE(cancelled);
        cancel.emit(asio::cancellation_type::terminal);
        s.time.run();
        CHECK(cancelled == std::error_code(asio::error::operation_aborted));
    }
}

// ------------------------------------------------------------------------------------
// Determinism and scale

namespace {

asio::awaitable<void> echo_server(sim::listener& l) {
    for (;;) {
        auto [ec, st] = co_await l.async_accept(tuple_awaitable);
        if (ec) co_return;
        auto peer = std::make_shared<sim::stream>(std::move(st));
        asio::co_spawn(
            l.get_executor(),
            [](std::shared_ptr<sim::stream> s) -> asio::awaitable<void> {
                std::array<std::byte, 4096> buffer;
                for (;;) {
                    auto [read_error, n] =
                        co_await s->async_read_some(asio::buffer(buffer), tuple_awaitable);
                    if (read_error) co_return;
                    auto [write_error, m] = co_await asio::async_write(
                        *s, asio::buffer(buffer.data(), n), tuple_awaitable);
                    if (write_error) co_return;
                }
            }(peer),
            asio::detached);
    }
}

struct client_tally {
    int ok = 0;
    int failed = 0;
};

// Sends each message in turn and checks its echo; one tally per connection.
asio::awaitable<void> echo_client(sim::transport t, sim::endpoint server,
                                  std::vector<hivemesh::byte_buffer> messages,
                                  client_tally& tally) {
    auto [ec, s] = co_await t.async_connect(server, tuple_awaitable);
    if (ec) {
        ++tally.failed;
        co_return;
    }
    for (const auto& message : messages) {
        auto [write_error, written] =
            co_await asio::async_write(s, asio::buffer(message), tuple_awaitable);
        hivemesh::byte_buffer echo(message.size());
        auto [read_error, n] = co_await asio::async_read(s, asio::buffer(echo), tuple_awaitable);
        if (write_error || read_error || echo != message) {
            ++tally.failed;
            co_return;
        }
    }
    ++tally.ok;
}

struct swarm_outcome {
    std::uint64_t hash = 0;
    std::uint64_t events = 0;
    client_tally tally;
    sim::network_statistics stats;
};

// `nodes` echo servers; each dials `dials` random others at random times within the first
// second and checks the echoes of `rounds` random messages. The workload is drawn from
// `workload_seed`, the network's randomness from `seed`.
swarm_outcome run_swarm(std::uint64_t seed, std::uint64_t workload_seed, std::size_t nodes,
                        int dials, int rounds, std::size_t max_message,
                        const sim::link_properties& link, bool faults) {
    sim::network_config config;
    config.default_link = link;
    simulation s(seed, config);
    hivemesh::random_generator workload(workload_seed);
    std::vector<sim::listener> listeners;
    for (std::size_t i = 0; i < nodes; ++i) {
        const auto node = s.net.add_node();
        listeners.push_back(s.net.listen(node, 80));
    }
    for (auto& l : listeners)
        spawn(s.net.get_executor(), echo_server(l));
    client_tally tally;
    for (sim::node_id from = 0; from < nodes; ++from)
        for (int i = 0; i < dials; ++i) {
            auto to = workload.uniform(nodes - 1);
            to += to >= from ? 1 : 0;
            if (workload.uniform(4) == 0) // some links are slower
                s.net.set_link(from, to, {link.latency * 3, link.bandwidth, link.loss});
            std::vector<hivemesh::byte_buffer> messages;
            for (int round = 0; round < rounds; ++round)
                messages.push_back(random_bytes(workload, 1 + workload.uniform(max_message)));
            const auto at = duration(workload.uniform(1'000'000'000)); // within a second
            s.time.call_after(at, [&s, &tally, from, to, messages = std::move(messages)] {
                spawn(s.net.get_executor(),
                      echo_client(sim::transport(s.net, from), {to, 80}, messages, tally));
            });
        }
    if (faults) {
        s.time.call_after(500ms, [&] { s.net.partition({0, 1, 2, 3, 4}); });
        s.time.call_after(700ms, [&] { s.net.crash(7); });
        s.time.call_after(1500ms, [&] { s.net.heal(); });
    }
    s.time.run_for(60s);
    swarm_outcome outcome{s.net.trace_hash(), s.net.events(), tally, s.net.statistics()};
    for (auto& l : listeners)
        l.close();
    s.time.run();
    return outcome;
}

} // namespace

TEST_CASE("the same seed gives the same trace, another seed another", "[net][sim][determinism]") {
    const sim::link_properties link{20ms, 2'000'000, 0.05};
    const auto first = run_swarm(1, 99, 50, 3, 2, 40'000, link, true);
    const auto second = run_swarm(1, 99, 50, 3, 2, 40'000, link, true);
    const auto other = run_swarm(2, 99, 50, 3, 2, 40'000, link, true);
    CHECK(first.hash == second.hash);
    CHECK(first.events == second.events);
    CHECK(first.tally.ok == second.tally.ok);
    CHECK(first.stats.segments_lost == second.stats.segments_lost);
    CHECK(first.stats.bytes_delivered == second.stats.bytes_delivered);
    CHECK(first.hash != other.hash);
    // The workload ran: most echoes completed despite loss, a partition and a crash.
    CHECK(first.tally.ok + first.tally.failed == 150);
    CHECK(first.tally.ok > 100);
    CHECK(first.stats.segments_lost > 0);
    CHECK(first.stats.segments_held > 0);
    CHECK(first.stats.resets > 0);
}

TEST_CASE("a thousand nodes each exchange a few messages with a few others", "[net][sim][scale]") {
    const auto outcome = run_swarm(5, 7, 1000, 3, 3, 2'000, {30ms, 10'000'000, 0.0}, false);
    CHECK(outcome.tally.ok == 3000);
    CHECK(outcome.tally.failed == 0);
    CHECK(outcome.stats.connections_established == 3000);
}

TEST_CASE("a trace log keeps the most recent events as text", "[net][sim][determinism]") {
    sim::network_config config;
    config.trace_log_capacity = 3;
    simulation s(1, config);
    const auto a = s.net.add_node();
    const auto b = s.net.add_node();
    auto pair = connect(s, a, b);
    const auto log = s.net.trace_log();
    REQUIRE(log.size() == 3);
    CHECK(log[0] == "0.010000000 accepted 1 1 0 0");     // connection 1, dial 1
    CHECK(log[1] == "0.020000000 established 1 1 0 0");  // one default 10 ms RTT
    CHECK(log[2] == "0.020000000 unlisten 1 49152 0 0"); // connect() closed its listener
    // Two nodes, listen, dial, accepted, established, unlisten; run() did not idle on to
    // the 3 s connect timeout of the finished dial.
    CHECK(s.net.events() == 7);
    CHECK(s.time.now() == s.start + 20ms);
}
