// TCP transport tests. Only loopback addresses (127.0.0.0/8, ::1) are ever dialled, and, as
// root, an address of a network namespace the test makes for itself.
#include <hivemesh/net/tcp.hpp>

#include <asio.hpp>
#include <asio/experimental/deferred.hpp>
#include <asio/experimental/parallel_group.hpp>

#include <catch2/catch.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <future>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

using namespace std::chrono_literals;
using asio::ip::tcp;
using hivemesh::errc;
using hivemesh::crypto::peer_id;
using hivemesh::net::peer_address;
using hivemesh::net::tcp::listener;
using hivemesh::net::tcp::transport;
namespace ex = asio::experimental;

namespace {

const asio::ip::address loopback_v4 = asio::ip::address_v4::loopback();
const asio::ip::address loopback_v6 = asio::ip::address_v6::loopback();

// Generous bound on every test's io_context run: a hang (say, a cancellation that is not
// delivered) fails the test instead of stalling CI. Nothing asserts how fast things are.
constexpr auto watchdog = 60s;

/// Runs `body` on `io` to completion, rethrowing its exception (a failed REQUIRE).
void run(asio::io_context& io, asio::awaitable<void> body) {
    io.restart(); // in case an earlier run() ran out of work
    std::exception_ptr failure;
    bool finished = false;
    asio::co_spawn(io, std::move(body), [&](std::exception_ptr e) {
        failure = e;
        finished = true;
    });
    io.run_for(watchdog);
    if (failure) std::rethrow_exception(failure);
    REQUIRE(finished);
}

bool ipv6_loopback_available() {
    asio::io_context io;
    tcp::acceptor probe(io);
    std::error_code ec;
    probe.open(tcp::v6(), ec);
    if (!ec) probe.bind(tcp::endpoint(loopback_v6, 0), ec);
    return !ec;
}

/// True if "localhost" resolves, and only to loopback addresses: tests dial it only then.
bool localhost_is_loopback_only() {
    asio::io_context io;
    tcp::resolver resolver(io);
    std::error_code ec;
    const auto results = resolver.resolve("localhost", "1", ec);
    if (ec || results.empty()) return false;
    for (const auto& entry : results)
        if (!entry.endpoint().address().is_loopback()) return false;
    return true;
}

/// The socket's TCP_NOTSENT_LOWAT, or -1 where the platform has none.
long unsent_limit(tcp::socket& s) {
#if defined(TCP_NOTSENT_LOWAT)
    unsigned value = 0;
    socklen_t size = sizeof value;
    if (::getsockopt(s.native_handle(), IPPROTO_TCP, TCP_NOTSENT_LOWAT, &value, &size) != 0)
        return -1;
    return static_cast<long>(value);
#else
    return -1;
#endif
}

/// TCP_NODELAY is on, and a loopback connection keeps the kernel's unsent limit.
bool has_connection_options(tcp::socket& s) {
    tcp::no_delay option;
    s.get_option(option);
    return option.value() &&
           unsent_limit(s) != static_cast<long>(hivemesh::net::tcp::unsent_bytes_limit);
}

std::vector<std::uint8_t> pattern(std::size_t size, std::uint8_t seed) {
    std::vector<std::uint8_t> out(size);
    for (std::size_t i = 0; i < size; ++i)
        out[i] = static_cast<std::uint8_t>(seed + i * 31 + (i >> 9));
    return out;
}

/// Accepts on `l` while dialling `target` with `dial(token)`; returns {server, client}.
template <class Dial>
asio::awaitable<std::pair<tcp::socket, tcp::socket>> accept_and_dial(listener& l, Dial dial) {
    auto [order, accept_ec, server, connect_ec, client] =
        co_await ex::make_parallel_group(l.async_accept(ex::deferred), dial(ex::deferred))
            .async_wait(ex::wait_for_all(), asio::use_awaitable);
    (void)order;
    REQUIRE_FALSE(accept_ec);
    REQUIRE_FALSE(connect_ec);
    co_return std::pair{std::move(server), std::move(client)};
}

/// Sends `size` bytes each way at once and checks both arrive intact.
asio::awaitable<void> exchange_both_ways(tcp::socket& a, tcp::socket& b, std::size_t size) {
    const auto a_to_b = pattern(size, 1);
    const auto b_to_a = pattern(size, 2);
    std::vector<std::uint8_t> at_b(size), at_a(size);
    auto [order, e1, n1, e2, n2, e3, n3, e4, n4] =
        co_await ex::make_parallel_group(asio::async_write(a, asio::buffer(a_to_b), ex::deferred),
                                         asio::async_write(b, asio::buffer(b_to_a), ex::deferred),
                                         asio::async_read(b, asio::buffer(at_b), ex::deferred),
                                         asio::async_read(a, asio::buffer(at_a), ex::deferred))
            .async_wait(ex::wait_for_one_error(), asio::use_awaitable);
    (void)order;
    REQUIRE_FALSE(e1);
    REQUIRE_FALSE(e2);
    REQUIRE_FALSE(e3);
    REQUIRE_FALSE(e4);
    CHECK(n1 == size);
    CHECK(n2 == size);
    CHECK(n3 == size);
    CHECK(n4 == size);
    CHECK(at_b == a_to_b);
    CHECK(at_a == b_to_a);
}

/// Dials `target` on a fresh io_context and a listener bound to `listen_at`, then
/// exchanges data; `dial` chooses the overload under test.
template <class Dial>
void check_connection(const tcp::endpoint& listen_at, Dial dial) {
    asio::io_context io;
    transport t(io.get_executor());
    listener l = t.listen(listen_at);
    REQUIRE(l.is_open());
    CHECK(l.local_endpoint().address() == listen_at.address());
    CHECK(l.local_endpoint().port() != 0);
    run(io, [&]() -> asio::awaitable<void> {
        auto [server, client] = co_await accept_and_dial(
            l, [&](auto token) { return dial(t, l.local_endpoint(), std::move(token)); });
        CHECK(client.remote_endpoint() == l.local_endpoint());
        CHECK(server.remote_endpoint() == client.local_endpoint());
        CHECK(has_connection_options(client));
        CHECK(has_connection_options(server));
        CHECK(client.get_executor() == t.executor());
        CHECK(server.get_executor() == t.executor());
        co_await exchange_both_ways(client, server, 256 * 1024);
        // The kernel measured the round trips of that exchange; an unopened socket has none.
        for (auto* s : {&client, &server}) {
            CHECK(transport::round_trip_time(*s) > 0ns);
            CHECK(transport::round_trip_time(*s) < 1s);
        }
        tcp::socket unopened(io);
        CHECK(transport::round_trip_time(unopened) == 0ns);
    }());
}

/// A loopback endpoint on which connects hang: a listener with a backlog of 0 that never
/// accepts. Once its queue holds a connection Linux drops further SYNs, so a later dial
/// waits for SYN retransmissions (the first after 1 s). `fill` holds the queued ones.
struct unresponsive_listener {
    explicit unresponsive_listener(asio::io_context& io)
        : acceptor(io) {
        acceptor.open(tcp::v4());
        acceptor.bind(tcp::endpoint(loopback_v4, 0));
        acceptor.listen(0);
    }
    tcp::endpoint endpoint() const { return acceptor.local_endpoint(); }

    tcp::acceptor acceptor;
    std::vector<tcp::socket> fill;
};

/// Dials `l` with a short deadline until a dial times out; returns how many connected first.
std::size_t dial_until_timeout(asio::io_context& io, transport& t, unresponsive_listener& l) {
    for (std::size_t attempt = 0; attempt < 64; ++attempt) {
        std::optional<std::error_code> result;
        std::optional<tcp::socket> socket;
        t.async_connect(l.endpoint(), 200ms, [&](std::error_code ec, tcp::socket s) {
            result = ec;
            socket.emplace(std::move(s));
        });
        io.restart();
        io.run_for(watchdog);
        REQUIRE(result);
        if (*result == asio::error::timed_out) {
            CHECK_FALSE(socket->is_open());
            return attempt;
        }
        REQUIRE_FALSE(*result); // queued by the kernel: connected
        l.fill.push_back(std::move(*socket));
    }
    FAIL("no dial ever hung: could not exercise the deadline");
    return 0;
}

} // namespace

TEST_CASE("listen on 127.0.0.1:0, connect and exchange bytes both ways", "[net][tcp]") {
    check_connection(tcp::endpoint(loopback_v4, 0), [](transport& t, tcp::endpoint ep, auto token) {
        return t.async_connect(ep, 10s, std::move(token));
    });
}

TEST_CASE("connections to addresses other than loopback limit what the kernel holds unsent",
          "[net][tcp]") {
    using hivemesh::net::tcp::limits_unsent_bytes;
    for (const char* loopback : {"127.0.0.1", "127.5.6.7", "::1", "::ffff:127.0.0.1"}) {
        INFO(loopback);
        CHECK_FALSE(limits_unsent_bytes(asio::ip::make_address(loopback)));
    }
    for (const char* other : {"10.0.0.1", "192.168.1.20", "::ffff:10.0.0.1", "2001:db8::1"}) {
        INFO(other);
        CHECK(limits_unsent_bytes(asio::ip::make_address(other)));
    }
}

TEST_CASE("a connection to an address of a network namespace gets TCP_NOTSENT_LOWAT on both "
          "ends",
          "[net][tcp][netns]") {
#if !defined(TCP_NOTSENT_LOWAT)
    WARN("skipped: this platform has no TCP_NOTSENT_LOWAT");
#else
    if (::geteuid() != 0) {
        WARN("skipped: making a network namespace needs root");
        return;
    }
    // A child process in a namespace of its own, whose loopback device also carries
    // 10.213.9.1: the connection never leaves it, and the namespace ends with the child.
    constexpr int skipped = 77;
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        ::alarm(30);
        if (::unshare(CLONE_NEWNET) != 0) ::_exit(skipped);
        if (std::system("ip link set lo up && ip addr add 10.213.9.1/32 dev lo") != 0)
            ::_exit(skipped);
        asio::io_context io;
        transport t(io.get_executor());
        listener l = t.listen(tcp::endpoint(asio::ip::make_address("10.213.9.1"), 0));
        auto accepted = l.async_accept(asio::use_future);
        auto connected = t.async_connect(l.local_endpoint(), 10s, asio::use_future);
        io.run_for(10s);
        tcp::socket server = accepted.get(), client = connected.get();
        const long want = static_cast<long>(hivemesh::net::tcp::unsent_bytes_limit);
        ::_exit(unsent_limit(client) == want && unsent_limit(server) == want ? 0 : 1);
    }
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    REQUIRE(WIFEXITED(status));
    if (WEXITSTATUS(status) == skipped) {
        WARN("skipped: no network namespace with an address could be made here");
        return;
    }
    CHECK(WEXITSTATUS(status) == 0);
#endif
}

TEST_CASE("listen on [::1]:0, connect and exchange bytes both ways", "[net][tcp]") {
    if (!ipv6_loopback_available()) {
        WARN("no IPv6 loopback (::1) on this machine: IPv6 test skipped");
        return;
    }
    check_connection(tcp::endpoint(loopback_v6, 0), [](transport& t, tcp::endpoint ep, auto token) {
        return t.async_connect(ep, std::move(token)); // the transport's default timeout
    });
}

TEST_CASE("dial by /ip4, /ip6 and /dns/localhost addresses", "[net][tcp]") {
    const peer_id id = peer_id::from_public_key(hivemesh::byte_buffer(32, std::byte{4}));

    SECTION("/ip4 with a PeerId (not checked by TCP)") {
        check_connection(
            tcp::endpoint(loopback_v4, 0), [&](transport& t, tcp::endpoint ep, auto token) {
                const auto a = peer_address::from_string(
                    "/ip4/127.0.0.1/tcp/" + std::to_string(ep.port()) + "/p2p/" + id.to_string());
                return t.async_connect(a, 10s, std::move(token));
            });
    }
    SECTION("/ip6") {
        if (!ipv6_loopback_available()) {
            WARN("no IPv6 loopback (::1) on this machine: /ip6 dial skipped");
            return;
        }
        check_connection(tcp::endpoint(loopback_v6, 0), [](transport& t, tcp::endpoint ep,
                                                           auto token) {
            const auto a = peer_address::from_string("/ip6/::1/tcp/" + std::to_string(ep.port()));
            return t.async_connect(a, std::move(token));
        });
    }
    SECTION("/dns/localhost") {
        if (!localhost_is_loopback_only()) {
            WARN("localhost does not resolve to loopback addresses only: /dns test skipped");
            return;
        }
        // If localhost also resolves to ::1, where nothing listens, that attempt is refused
        // and the next endpoint is tried.
        check_connection(
            tcp::endpoint(loopback_v4, 0), [](transport& t, tcp::endpoint ep, auto token) {
                const auto a =
                    peer_address::from_string("/dns/localhost/tcp/" + std::to_string(ep.port()));
                return t.async_connect(a, 10s, std::move(token));
            });
    }
}

TEST_CASE("a port nobody listens on refuses the connection", "[net][tcp]") {
    asio::io_context io;
    transport t(io.get_executor());
    // A bound socket that does not listen keeps the port ours; SYNs to it get a reset.
    tcp::socket reserved(io, tcp::endpoint(loopback_v4, 0));
    const auto target = reserved.local_endpoint();

    std::optional<std::error_code> by_endpoint, by_address;
    bool socket_closed = false;
    t.async_connect(target, 10s, [&](std::error_code ec, tcp::socket s) {
        by_endpoint = ec;
        socket_closed = !s.is_open();
    });
    t.async_connect(hivemesh::net::tcp::to_address(target), 10s,
                    [&](std::error_code ec, tcp::socket) { by_address = ec; });
    io.run_for(watchdog);
    REQUIRE(by_endpoint);
    REQUIRE(by_address);
    CHECK(*by_endpoint == asio::error::connection_refused);
    CHECK(*by_address == asio::error::connection_refused);
    CHECK(socket_closed);
}

TEST_CASE("a dial that outlives its deadline fails with timed_out", "[net][tcp]") {
    asio::io_context io;
    transport t(io.get_executor());
    unresponsive_listener hung(io);
    const std::size_t queued = dial_until_timeout(io, t, hung);
    INFO("connections queued before dials hung: " << queued);

    SECTION("a second timed-out dial, by address") {
        std::optional<std::error_code> result;
        t.async_connect(hivemesh::net::tcp::to_address(hung.endpoint()), 100ms,
                        [&](std::error_code ec, tcp::socket) { result = ec; });
        io.restart();
        io.run_for(watchdog);
        REQUIRE(result);
        CHECK(*result == asio::error::timed_out);
    }
    SECTION("a /dns/localhost dial shares one deadline between lookup and connect") {
        if (!localhost_is_loopback_only()) {
            WARN("localhost does not resolve to loopback addresses only: /dns test skipped");
            return;
        }
        const auto a = peer_address::from_string("/dns/localhost/tcp/" +
                                                 std::to_string(hung.endpoint().port()));
        std::optional<std::error_code> timed_out, cancelled;
        t.async_connect(a, 100ms, [&](std::error_code ec, tcp::socket) { timed_out = ec; });
        // Cancelled as soon as the dial has started: usually during the lookup, otherwise
        // during the connect; both must give operation_aborted.
        asio::cancellation_signal signal;
        t.async_connect(
            a, 1h,
            asio::bind_cancellation_slot(signal.slot(),
                                         [&](std::error_code ec, tcp::socket) { cancelled = ec; }));
        asio::post(io, [&] { signal.emit(asio::cancellation_type::terminal); });
        io.restart();
        io.run_for(watchdog);
        REQUIRE(timed_out);
        REQUIRE(cancelled);
        CHECK(*timed_out == asio::error::timed_out);
        CHECK(*cancelled == asio::error::operation_aborted);
    }
    SECTION("a per-operation cancellation stops it with operation_aborted") {
        for (const auto type : {asio::cancellation_type::terminal, asio::cancellation_type::partial,
                                asio::cancellation_type::total}) {
            asio::cancellation_signal signal;
            std::optional<std::error_code> result;
            bool socket_closed = false;
            t.async_connect(
                hung.endpoint(), 1h,
                asio::bind_cancellation_slot(signal.slot(), [&](std::error_code ec, tcp::socket s) {
                    result = ec;
                    socket_closed = !s.is_open();
                }));
            asio::steady_timer later(io, 20ms);
            later.async_wait([&](std::error_code) { signal.emit(type); });
            io.restart();
            io.run_for(watchdog);
            INFO("cancellation type " << static_cast<int>(type));
            REQUIRE(result);
            CHECK(*result == asio::error::operation_aborted);
            CHECK(socket_closed);
        }
    }
    SECTION("cancelling an awaited dial from its coroutine") {
        run(io, [&]() -> asio::awaitable<void> {
            asio::cancellation_signal signal;
            asio::steady_timer later(co_await asio::this_coro::executor, 20ms);
            later.async_wait(
                [&](std::error_code) { signal.emit(asio::cancellation_type::terminal); });
            auto [ec, socket] = co_await t.async_connect(
                hung.endpoint(), 1h,
                asio::bind_cancellation_slot(signal.slot(), ex::as_tuple(asio::use_awaitable)));
            CHECK(ec == asio::error::operation_aborted);
            CHECK_FALSE(socket.is_open());
        }());
    }
}

TEST_CASE("deadlines at the edges: zero, negative and the end of time", "[net][tcp]") {
    asio::io_context io;
    transport t(io.get_executor());
    listener l = t.listen(tcp::endpoint(loopback_v4, 0));

    // An expired deadline fails before anything is attempted, even with a listener there.
    std::vector<std::error_code> results;
    const auto record = [&](std::error_code ec, tcp::socket s) {
        results.push_back(ec);
        CHECK_FALSE(s.is_open());
    };
    t.async_connect(l.local_endpoint(), 0s, record);
    t.async_connect(l.local_endpoint(), -5s, record);
    t.async_connect(hivemesh::net::tcp::to_address(l.local_endpoint()), 0s, record);
    t.async_connect(peer_address::from_string("/dns/localhost/tcp/1"), 0s, record);
    io.run_for(watchdog);
    REQUIRE(results.size() == 4);
    for (const auto& ec : results)
        CHECK(ec == asio::error::timed_out);

    // A deadline too far away to add to now() saturates instead of overflowing.
    run(io, [&]() -> asio::awaitable<void> {
        auto [server, client] = co_await accept_and_dial(l, [&](auto token) {
            return t.async_connect(l.local_endpoint(), hivemesh::duration::max(), std::move(token));
        });
        CHECK(client.is_open());
        CHECK(server.is_open());
    }());
}

TEST_CASE("sim and invalid addresses are refused with invalid_argument", "[net][tcp]") {
    asio::io_context io;
    transport t(io.get_executor());
    const std::vector<peer_address> refused = {
        peer_address::from_string("/sim/3/port/7"),
        peer_address::sim(1, 1, peer_id::from_public_key(hivemesh::byte_buffer(32, std::byte{1}))),
        {peer_address::protocol::ip4, "no.such.ip", 1, std::nullopt},
        {peer_address::protocol::ip6, "::1%1", 1, std::nullopt},
        {peer_address::protocol::dns, "bad..name", 1, std::nullopt},
    };
    std::vector<std::error_code> results;
    for (const auto& a : refused)
        t.async_connect(a, 10s, [&](std::error_code ec, tcp::socket s) {
            results.push_back(ec);
            CHECK_FALSE(s.is_open());
        });
    io.run_for(watchdog);
    REQUIRE(results.size() == refused.size());
    for (const auto& ec : results)
        CHECK(ec == errc::invalid_argument);
}

TEST_CASE("use_future and callback tokens, from a thread outside the io_context", "[net][tcp]") {
    asio::io_context io;
    auto work = asio::make_work_guard(io);
    std::thread runner([&] { io.run(); });
    transport t(io.get_executor());
    listener l = t.listen(tcp::endpoint(loopback_v4, 0));

    // use_future on both sides, from a thread that is not running the io_context.
    auto accepted = l.async_accept(asio::use_future);
    auto connected = t.async_connect(l.local_endpoint(), 10s, asio::use_future);
    tcp::socket client = connected.get();
    tcp::socket server = accepted.get();
    CHECK(client.is_open());
    CHECK(server.is_open());
    CHECK(has_connection_options(client));
    CHECK(has_connection_options(server));

    // A failing dial through use_future throws the error.
    tcp::socket reserved(io, tcp::endpoint(loopback_v4, 0));
    auto refused = t.async_connect(reserved.local_endpoint(), 10s, asio::use_future);
    try {
        refused.get();
        FAIL("connected to a port nobody listens on");
    } catch (const std::system_error& e) {
        CHECK(e.code() == asio::error::connection_refused);
    }

    // A callback runs on the io_context's thread, never inside async_connect.
    std::promise<std::thread::id> callback_thread;
    t.async_connect(l.local_endpoint(), 10s, [&](std::error_code, tcp::socket) {
        callback_thread.set_value(std::this_thread::get_id());
    });
    CHECK(callback_thread.get_future().get() == runner.get_id());

    work.reset();
    l.close();
    runner.join();
}

TEST_CASE("many concurrent dials on a multi-threaded io_context", "[net][tcp]") {
    asio::io_context io(2);
    transport t(io.get_executor());
    listener l = t.listen(tcp::endpoint(loopback_v4, 0));
    constexpr int dials = 32;
    std::atomic<int> accepted{0}, connected{0}, failures{0};

    // The accept loop runs on one strand; the dials on the pool.
    auto accept_strand = asio::make_strand(io);
    std::vector<tcp::socket> servers;
    asio::co_spawn(
        accept_strand,
        [&]() -> asio::awaitable<void> {
            for (int i = 0; i < dials; ++i) {
                auto [ec, s] = co_await l.async_accept(ex::as_tuple(asio::use_awaitable));
                if (ec || !has_connection_options(s)) ++failures;
                ++accepted;
                servers.push_back(std::move(s));
            }
        },
        asio::detached);
    std::vector<std::optional<tcp::socket>> clients(dials);
    for (int i = 0; i < dials; ++i)
        t.async_connect(l.local_endpoint(), 10s, [&, i](std::error_code ec, tcp::socket s) {
            if (ec || !has_connection_options(s)) ++failures;
            ++connected;
            clients[static_cast<std::size_t>(i)].emplace(std::move(s));
        });

    std::thread second([&] { io.run_for(watchdog); });
    io.run_for(watchdog);
    second.join();
    CHECK(accepted == dials);
    CHECK(connected == dials);
    CHECK(failures == 0);
}

TEST_CASE("listeners: errors, v6_only, close and cancellation", "[net][tcp]") {
    asio::io_context io;
    transport t(io.get_executor());

    SECTION("a port in use is reported, with an error code or an exception") {
        listener first = t.listen(tcp::endpoint(loopback_v4, 0));
        std::error_code ec;
        listener second = t.listen(first.local_endpoint(), ec);
        CHECK(ec == asio::error::address_in_use);
        CHECK_FALSE(second.is_open());
        try {
            (void)t.listen(first.local_endpoint());
            FAIL("listened twice on one port");
        } catch (const std::system_error& e) {
            CHECK(e.code() == asio::error::address_in_use);
        }
    }
    SECTION("listening on an address: ip4 yes, dns and sim no") {
        listener l = t.listen(peer_address::from_string("/ip4/127.0.0.1/tcp/0"));
        CHECK(l.is_open());
        CHECK(l.local_endpoint().address() == loopback_v4);
        for (const auto* text : {"/dns/localhost/tcp/0", "/sim/1/port/0"}) {
            try {
                (void)t.listen(peer_address::from_string(text));
                FAIL("listened on " << text);
            } catch (const std::system_error& e) {
                CHECK(e.code() == errc::invalid_argument);
            }
        }
    }
    SECTION("v6_only: [::] and 0.0.0.0 bind the same port side by side") {
        if (!ipv6_loopback_available()) {
            WARN("no IPv6 on this machine: v6_only test skipped");
            return;
        }
        // Bound only, never dialled and closed at once.
        listener v6 = t.listen(tcp::endpoint(asio::ip::address_v6::any(), 0));
        std::error_code ec;
        listener v4 =
            t.listen(tcp::endpoint(asio::ip::address_v4::any(), v6.local_endpoint().port()), ec);
        CHECK_FALSE(ec);
        CHECK(v4.is_open());
        CHECK(v4.local_endpoint().port() == v6.local_endpoint().port());
    }
    SECTION("close() completes a pending accept with operation_aborted") {
        listener l = t.listen(tcp::endpoint(loopback_v4, 0));
        std::optional<std::error_code> result;
        l.async_accept([&](std::error_code ec, tcp::socket s) {
            result = ec;
            CHECK_FALSE(s.is_open());
        });
        asio::post(io, [&] { l.close(); });
        io.run_for(watchdog);
        REQUIRE(result);
        CHECK(*result == asio::error::operation_aborted);
        CHECK_FALSE(l.is_open());
    }
    SECTION("a cancelled accept leaves the listener usable") {
        listener l = t.listen(tcp::endpoint(loopback_v4, 0));
        asio::cancellation_signal signal;
        std::optional<std::error_code> result;
        l.async_accept(asio::bind_cancellation_slot(
            signal.slot(), [&](std::error_code ec, tcp::socket) { result = ec; }));
        asio::post(io, [&] { signal.emit(asio::cancellation_type::terminal); });
        io.run_for(watchdog);
        REQUIRE(result);
        CHECK(*result == asio::error::operation_aborted);
        CHECK(l.is_open());

        run(io, [&]() -> asio::awaitable<void> {
            auto [server, client] = co_await accept_and_dial(l, [&](auto token) {
                return t.async_connect(l.local_endpoint(), 10s, std::move(token));
            });
            CHECK(server.is_open());
        }());
    }
}

TEST_CASE("endpoints and addresses convert both ways", "[net][tcp]") {
    using hivemesh::net::tcp::to_address;
    using hivemesh::net::tcp::to_endpoint;
    const peer_id id = peer_id::from_public_key(hivemesh::byte_buffer(32, std::byte{8}));

    CHECK(to_endpoint(peer_address::from_string("/ip4/127.0.0.1/tcp/80")) ==
          tcp::endpoint(loopback_v4, 80));
    CHECK(to_endpoint(peer_address::from_string("/ip6/::1/tcp/65535/p2p/" + id.to_string())) ==
          tcp::endpoint(loopback_v6, 65535));
    CHECK_FALSE(to_endpoint(peer_address::from_string("/dns/localhost/tcp/80")));
    CHECK_FALSE(to_endpoint(peer_address::from_string("/sim/1/port/80")));
    CHECK_FALSE(to_endpoint({peer_address::protocol::ip6, "fe80::1%1", 80, std::nullopt}));
    CHECK_FALSE(to_endpoint({peer_address::protocol::ip4, "127.1", 80, std::nullopt}));

    CHECK(to_address(tcp::endpoint(loopback_v4, 80)).to_string() == "/ip4/127.0.0.1/tcp/80");
    CHECK(to_address(tcp::endpoint(loopback_v6, 1), id).to_string() ==
          "/ip6/::1/tcp/1/p2p/" + id.to_string());
    const auto mapped =
        asio::ip::make_address_v6(asio::ip::v4_mapped, asio::ip::make_address_v4("10.1.2.3"));
    CHECK(to_address(tcp::endpoint(mapped, 5)).to_string() == "/ip4/10.1.2.3/tcp/5");
    asio::ip::address_v6 scoped = asio::ip::make_address_v6("fe80::1");
    scoped.scope_id(2);
    CHECK(to_address(tcp::endpoint(scoped, 5)).to_string() == "/ip6/fe80::1/tcp/5");

    // Round trip through both conversions.
    for (const auto* text :
         {"/ip4/127.0.0.1/tcp/4242", "/ip6/2001:db8::1/tcp/1", "/ip4/0.0.0.0/tcp/0"}) {
        const auto a = peer_address::from_string(text);
        CHECK(to_address(*to_endpoint(a)) == a);
    }
}

TEST_CASE("datagram sockets share the listener's port and exchange datagrams", "[net][tcp]") {
    asio::io_context io;
    transport t(io.get_executor());
    for (const auto& address : {loopback_v4, loopback_v6}) {
        INFO(address.to_string());
        auto l = t.listen(tcp::endpoint(address, 0));
        std::error_code ec;
        auto served = t.open_datagram(l.local_endpoint(), ec);
        REQUIRE_FALSE(ec);
        CHECK(served.local_endpoint() == l.local_endpoint());
        // A second socket on the same port is refused, as for any UDP port.
        auto again = t.open_datagram(l.local_endpoint(), ec);
        CHECK(ec == asio::error::address_in_use);
        CHECK_FALSE(again.is_open());

        const auto client_local = transport::datagram_endpoint_for(l.local_endpoint());
        CHECK(client_local.port() == 0);
        CHECK(client_local.address().is_v6() == address.is_v6());
        auto client = t.open_datagram(tcp::endpoint(address, 0), ec);
        REQUIRE_FALSE(ec);
        CHECK(client.local_endpoint().port() != 0);

        run(io, [&]() -> asio::awaitable<void> {
            const auto token = asio::experimental::as_tuple(asio::use_awaitable);
            const std::string hello = "hello over udp";
            auto [sent_ec, sent] =
                co_await client.async_send_to(asio::buffer(hello), served.local_endpoint(), token);
            REQUIRE_FALSE(sent_ec);
            CHECK(sent == hello.size());
            std::array<char, 65507> buffer;
            tcp::endpoint from;
            auto [ec1, n] = co_await served.async_receive_from(asio::buffer(buffer), from, token);
            REQUIRE_FALSE(ec1);
            CHECK(std::string(buffer.data(), n) == hello);
            CHECK(from == client.local_endpoint());
            // And back to where it came from, with a buffer that cuts it short.
            auto [ec2, unused] = co_await served.async_send_to(asio::buffer(hello), from, token);
            REQUIRE_FALSE(ec2);
            std::array<char, 5> small;
            tcp::endpoint back;
            auto [ec3, m] = co_await client.async_receive_from(asio::buffer(small), back, token);
            CHECK_FALSE(ec3);
            CHECK(std::string(small.data(), m) == "hello");
            CHECK(back == served.local_endpoint());
        }());
    }
}

TEST_CASE("a pending datagram receive ends on close and on cancellation", "[net][tcp]") {
    asio::io_context io;
    transport t(io.get_executor());
    std::error_code ec;
    auto socket = t.open_datagram(tcp::endpoint(loopback_v4, 0), ec);
    REQUIRE_FALSE(ec);
    std::array<char, 16> buffer;
    tcp::endpoint from;
    std::error_code received = errc::internal_error;
    asio::cancellation_signal signal;
    socket.async_receive_from(
        asio::buffer(buffer), from,
        asio::bind_cancellation_slot(signal.slot(),
                                     [&](std::error_code e, std::size_t) { received = e; }));
    asio::post(io, [&] { signal.emit(asio::cancellation_type::terminal); });
    io.run_for(watchdog);
    CHECK(received == asio::error::operation_aborted);

    received = errc::internal_error;
    socket.async_receive_from(asio::buffer(buffer), from,
                              [&](std::error_code e, std::size_t) { received = e; });
    asio::post(io, [&] { socket.close(); });
    io.restart();
    io.run_for(watchdog);
    CHECK(received == asio::error::operation_aborted);
    CHECK_FALSE(socket.is_open());

    std::error_code sent;
    socket.async_send_to(asio::buffer(buffer), tcp::endpoint(loopback_v4, 9),
                         [&](std::error_code e, std::size_t) { sent = e; });
    io.restart();
    io.run_for(watchdog);
    CHECK(sent == asio::error::bad_descriptor);
}

TEST_CASE("a datagram to a port nobody holds comes back as connection_refused, naming the port",
          "[net][tcp]") {
    asio::io_context io;
    transport t(io.get_executor());
    for (const auto& address : {loopback_v4, loopback_v6}) {
        INFO(address.to_string());
        std::error_code ec;
        auto socket = t.open_datagram(tcp::endpoint(address, 0), ec);
        REQUIRE_FALSE(ec);
        // Two ports that were just free: nothing holds them now.
        std::vector<tcp::endpoint> gone;
        for (int i = 0; i < 2; ++i) {
            auto held = t.open_datagram(tcp::endpoint(address, 0), ec);
            REQUIRE_FALSE(ec);
            gone.push_back(held.local_endpoint());
        }
        run(io, [&]() -> asio::awaitable<void> {
            const auto token = asio::experimental::as_tuple(asio::use_awaitable);
            // Both errors are queued before the first wait: each is still handed over. The
            // first one is also pending for the second send, which must not fail for it.
            for (const auto& to : gone) {
                auto [sent_ec, sent] =
                    co_await socket.async_send_to(asio::buffer("x", 1), to, token);
                CHECK_FALSE(sent_ec);
            }
            asio::steady_timer pause(co_await asio::this_coro::executor, 50ms);
            co_await pause.async_wait(token);
            for (const auto& to : gone) {
                tcp::endpoint about;
                auto [wait_ec, reported] = co_await socket.async_receive_error(about, token);
                CHECK_FALSE(wait_ec);
                CHECK(reported == asio::error::connection_refused);
                CHECK(about == to);
            }
            // A refusal still pending does not fail a receive either: with one pending (a
            // datagram to a gone port, and no send since), a datagram from another socket
            // arrives.
            auto [refused_ec, refused] =
                co_await socket.async_send_to(asio::buffer("z", 1), gone.front(), token);
            CHECK_FALSE(refused_ec);
            asio::steady_timer settle(co_await asio::this_coro::executor, 50ms);
            co_await settle.async_wait(token);
            auto other = t.open_datagram(tcp::endpoint(address, 0), ec);
            REQUIRE_FALSE(ec);
            auto [sent_ec, sent] =
                co_await other.async_send_to(asio::buffer("y", 1), socket.local_endpoint(), token);
            CHECK_FALSE(sent_ec);
            std::array<char, 4> buffer{};
            tcp::endpoint from;
            auto [received, n] =
                co_await socket.async_receive_from(asio::buffer(buffer), from, token);
            CHECK_FALSE(received);
            CHECK(from == other.local_endpoint());
            CHECK(std::string(buffer.data(), n) == "y");
        }());
    }

    // A pending wait ends when the socket closes.
    std::error_code ec;
    auto socket = t.open_datagram(tcp::endpoint(loopback_v4, 0), ec);
    REQUIRE_FALSE(ec);
    tcp::endpoint about;
    std::error_code waited = errc::internal_error;
    socket.async_receive_error(about, [&](std::error_code e, std::error_code) { waited = e; });
    asio::post(io, [&] { socket.close(); });
    io.restart();
    io.run_for(watchdog);
    CHECK(waited == asio::error::operation_aborted);
}
