// The RPC suite: every case runs on the simulated network and on loopback TCP.
#include "support/bytes.hpp"
#include "support/descriptors.hpp"
#include "support/echo.hpp"
#include "support/identities.hpp"
#include "support/windows.hpp"
#include "support/worlds.hpp"

#include <hivemesh/core/random.hpp>
#include <hivemesh/net/node.hpp>
#include <hivemesh/net/sim.hpp>
#include <hivemesh/net/tcp.hpp>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/io_context.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

using namespace hivemesh;
using namespace std::chrono_literals;

namespace {

using test::add_echo_handler;
using test::descriptor_squeeze;
using test::identity_of;
using test::random_bytes;
using test::sim_world;
using test::tcp_world;

template <class World>
struct host {
    using node_type = net::node<typename World::transport_type>;
    typename World::transport_type& transport;
    std::unique_ptr<node_type> node;
    typename World::transport_type::endpoint_type endpoint;

    host(World& world, std::uint8_t id, net::node_options options = {})
        : transport(world.add_host())
        , node(std::make_unique<node_type>(transport, identity_of(id), options))
        , endpoint(world.listen(*node, transport)) {}

    typename node_type::peer peer() const { return {node->id(), endpoint}; }
    /// peer() with its key, so that calls may go by datagram.
    typename node_type::peer keyed_peer() const {
        return {node->id(), endpoint, node->identity().public_key()};
    }
};

struct call_outcome {
    bool done = false;
    std::error_code ec;
    byte_buffer response;
};

template <class Node, class Peer>
std::shared_ptr<call_outcome> start_call(Node& node, Peer target, std::string method,
                                         byte_buffer request, duration timeout = 10s) {
    auto outcome = std::make_shared<call_outcome>();
    node.async_call(std::move(target), std::move(method), std::move(request), timeout,
                    [outcome](std::error_code ec, byte_buffer response) {
                        outcome->done = true;
                        outcome->ec = ec;
                        outcome->response = std::move(response);
                    });
    return outcome;
}

template <class World, class Node, class Peer>
call_outcome call(World& world, Node& node, Peer target, std::string method, byte_buffer request,
                  duration timeout = 10s) {
    auto outcome =
        start_call(node, std::move(target), std::move(method), std::move(request), timeout);
    REQUIRE(world.run_until([&] { return outcome->done; }));
    return *outcome;
}

template <class World>
void add_echo(host<World>& h) {
    add_echo_handler(*h.node);
}

/// What the method "slow" (see add_slow) has seen.
struct slow_handler {
    bool started = false;
    bool cancelled = false; ///< its wait ended by cancellation
};

/// A method "slow" that waits an hour of the world's time before it answers.
template <class World>
void add_slow(host<World>& h, slow_handler& seen, net::handler_options how = {}) {
    h.node->add_handler(
        "slow",
        [&seen](const net::call_context&, byte_view,
                byte_buffer&) -> asio::awaitable<std::error_code> {
            seen.started = true;
            typename World::transport_type::timer_type timer(co_await asio::this_coro::executor);
            timer.expires_after(3600s);
            auto [ec] =
                co_await timer.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
            seen.cancelled = ec == asio::error::operation_aborted;
            co_return ec;
        },
        how);
}

/// A method "pause" that answers with its request after `delay` of the world's time;
/// `started` counts the calls it took.
template <class World>
void add_pause(host<World>& h, duration delay, int& started, net::handler_options how = {}) {
    h.node->add_handler(
        "pause",
        [delay, &started](const net::call_context&, byte_view request,
                          byte_buffer& response) -> asio::awaitable<std::error_code> {
            ++started;
            typename World::transport_type::timer_type timer(co_await asio::this_coro::executor);
            timer.expires_after(delay);
            auto [ec] =
                co_await timer.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
            response.assign(request.begin(), request.end());
            co_return ec;
        },
        how);
}

/// Where a node's async_close completed.
struct close_outcome {
    bool done = false;
    std::error_code ec;
};

template <class Node>
std::shared_ptr<close_outcome> start_close(Node& node) {
    auto outcome = std::make_shared<close_outcome>();
    node.async_close([outcome](std::error_code ec) {
        outcome->done = true;
        outcome->ec = ec;
    });
    return outcome;
}

/// A streaming method "sink" that hands every message to `on_message` and ends with ok;
/// with a `pause`, it waits that long of the world's time after each message.
template <class World>
void add_sink(host<World>& h, std::function<void(const byte_buffer&)> on_message,
              duration pause = {}) {
    h.node->add_stream_handler(
        "sink",
        [on_message, pause](const net::call_context&,
                            net::call_stream& stream) -> asio::awaitable<std::error_code> {
            typename World::transport_type::timer_type timer(co_await asio::this_coro::executor);
            while (true) {
                byte_buffer m;
                const auto ec = co_await stream.read(m);
                if (ec == asio::error::eof) co_return std::error_code{};
                if (ec) co_return ec;
                on_message(m);
                if (pause > duration::zero()) {
                    timer.expires_after(pause);
                    co_await timer.async_wait(asio::use_awaitable);
                }
            }
        });
}

/// Streams `chunk` to `to`'s "sink" (see add_sink) until `total` bytes went out, ends the
/// sending side and returns what the next read gives: eof when the handler ended well.
template <class World>
asio::awaitable<std::error_code> upload_to_sink(host<World>& from, host<World>& to,
                                                std::uint64_t total, const byte_buffer& chunk,
                                                duration timeout) {
    net::call_stream stream;
    const auto opened = co_await from.node->open_call(to.peer(), "sink", timeout, stream);
    REQUIRE_FALSE(opened);
    for (std::uint64_t sent = 0; sent < total; sent += chunk.size()) {
        const auto ec = co_await stream.write(chunk);
        REQUIRE_FALSE(ec);
    }
    const auto closed = co_await stream.close_write();
    REQUIRE_FALSE(closed);
    byte_buffer m;
    const auto end = co_await stream.read(m);
    co_return end;
}

template <class Coroutine>
std::shared_ptr<bool> spawn_flag(asio::any_io_executor ex, Coroutine coroutine) {
    auto done = std::make_shared<bool>(false);
    asio::co_spawn(ex, std::move(coroutine), [done](std::exception_ptr e) {
        *done = true;
        if (e) std::rethrow_exception(e);
    });
    return done;
}

} // namespace

TEMPLATE_TEST_CASE("unary calls return exactly what the handler made", "[net][rpc]", sim_world,
                   tcp_world) {
    TestType world;
    host<TestType> server(world, 1), client(world, 2);
    add_echo(server);
    for (const std::size_t size :
         {std::size_t{0}, std::size_t{1}, std::size_t{100000}, std::size_t{3} << 20}) {
        INFO(TestType::name << " size " << size);
        const auto outcome =
            call(world, *client.node, server.peer(), "echo", random_bytes(size, size));
        REQUIRE_FALSE(outcome.ec);
        CHECK(outcome.response == random_bytes(size, size));
    }
    // One connection served every call.
    CHECK(client.node->connection_count() == 1);
    CHECK(server.node->connection_count() == 1);
}

TEMPLATE_TEST_CASE("handler errors, unknown methods and exceptions reach the caller", "[net][rpc]",
                   sim_world, tcp_world) {
    TestType world;
    host<TestType> server(world, 1), client(world, 2);
    server.node->add_handler(
        "fails",
        [](const net::call_context&, byte_view, byte_buffer&) -> asio::awaitable<std::error_code> {
            co_return make_error_code(errc::invalid_argument);
        });
    server.node->add_handler(
        "throws",
        [](const net::call_context&, byte_view, byte_buffer&) -> asio::awaitable<std::error_code> {
            throw std::runtime_error("boom");
            co_return std::error_code{};
        });
    server.node->add_handler("who",
                             [](const net::call_context& context, byte_view,
                                byte_buffer& response) -> asio::awaitable<std::error_code> {
                                 const auto text =
                                     context.remote.to_string() + " " + context.method;
                                 response = to_buffer(as_bytes(text));
                                 co_return std::error_code{};
                             });
    CHECK(call(world, *client.node, server.peer(), "fails", {}).ec == errc::invalid_argument);
    CHECK(call(world, *client.node, server.peer(), "throws", {}).ec == errc::remote_error);
    CHECK(call(world, *client.node, server.peer(), "missing", {}).ec == errc::refused);
    CHECK(call(world, *client.node, server.peer(), "bad name!", {}).ec == errc::invalid_argument);
    const auto who = call(world, *client.node, server.peer(), "who", {});
    REQUIRE_FALSE(who.ec);
    CHECK(as_string_view(who.response) == client.node->id().to_string() + " who");
}

TEMPLATE_TEST_CASE("a deadline ends the call and cancels the handler", "[net][rpc]", sim_world,
                   tcp_world) {
    TestType world;
    host<TestType> server(world, 1), client(world, 2);
    slow_handler slow;
    add_slow(server, slow);
    const auto outcome = call(world, *client.node, server.peer(), "slow", {}, 300ms);
    CHECK(outcome.ec == errc::timeout);
    REQUIRE(world.run_until([&] { return slow.cancelled; }, 10s));
    // The connection survives a timed-out call.
    add_echo(server);
    CHECK_FALSE(call(world, *client.node, server.peer(), "echo", random_bytes(5, 5)).ec);
}

TEST_CASE("open_call_within and within give up at their limit, not at the dial timeout",
          "[net][rpc]") {
    sim_world world;
    host<sim_world> server(world, 1), client(world, 2);
    add_echo(server);
    world.network.partition({server.transport.node()}); // dials to it go unanswered
    using timer = net::sim::timer;
    const time_point start = world.now();
    std::error_code opened;
    time_point opened_at{};
    std::pair<std::error_code, int> timed_out{{}, 7}, cancelled{{}, 7};
    // An hour of the world's time, then 1.
    auto slow = []() -> asio::awaitable<std::pair<std::error_code, int>> {
        timer hour(co_await asio::this_coro::executor);
        hour.expires_after(3600s);
        auto [ec] = co_await hour.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
        co_return std::pair<std::error_code, int>{ec, 1};
    };
    auto body = [&]() -> asio::awaitable<void> {
        net::call_stream stream;
        opened = co_await client.node->open_call_within(server.peer(), "echo", 60s, 400ms, stream);
        opened_at = world.now();
        timed_out = co_await net::within<timer>(slow(), 250ms);
        timer deadline(co_await asio::this_coro::executor);
        deadline.expires_after(3600s);
        auto give_up = [&]() -> asio::awaitable<void> {
            timer soon(co_await asio::this_coro::executor);
            soon.expires_after(100ms);
            co_await soon.async_wait(asio::use_awaitable);
            deadline.cancel();
        };
        asio::co_spawn(co_await asio::this_coro::executor, give_up(), asio::detached);
        cancelled = co_await net::within(slow(), deadline);
    };
    auto done = spawn_flag(world.io.get_executor(), body());
    REQUIRE(world.run_until([&] { return *done; }, 60s));
    CHECK(opened == errc::timeout);
    CHECK(opened_at - start == 400ms); // the node's dial_timeout is 10 s
    CHECK(timed_out.first == errc::timeout);
    CHECK(timed_out.second == 0);
    CHECK(cancelled.first == errc::cancelled);
    CHECK(cancelled.second == 0);
    CHECK(world.now() - start < 1s);
}

TEMPLATE_TEST_CASE("cancelling a call through its slot cancels the handler", "[net][rpc]",
                   sim_world, tcp_world) {
    TestType world;
    host<TestType> server(world, 1), client(world, 2);
    slow_handler slow;
    add_slow(server, slow);
    asio::cancellation_signal signal;
    auto outcome = std::make_shared<call_outcome>();
    client.node->async_call(
        server.peer(), "slow", byte_buffer{}, 3600s,
        asio::bind_cancellation_slot(signal.slot(), [outcome](std::error_code ec, byte_buffer) {
            outcome->done = true;
            outcome->ec = ec;
        }));
    REQUIRE(world.run_until([&] { return slow.started; }));
    signal.emit(asio::cancellation_type::terminal);
    REQUIRE(world.run_until([&] { return outcome->done && slow.cancelled; }, 10s));
    CHECK(outcome->ec == errc::cancelled);
}

TEMPLATE_TEST_CASE("1000 concurrent unary calls between two peers", "[net][rpc]", sim_world,
                   tcp_world) {
    TestType world;
    host<TestType> server(world, 1), client(world, 2);
    add_echo(server);
    std::vector<std::shared_ptr<call_outcome>> outcomes;
    for (int i = 0; i < 1000; ++i)
        outcomes.push_back(start_call(*client.node, server.peer(), "echo",
                                      random_bytes(static_cast<std::size_t>(i % 97), i), 60s));
    REQUIRE(world.run_until([&] {
        return std::all_of(outcomes.begin(), outcomes.end(), [](auto& o) { return o->done; });
    }));
    int exact = 0;
    for (int i = 0; i < 1000; ++i)
        exact += !outcomes[static_cast<std::size_t>(i)]->ec &&
                 outcomes[static_cast<std::size_t>(i)]->response ==
                     random_bytes(static_cast<std::size_t>(i % 97), i);
    CHECK(exact == 1000);
    CHECK(client.node->connection_count() == 1);
}

TEMPLATE_TEST_CASE("dialing the wrong PeerId, a wrong swarm key or a closed port fails cleanly",
                   "[net][rpc]", sim_world, tcp_world) {
    TestType world;
    host<TestType> server(world, 1), client(world, 2);
    add_echo(server);
    auto impostor = server.peer();
    impostor.id = identity_of(3).id();
    CHECK(call(world, *client.node, impostor, "echo", {}).ec == errc::peer_id_mismatch);

    net::node_options keyed;
    keyed.security.swarm_key.emplace();
    keyed.security.swarm_key->fill(std::byte{7});
    host<TestType> outsider(world, 4, keyed);
    CHECK(call(world, *outsider.node, server.peer(), "echo", {}).ec == errc::handshake_failed);

    auto closed = server.peer();
    server.node->close();
    world.settle();
    const auto refused = call(world, *client.node, closed, "echo", {});
    CHECK(refused.ec == errc::refused);
    // Nothing is left half-open on either side.
    CHECK(client.node->connection_count() == 0);
}

TEMPLATE_TEST_CASE("streaming calls: upload, download and echo", "[net][rpc]", sim_world,
                   tcp_world) {
    TestType world;
    host<TestType> server(world, 1), client(world, 2);
    // Sums the bytes of every message the caller sends, then replies with 3 messages.
    server.node->add_stream_handler(
        "sum",
        [](const net::call_context&, net::call_stream& stream) -> asio::awaitable<std::error_code> {
            std::uint64_t total = 0;
            while (true) {
                byte_buffer m;
                const auto ec = co_await stream.read(m);
                if (ec == asio::error::eof) break;
                if (ec) co_return ec;
                for (auto b : m)
                    total += static_cast<std::uint8_t>(b);
            }
            for (int i = 0; i < 3; ++i) {
                byte_buffer out;
                binary_writer(out).write(total + static_cast<std::uint64_t>(i));
                std::error_code ec;
                if (i == 1) { // the form for one buffer written to many streams
                    auto shared = std::make_shared<const byte_buffer>(std::move(out));
                    ec = co_await stream.write(std::move(shared));
                } else {
                    ec = co_await stream.write(std::move(out));
                }
                if (ec) co_return ec;
            }
            co_return std::error_code{};
        });
    server.node->add_stream_handler(
        "refuse",
        [](const net::call_context&, net::call_stream&) -> asio::awaitable<std::error_code> {
            co_return make_error_code(errc::invalid_argument);
        });

    std::uint64_t expected = 0;
    std::vector<std::uint64_t> replies;
    std::error_code final_status = errc::corrupt_data, refused_status;
    auto done = spawn_flag(client.node->get_executor(), [&]() -> asio::awaitable<void> {
        net::call_stream stream;
        const auto opened = co_await client.node->open_call(server.peer(), "sum", 60s, stream);
        REQUIRE_FALSE(opened);
        for (int i = 0; i < 20; ++i) {
            auto m = random_bytes(static_cast<std::size_t>(i) * 1000, i);
            for (auto b : m)
                expected += static_cast<std::uint8_t>(b);
            const auto ec = co_await stream.write(std::move(m));
            REQUIRE_FALSE(ec);
        }
        const auto closed = co_await stream.close_write();
        REQUIRE_FALSE(closed);
        while (true) { // both forms of read(): copied out, and viewed in place
            byte_buffer m;
            byte_view body;
            std::error_code ec;
            if (replies.size() % 2 == 0) {
                ec = co_await stream.read(m);
                body = m;
            } else {
                ec = co_await stream.read(m, body);
            }
            if (ec) {
                final_status = ec == asio::error::eof ? std::error_code{} : ec;
                break;
            }
            binary_reader r(body);
            replies.push_back(r.read<std::uint64_t>());
            CHECK(r.finish() == std::error_code{});
        }

        net::call_stream refused;
        const auto opened2 = co_await client.node->open_call(server.peer(), "refuse", 60s, refused);
        REQUIRE_FALSE(opened2);
        byte_buffer m;
        refused_status = co_await refused.read(m);
    });
    REQUIRE(world.run_until([&] { return *done; }));
    CHECK_FALSE(final_status);
    REQUIRE(replies.size() == 3);
    CHECK(replies[0] == expected);
    CHECK(replies[1] == expected + 1);
    CHECK(replies[2] == expected + 2);
    CHECK(refused_status == errc::invalid_argument);
}

TEMPLATE_TEST_CASE("a small call is answered while a large stream runs on the connection",
                   "[net][rpc]", sim_world, tcp_world) {
    TestType world;
    if constexpr (std::is_same_v<TestType, sim_world>)
        world.network.set_default_link({5ms, 100'000'000, 0.0}); // 100 MB/s, 5 ms
    host<TestType> server(world, 1), client(world, 2);
    add_echo(server);
    std::size_t received = 0;
    add_sink(server, [&](const byte_buffer& m) { received += m.size(); });
    constexpr std::size_t total = std::size_t{64} << 20;
    bool upload_done = false;
    bool small_answered_during_upload = false;
    auto done = spawn_flag(client.node->get_executor(), [&]() -> asio::awaitable<void> {
        const auto chunk = random_bytes(1 << 20, 1);
        const auto end = co_await upload_to_sink(client, server, total, chunk, 600s);
        CHECK(end == asio::error::eof);
        upload_done = true;
    });
    REQUIRE(world.run_until([&] { return received >= (8u << 20); }));
    auto small = start_call(*client.node, server.peer(), "echo", random_bytes(10, 3), 600s);
    REQUIRE(world.run_until([&] { return small->done; }));
    small_answered_during_upload = !upload_done && received < total;
    CHECK_FALSE(small->ec);
    CHECK(small_answered_during_upload);
    REQUIRE(world.run_until([&] { return *done; }));
    CHECK(received == total);
}

TEMPLATE_TEST_CASE("a peer restarting with the same identity is reachable again", "[net][rpc]",
                   sim_world, tcp_world) {
    TestType world;
    host<TestType> client(world, 2);
    auto& server_transport = world.add_host();
    using node_type = net::node<typename TestType::transport_type>;
    auto server = std::make_unique<node_type>(server_transport, identity_of(1));
    const auto endpoint = world.listen(*server, server_transport);
    const typename node_type::peer target{server->id(), endpoint};
    add_echo_handler(*server);
    CHECK_FALSE(call(world, *client.node, target, "echo", random_bytes(3, 3)).ec);

    server.reset(); // the process dies; the client's connection breaks
    world.settle();
    CHECK(call(world, *client.node, target, "echo", {}, 2s).ec);

    server = std::make_unique<node_type>(server_transport, identity_of(1));
    world.listen_at(*server, server_transport, endpoint);
    add_echo_handler(*server);
    const auto again = call(world, *client.node, target, "echo", random_bytes(4, 4));
    CHECK_FALSE(again.ec);
    CHECK(again.response == random_bytes(4, 4));
}

TEMPLATE_TEST_CASE("idle connections are closed", "[net][rpc]", sim_world, tcp_world) {
    TestType world;
    net::node_options options;
    options.idle_timeout = 200ms;
    host<TestType> server(world, 1, options), client(world, 2, options);
    add_echo(server);
    CHECK_FALSE(call(world, *client.node, server.peer(), "echo", {}).ec);
    CHECK(client.node->connection_count() == 1);
    REQUIRE(world.run_until([&] {
        return client.node->connection_count() == 0 && server.node->connection_count() == 0;
    }));
    // And a new call simply dials again.
    CHECK_FALSE(call(world, *client.node, server.peer(), "echo", {}).ec);
}

TEMPLATE_TEST_CASE("two nodes that dialed each other at once both call over the connection the "
                   "smaller PeerId dialed, and the other one closes when idle",
                   "[net][rpc]", sim_world, tcp_world) {
    TestType world;
    net::node_options options;
    options.idle_timeout = 300ms;
    host<TestType> a(world, 1, options), b(world, 2, options);
    add_echo(a);
    add_echo(b);
    // Both calls start before either dial completes, so each node dials the other.
    const auto there = start_call(*a.node, b.peer(), "echo", random_bytes(4, 1));
    const auto back = start_call(*b.node, a.peer(), "echo", random_bytes(4, 2));
    REQUIRE(world.run_until([&] { return there->done && back->done; }));
    CHECK_FALSE(there->ec);
    CHECK_FALSE(back->ec);
    REQUIRE(a.node->connection_count() == 2);
    REQUIRE(b.node->connection_count() == 2);

    // Streams opened so far on the connection `h` dialed (first) and on the one it accepted.
    const auto streams = [](host<TestType>& h) {
        std::pair<std::uint64_t, std::uint64_t> out;
        for (const auto& c : h.node->connections())
            (c.dialed ? out.first : out.second) = c.statistics.streams_opened;
        return out;
    };
    const bool a_is_smaller = a.node->id() < b.node->id();
    const auto before_a = streams(a), before_b = streams(b);
    constexpr int calls = 10;
    for (int i = 0; i < calls; ++i) {
        CHECK_FALSE(call(world, *a.node, b.peer(), "echo", random_bytes(4, i)).ec);
        CHECK_FALSE(call(world, *b.node, a.peer(), "echo", random_bytes(4, i)).ec);
    }
    const auto after_a = streams(a), after_b = streams(b);
    // a's dialed connection is b's accepted one, and the other way round.
    const std::uint64_t on_a_dial = after_a.first - before_a.first;
    const std::uint64_t on_b_dial = after_a.second - before_a.second;
    CHECK(after_b.second - before_b.second == on_a_dial);
    CHECK(after_b.first - before_b.first == on_b_dial);
    CHECK(on_a_dial == (a_is_smaller ? 2 * calls : 0));
    CHECK(on_b_dial == (a_is_smaller ? 0 : 2 * calls));

    // Calls every 50 ms keep the preferred connection busy; the other closes within two
    // idle timeouts on both nodes.
    for (int i = 0; i < 40 && (a.node->connection_count() > 1 || b.node->connection_count() > 1);
         ++i) {
        CHECK_FALSE(call(world, *a.node, b.peer(), "echo", {}).ec);
        const time_point t0 = world.now();
        REQUIRE(world.run_until([&] { return world.now() - t0 >= 50ms; }));
    }
    REQUIRE(a.node->connection_count() == 1);
    REQUIRE(b.node->connection_count() == 1);
    CHECK(a.node->connections().front().dialed == a_is_smaller);
    CHECK(b.node->connections().front().dialed == !a_is_smaller);
}

TEMPLATE_TEST_CASE("peers that met resume their handshakes, dialing either way, until the "
                   "ticket expires",
                   "[net][rpc]", sim_world, tcp_world) {
    TestType world;
    net::node_options options;
    options.idle_timeout = 100ms;
    options.resumption_lifetime = 1500ms;
    host<TestType> server(world, 1, options), client(world, 2, options);
    add_echo(server);
    add_echo(client);
    const auto resumed = [](host<TestType>& h) { return h.node->statistics().handshakes_resumed; };
    // One call on a fresh connection, once the last one closed on both sides.
    const auto call_fresh = [&](host<TestType>& from, host<TestType>& to) {
        REQUIRE(world.run_until([&] {
            return from.node->connection_count() == 0 && to.node->connection_count() == 0;
        }));
        const auto outcome = call(world, *from.node, to.peer(), "echo", random_bytes(5, 5));
        CHECK_FALSE(outcome.ec);
        CHECK(outcome.response == random_bytes(5, 5));
    };

    const time_point met = world.now();
    call_fresh(client, server);
    CHECK(resumed(client) == 0);
    CHECK(resumed(server) == 0);
    call_fresh(client, server);
    CHECK(resumed(client) == 1);
    CHECK(resumed(server) == 1);
    call_fresh(server, client); // the listener of the full handshake dials with its ticket
    CHECK(resumed(client) == 2);
    CHECK(resumed(server) == 2);
    CHECK(client.node->statistics().handshakes_completed == 3);
    CHECK(server.node->statistics().handshakes_completed == 3);

    // Past the lifetime the next handshake is full, and it leaves a new ticket. (The first
    // ticket dates from its handshake, a little after `met`: a second of slack for TCP.)
    REQUIRE(world.run_until([&] { return world.now() - met > 2500ms; }));
    call_fresh(client, server);
    CHECK(resumed(client) == 2);
    call_fresh(client, server);
    CHECK(resumed(client) == 3);
    CHECK(resumed(server) == 3);

    // A server restarted with the same identity holds no tickets: the client's offer gets a
    // full handshake, and the call succeeds.
    REQUIRE(world.run_until([&] { return client.node->connection_count() == 0; }));
    server.node.reset();
    world.settle();
    server.node = std::make_unique<typename host<TestType>::node_type>(server.transport,
                                                                       identity_of(1), options);
    world.listen_at(*server.node, server.transport, server.endpoint);
    add_echo(server);
    call_fresh(client, server);
    CHECK(resumed(client) == 3);
    CHECK(resumed(server) == 0);
    call_fresh(client, server);
    CHECK(resumed(client) == 4);

    // With a lifetime of 0 a node neither offers nor accepts tickets.
    net::node_options never = options;
    never.resumption_lifetime = duration::zero();
    host<TestType> other(world, 3, never);
    add_echo(other);
    call_fresh(other, server);
    call_fresh(other, server);
    call_fresh(server, other);
    CHECK(resumed(other) == 0);
    CHECK(resumed(server) == 1); // the server's offer got a full handshake
}

/// The peers `node` holds connections to, as text.
template <class Node>
std::set<std::string> remotes(const Node& node) {
    std::set<std::string> out;
    for (const auto& info : node.connections())
        out.insert(info.remote.to_string());
    return out;
}

TEMPLATE_TEST_CASE("max_connections closes the least recently used idle connection", "[net][rpc]",
                   sim_world, tcp_world) {
    TestType world;
    net::node_options capped;
    capped.max_connections = 2;
    host<TestType> client(world, 1, capped), a(world, 2), b(world, 3), c(world, 4);
    using timer_type = typename TestType::transport_type::timer_type;
    std::vector<timer_type*> held; // "hold" calls in progress, released by cancelling
    for (auto* h : {&a, &b, &c}) {
        add_echo(*h);
        h->node->add_handler("hold",
                             [&held](const net::call_context&, byte_view,
                                     byte_buffer&) -> asio::awaitable<std::error_code> {
                                 timer_type timer(co_await asio::this_coro::executor);
                                 timer.expires_after(3600s);
                                 held.push_back(&timer);
                                 co_await timer.async_wait(
                                     asio::experimental::as_tuple(asio::use_awaitable));
                                 std::erase(held, &timer);
                                 co_return std::error_code{};
                             });
    }
    REQUIRE_FALSE(call(world, *client.node, a.peer(), "echo", {}).ec);
    REQUIRE_FALSE(call(world, *client.node, b.peer(), "echo", {}).ec);
    REQUIRE_FALSE(call(world, *client.node, a.peer(), "echo", {}).ec); // b is now the oldest
    REQUIRE_FALSE(call(world, *client.node, c.peer(), "echo", {}).ec);
    CHECK(remotes(*client.node) ==
          std::set<std::string>{a.node->id().to_string(), c.node->id().to_string()});
    REQUIRE(world.run_until([&] { return b.node->connection_count() == 0; }));

    // Busy connections are never closed: the cap is exceeded instead of failing a call.
    auto on_a = start_call(*client.node, a.peer(), "hold", {}, 3600s);
    auto on_c = start_call(*client.node, c.peer(), "hold", {}, 3600s);
    REQUIRE(world.run_until([&] { return held.size() == 2; }));
    const auto to_b = call(world, *client.node, b.peer(), "echo", random_bytes(7, 7));
    CHECK_FALSE(to_b.ec);
    CHECK(to_b.response == random_bytes(7, 7));
    CHECK(client.node->connection_count() == 3);
    for (auto* timer : std::vector<timer_type*>(held))
        timer->cancel();
    REQUIRE(world.run_until([&] { return on_a->done && on_c->done; }));
    CHECK_FALSE(on_a->ec);
    CHECK_FALSE(on_c->ec);

    // Connections that have not carried their first call yet are never closed: calls
    // started together to more peers than the cap all succeed.
    host<TestType> burst(world, 6, capped);
    std::vector<std::shared_ptr<call_outcome>> together;
    for (auto* h : {&a, &b, &c})
        together.push_back(start_call(*burst.node, h->peer(), "echo", random_bytes(9, 9)));
    REQUIRE(world.run_until([&] {
        return std::all_of(together.begin(), together.end(), [](auto& o) { return o->done; });
    }));
    for (const auto& outcome : together)
        CHECK_FALSE(outcome->ec);

    // Accepted connections count too: a capped server keeps only its newest idle one.
    net::node_options one;
    one.max_connections = 1;
    host<TestType> server(world, 5, one);
    add_echo(server);
    REQUIRE_FALSE(call(world, *a.node, server.peer(), "echo", {}).ec);
    REQUIRE_FALSE(call(world, *b.node, server.peer(), "echo", {}).ec);
    CHECK(remotes(*server.node) == std::set<std::string>{b.node->id().to_string()});
    REQUIRE(
        world.run_until([&] { return !remotes(*a.node).contains(server.node->id().to_string()); }));
}

TEMPLATE_TEST_CASE("messages of every size around the frame size cross exactly, in both security "
                   "modes",
                   "[net][rpc]", sim_world, tcp_world) {
    // Plaintext sessions read large frames straight into the message (placement),
    // encrypted ones through the read buffer: both must deliver every byte in order.
    const bool plaintext = GENERATE(false, true);
    CAPTURE(plaintext);
    TestType world;
    net::node_options options;
    options.security.plaintext = plaintext;
    host<TestType> server(world, 1, options), client(world, 2, options);
    add_echo(server);
    server.node->add_stream_handler(
        "echo_stream",
        [](const net::call_context&, net::call_stream& stream) -> asio::awaitable<std::error_code> {
            while (true) {
                byte_buffer m;
                const auto ec = co_await stream.read(m);
                if (ec == asio::error::eof) co_return std::error_code{};
                if (ec) co_return ec;
                if (auto written = co_await stream.write(std::move(m))) co_return written;
            }
        });
    const std::size_t frame =
        plaintext ? options.mux.frame_payload : options.mux.encrypted_frame_payload;
    const std::vector<std::size_t> sizes = {
        0, 1, 16 << 10, frame - 1, frame, frame + 1, 3 * frame + 5, 100, (2 << 20) + 3};
    std::size_t echoed = 0;
    auto done = spawn_flag(client.node->get_executor(), [&]() -> asio::awaitable<void> {
        net::call_stream stream;
        const auto opened =
            co_await client.node->open_call(server.peer(), "echo_stream", 600s, stream);
        REQUIRE_FALSE(opened);
        for (std::size_t i = 0; i < sizes.size(); ++i) {
            const auto written = co_await stream.write(random_bytes(sizes[i], i));
            REQUIRE_FALSE(written);
            byte_buffer back;
            const auto read = co_await stream.read(back);
            REQUIRE_FALSE(read);
            CAPTURE(i, sizes[i]);
            REQUIRE(back == random_bytes(sizes[i], i));
            ++echoed;
        }
        const auto closed = co_await stream.close_write();
        REQUIRE_FALSE(closed);
        byte_buffer none;
        const auto end = co_await stream.read(none);
        CHECK(end == asio::error::eof);
    });
    // A unary call on the same connection meanwhile.
    const auto small = call(world, *client.node, server.peer(), "echo", random_bytes(10, 99));
    CHECK_FALSE(small.ec);
    CHECK(small.response == random_bytes(10, 99));
    REQUIRE(world.run_until([&] { return *done; }));
    CHECK(echoed == sizes.size());
}

TEMPLATE_TEST_CASE("1 GiB streams through one call with bounded buffering", "[net][rpc]", sim_world,
                   tcp_world) {
    TestType world;
    net::node_options options;
    options.mux.initial_window = 4u << 20;
    host<TestType> server(world, 1, options), client(world, 2, options);
    std::uint64_t received = 0, checksum = 0;
    add_sink(server, [&](const byte_buffer& m) {
        received += m.size();
        checksum += static_cast<std::uint8_t>(m[m.size() / 2]);
    });
    constexpr std::uint64_t total = std::uint64_t{1} << 30;
    constexpr std::size_t chunk_size = std::size_t{1} << 20;
    const auto chunk = random_bytes(chunk_size, 7);
    std::error_code status = errc::corrupt_data;
    auto done = spawn_flag(client.node->get_executor(), [&]() -> asio::awaitable<void> {
        const auto end = co_await upload_to_sink(client, server, total, chunk, 3600s);
        status = end == asio::error::eof ? std::error_code{} : end;
    });
    REQUIRE(world.run_until([&] { return *done; }));
    CHECK_FALSE(status);
    CHECK(received == total);
    CHECK(checksum == (total / chunk_size) * static_cast<std::uint8_t>(chunk[chunk_size / 2]));
    // The receiver never held more than its window plus the message being assembled: the
    // sender waited for credit instead of piling data up.
    const auto connections = server.node->connections();
    REQUIRE(connections.size() == 1);
    CHECK(connections[0].statistics.payload_received >= total);
    CHECK(connections[0].statistics.peak_buffered <= options.mux.initial_window + chunk_size);
}

namespace {

/// A monotonic reading of `world`'s time: virtual on the simulated network, the steady clock
/// on TCP (the wall clock may jump).
template <class World>
duration steady_now([[maybe_unused]] World& world) {
    if constexpr (std::is_same_v<World, sim_world>)
        return world.now().time_since_epoch();
    else
        return std::chrono::duration_cast<duration>(
            std::chrono::steady_clock::now().time_since_epoch());
}

duration in_seconds(double seconds) {
    return std::chrono::duration_cast<duration>(std::chrono::duration<double>(seconds));
}

} // namespace

TEMPLATE_TEST_CASE("a node's upload and download caps hold over every window, beyond one burst",
                   "[net][rpc][rate]", sim_world, tcp_world) {
    constexpr bool on_sim = std::is_same_v<TestType, sim_world>;
    // The simulated network: 1 MB/s for 20 MB, 20 s of exact virtual time. TCP: 2 MB/s for
    // 6 MB, 3 s of real time, of which only a lower bound holds on a loaded machine.
    const double rate = on_sim ? 1e6 : 2e6;
    constexpr std::size_t chunk_size = 16 * 1024; // within a frame: one record a message
    const std::uint64_t total = (on_sim ? 1'220 : 366) * std::uint64_t{chunk_size};
    const std::size_t burst = net::rate_limit_burst(rate);
    net::node_options sender_options, receiver_options;
    [[maybe_unused]] bool upload = true; // read on the simulated network only
    SECTION("the sender's upload cap") {
        sender_options.max_upload_rate = rate;
    }
    SECTION("the receiver's download cap") {
        receiver_options.max_download_rate = rate;
        upload = false;
    }
    TestType world;
    host<TestType> receiver(world, 1, receiver_options), sender(world, 2, sender_options);
    std::vector<test::timed_bytes> arrivals;
    add_sink(receiver, [&](const byte_buffer& m) {
        arrivals.push_back({steady_now(world), m.size()});
    });
    const auto chunk = random_bytes(chunk_size, 5);
    const duration start = steady_now(world);
    auto done = spawn_flag(sender.node->get_executor(), [&]() -> asio::awaitable<void> {
        const auto end = co_await upload_to_sink(sender, receiver, total, chunk, 600s);
        CHECK(end == asio::error::eof);
    });
    REQUIRE(world.run_until([&] { return *done; }, 3600s));
    REQUIRE(arrivals.size() == total / chunk_size);
    const duration took = arrivals.back().at - start;
    // The caps count the bytes on the stream, more than the payload: in `took` at most
    // rate x took + burst of them moved.
    CHECK(took >= in_seconds(static_cast<double>(total - burst) / rate));
    if constexpr (on_sim) {
        // A message counts when its last byte arrives, so a window may also hold the part of
        // one message that came before it.
        CHECK(test::busiest_window(arrivals, 1s) <=
              static_cast<std::uint64_t>(rate) + burst + chunk_size);
        // The cap is used, not only kept: the transfer ran at 95% of it or more.
        CHECK(took <= in_seconds(static_cast<double>(total) / (0.95 * rate)));
        // Every read or write past the first burst waited for the bucket.
        const auto sent = sender.node->statistics();
        const auto received = receiver.node->statistics();
        CHECK((upload ? sent.upload_delayed_bytes : received.download_delayed_bytes) >=
              total - burst);
        CHECK((upload ? sent.upload_delay : received.download_delay) > 0s);
        CHECK((upload ? received.download_delayed_bytes : sent.upload_delayed_bytes) == 0);
    }
}

TEST_CASE("a node's upload cap holds for all its connections together", "[net][rpc][rate]") {
    sim_world world;
    constexpr double rate = 1e6;
    constexpr std::size_t chunk_size = 16 * 1024;
    constexpr std::uint64_t each = 300 * std::uint64_t{chunk_size}; // 5 MB to each of two peers
    const std::size_t burst = net::rate_limit_burst(rate);
    net::node_options capped;
    capped.max_upload_rate = rate;
    host<sim_world> first(world, 1), second(world, 2), sender(world, 3, capped);
    // Both sinks run on the one simulated thread: `arrivals` is in time order.
    std::vector<test::timed_bytes> arrivals;
    for (auto* to : {&first, &second})
        add_sink(*to, [&](const byte_buffer& m) {
            arrivals.push_back({steady_now(world), m.size()});
        });
    const auto chunk = random_bytes(chunk_size, 6);
    const duration start = steady_now(world);
    std::vector<std::shared_ptr<bool>> done;
    for (auto* to : {&first, &second})
        done.push_back(spawn_flag(sender.node->get_executor(), [&, to]() -> asio::awaitable<void> {
            const auto end = co_await upload_to_sink(sender, *to, each, chunk, 600s);
            CHECK(end == asio::error::eof);
        }));
    REQUIRE(world.run_until([&] { return *done[0] && *done[1]; }, 3600s));
    REQUIRE(arrivals.size() == 2 * each / chunk_size);
    REQUIRE(sender.node->connection_count() == 2);
    // One message a connection may straddle a window's start.
    CHECK(test::busiest_window(arrivals, 1s) <=
          static_cast<std::uint64_t>(rate) + burst + 2 * chunk_size);
    CHECK(arrivals.back().at - start >= in_seconds(static_cast<double>(2 * each - burst) / rate));
}

namespace {

/// Uploads to sinks over a simulated link, the same both ways, whose simulated TCP buffers
/// are no limit: what limits a stream is its window, the link or the reader, which takes
/// `read_pause` a message.
struct long_link {
    sim_world world;
    host<sim_world> receiver, sender;
    std::vector<test::timed_bytes> arrivals; ///< of every message, at its last byte

    static constexpr std::size_t chunk_size = std::size_t{1} << 20;
    const byte_buffer chunk = random_bytes(chunk_size, 9);

    static net::sim::network_config config_for(const net::sim::link_properties& link) {
        net::sim::network_config config;
        config.default_link = link;
        config.send_buffer_size = std::size_t{256} << 20;
        return config;
    }

    long_link(const net::sim::link_properties& link, const net::node_options& options,
              duration read_pause = {})
        : world(config_for(link))
        , receiver(world, 1, options)
        , sender(world, 2, options) {
        add_sink(
            receiver,
            [this](const byte_buffer& m) {
                arrivals.push_back({steady_now(world), m.size()});
            },
            read_pause);
    }

    /// Runs `count` uploads of `each` bytes at once, on one connection.
    void upload(std::uint64_t each, int count = 1) {
        std::vector<std::shared_ptr<bool>> done;
        for (int i = 0; i < count; ++i)
            done.push_back(spawn_flag(sender.node->get_executor(), [&]() -> asio::awaitable<void> {
                const auto end = co_await upload_to_sink(sender, receiver, each, chunk, 3600s);
                CHECK(end == asio::error::eof);
            }));
        REQUIRE(world.run_until(
            [&] { return std::all_of(done.begin(), done.end(), [](auto& d) { return *d; }); },
            3600s));
    }

    /// Bytes per second over the arrivals from the `from`-th on.
    double rate_from(std::size_t from) const {
        const double seconds =
            std::chrono::duration<double>(arrivals.back().at - arrivals[from].at).count();
        return static_cast<double>((arrivals.size() - 1 - from) * chunk_size) / seconds;
    }

    net::mux_statistics statistics() const {
        const auto connections = receiver.node->connections();
        REQUIRE(connections.size() == 1);
        return connections[0].statistics;
    }
};

constexpr double gigabit = 125e6; // bytes per second

} // namespace

TEST_CASE("a stream over a long, fast link widens its window until the link limits it",
          "[net][rpc]") {
    // 1 Gbit/s and 100 ms round trips: a 2 MiB window alone allows 21 MB/s.
    net::node_options options;
    const double window = options.mux.initial_window;
    SECTION("windows grow") {
        long_link run({50ms, 125'000'000, 0.0}, options);
        run.upload(std::uint64_t{128} << 20);
        // Once grown, the stream runs at the link's rate (1 MiB messages: within 2%).
        CHECK(run.rate_from(run.arrivals.size() / 2) >= 0.98 * gigabit);
        const auto st = run.statistics();
        CHECK(st.widest_window == options.mux.max_window);
        CHECK(st.peak_window_growth == options.mux.max_window - options.mux.initial_window);
        CHECK(st.peak_buffered <= options.mux.max_window + long_link::chunk_size);
        // A later stream on the connection gets the grown window with its first credit.
        run.arrivals.clear();
        run.upload(std::uint64_t{32} << 20);
        CHECK(run.rate_from(0) >= 0.7 * gigabit); // its first round trip runs at 2 MiB
    }
    SECTION("max_window at initial_window keeps them fixed") {
        options.mux.max_window = options.mux.initial_window;
        long_link run({50ms, 125'000'000, 0.0}, options);
        run.upload(std::uint64_t{32} << 20);
        CHECK(run.rate_from(0) <= window / 0.1);
        CHECK(run.rate_from(0) >= 0.8 * window / 0.1);
        CHECK(run.statistics().widest_window == options.mux.initial_window);
        CHECK(run.statistics().peak_window_growth == 0);
    }
}

TEST_CASE("a window stays as it is while the reader or the link limits its stream", "[net][rpc]") {
    net::node_options options;
    SECTION("a reader taking 200 ms a megabyte, a quarter of the window a round trip") {
        long_link run({50ms, 125'000'000, 0.0}, options, 200ms);
        run.upload(std::uint64_t{16} << 20);
        CHECK(run.rate_from(0) <= 1.05 * long_link::chunk_size / 0.2);
        CHECK(run.statistics().widest_window == options.mux.initial_window);
    }
    SECTION("a link of 40 Mbit/s, whose 100 ms round trip holds a quarter of the window") {
        long_link run({50ms, 5'000'000, 0.0}, options);
        run.upload(std::uint64_t{24} << 20);
        CHECK(run.rate_from(0) >= 0.95 * 5e6);
        CHECK(run.statistics().widest_window == options.mux.initial_window);
    }
}

TEST_CASE("the windows of a connection's streams grow within its budget, and a finished "
          "stream gives its share back",
          "[net][rpc]") {
    net::node_options options;
    options.mux.max_window_growth = options.mux.max_window - options.mux.initial_window;
    long_link run({50ms, 125'000'000, 0.0}, options);
    run.upload(std::uint64_t{48} << 20, 3); // three streams, room for one to grow in full
    CHECK(run.statistics().peak_window_growth == options.mux.max_window_growth);
    run.arrivals.clear();
    run.upload(std::uint64_t{128} << 20); // alone: runs at the link's rate once grown
    CHECK(run.rate_from(run.arrivals.size() / 2) >= 0.98 * gigabit);
    CHECK(run.statistics().peak_window_growth == options.mux.max_window_growth);
}

TEST_CASE("under an upload cap, a small call waits for one burst of bulk data, not for a "
          "megabyte of it",
          "[net][rpc][rate]") {
    sim_world world;
    world.network.set_default_link({5ms, 100'000'000, 0.0});
    constexpr double rate = 1e6; // a burst of 64 KiB: 66 ms at the cap
    net::node_options capped;
    capped.max_upload_rate = rate;
    host<sim_world> server(world, 1), client(world, 2, capped);
    add_echo(server);
    std::uint64_t received = 0;
    add_sink(server, [&](const byte_buffer& m) { received += m.size(); });
    constexpr std::uint64_t total = std::uint64_t{8} << 20;
    auto done = spawn_flag(client.node->get_executor(), [&]() -> asio::awaitable<void> {
        const auto chunk = random_bytes(1 << 20, 7);
        const auto end = co_await upload_to_sink(client, server, total, chunk, 600s);
        CHECK(end == asio::error::eof);
    });
    REQUIRE(world.run_until([&] { return received >= (2u << 20); }, 60s));
    const auto asked = world.now();
    auto small = start_call(*client.node, server.peer(), "echo", random_bytes(10, 8), 60s);
    REQUIRE(world.run_until([&] { return small->done; }, 60s));
    CHECK_FALSE(small->ec);
    CHECK(received < total);
    // The request waits for at most three writes of a burst each (66 ms at the cap): the rest
    // of the batch being written, the bulk stream's next turn and its own. With megabyte
    // batches it waited a second or more.
    CHECK(world.now() - asked <= 250ms);
    REQUIRE(world.run_until([&] { return *done; }, 60s));
    CHECK(received == total);
}

TEST_CASE("an accept that keeps failing (no descriptors left) is retried after pauses, not in a "
          "busy loop, and the node accepts again once it can",
          "[net][rpc][tcp]") {
#ifdef HIVEMESH_TEST_UBSAN
    // UBSan's vptr check needs a free descriptor (it probes memory through a pipe) and
    // reports a false "invalid vptr" without one; the build without UBSan runs this test.
    WARN("skipped under UBSan");
    return;
#endif
    tcp_world world;
    host<tcp_world> server(world, 1);
    host<tcp_world> client(world, 2);
    add_echo(server);
    int warnings = 0;
    log::set_sink([&warnings](log::level l, std::string_view component, std::string_view message) {
        if (l == log::level::warning && component == "net" &&
            message.find("accept failed") != std::string_view::npos)
            ++warnings;
    });
    struct restore_sink {
        ~restore_sink() { log::set_sink({}); }
    } restore_sink_at_exit;

    // A socket that will connect without needing a new descriptor.
    asio::ip::tcp::socket raw(world.io);
    raw.open(asio::ip::tcp::v4());
    descriptor_squeeze squeeze;
    squeeze.take_all();

    bool connected = false;
    raw.async_connect(server.endpoint, [&](std::error_code ec) { connected = !ec; });
    REQUIRE(world.run_until([&] { return connected; }));
    // About 1.3 s: pauses of 10, 20, 40, ... ms allow at most eight attempts; a loop that
    // retried at once would have made thousands.
    const auto until = std::chrono::steady_clock::now() + 1300ms;
    while (std::chrono::steady_clock::now() < until) {
        world.io.run_for(10ms);
        if (world.io.stopped()) world.io.restart();
    }
    const std::uint64_t failed = server.node->statistics().accept_errors;
    CHECK(failed >= 2);
    CHECK(failed <= 12);
    // accept() takes a descriptor before it looks for a connection, so the client's idle
    // listener fails too; each node warns once for the episode, not once per attempt.
    CHECK(client.node->statistics().accept_errors >= 1);
    CHECK(warnings == 2);

    squeeze.release();
    // The next retry (at most a second away) takes the waiting connection; a call works.
    const auto outcome = call(world, *client.node, server.peer(), "echo", random_bytes(100, 3));
    CHECK_FALSE(outcome.ec);
    CHECK(outcome.response == random_bytes(100, 3));
    CHECK(server.node->statistics().accept_errors == failed);
}

TEST_CASE("out of descriptors, a node closes its least recently used idle connection to dial or "
          "to accept",
          "[net][rpc][tcp]") {
#ifdef HIVEMESH_TEST_UBSAN
    WARN("skipped under UBSan"); // see the test above
    return;
#endif
    tcp_world world;
    host<tcp_world> hub(world, 1), a(world, 2), b(world, 3), c(world, 4), lone(world, 5);
    for (auto* h : {&a, &b, &c})
        add_echo(*h);
    REQUIRE_FALSE(call(world, *hub.node, a.peer(), "echo", {}).ec);
    REQUIRE_FALSE(call(world, *hub.node, b.peer(), "echo", {}).ec); // a is now the oldest
    asio::ip::tcp::socket raw(world.io); // connects later without a new descriptor
    raw.open(asio::ip::tcp::v4());
    descriptor_squeeze squeeze;
    squeeze.take_all();

    // The dial gets the descriptor of the connection to a; c's accept gets a's, once a has
    // seen its end close.
    const auto to_c = call(world, *hub.node, c.peer(), "echo", random_bytes(50, 4));
    REQUIRE_FALSE(to_c.ec);
    CHECK(to_c.response == random_bytes(50, 4));
    CHECK(hub.node->statistics().connections_evicted == 1);
    CHECK(remotes(*hub.node) ==
          std::set<std::string>{b.node->id().to_string(), c.node->id().to_string()});
    REQUIRE(world.run_until([&] { return a.node->connection_count() == 0; }));

    // An incoming connection takes the descriptor of the connection to b (now the oldest).
    // Linux fails an accept for want of a descriptor before it looks for a connection, so
    // the accept the node starts next fails too and closes the connection to c: the node
    // keeps one descriptor spare for whoever comes next.
    bool connected = false;
    raw.async_connect(hub.endpoint, [&](std::error_code ec) { connected = !ec; });
    REQUIRE(world.run_until([&] {
        return connected && hub.node->statistics().pending_handshakes == 1 &&
               hub.node->statistics().connections_evicted == 3;
    }));
    CHECK(hub.node->connection_count() == 0);
    REQUIRE(world.run_until(
        [&] { return b.node->connection_count() == 0 && c.node->connection_count() == 0; }));

    // With no idle connection to close, a dial fails with the shortage, not as if the peer
    // had closed the connection.
    squeeze.release(); // the spare and the descriptors b and c gave back: take them too
    squeeze.take_all();
    const auto from_lone = call(world, *lone.node, a.peer(), "echo", {});
    CHECK(from_lone.ec == asio::error::no_descriptors);
    CHECK(lone.node->statistics().connections_evicted == 0);
}

TEST_CASE("silent incoming connections past max_pending_handshakes are closed at once, and "
          "handshakes are taken again once theirs time out",
          "[net][rpc][tcp]") {
    tcp_world world;
    net::node_options options;
    options.max_pending_handshakes = 4;
    options.dial_timeout = 1s;
    host<tcp_world> server(world, 1, options);
    host<tcp_world> client(world, 2);
    add_echo(server);
    std::deque<asio::ip::tcp::socket> silent;
    std::size_t connected = 0;
    for (int i = 0; i < 10; ++i)
        silent.emplace_back(world.io).async_connect(server.endpoint, [&](std::error_code ec) {
            if (!ec) ++connected;
        });
    REQUIRE(world.run_until([&] {
        const auto stats = server.node->statistics();
        return connected == 10 && stats.pending_handshakes + stats.handshakes_refused == 10;
    }));
    CHECK(server.node->statistics().pending_handshakes == 4);
    CHECK(server.node->statistics().handshakes_refused == 6);
    // The four time out after dial_timeout; then a real peer's handshake is taken.
    REQUIRE(world.run_until([&] { return server.node->statistics().pending_handshakes == 0; }));
    const auto outcome = call(world, *client.node, server.peer(), "echo", random_bytes(10, 1));
    CHECK_FALSE(outcome.ec);
    CHECK(outcome.response == random_bytes(10, 1));
    CHECK(server.node->statistics().handshakes_refused == 6);
    CHECK(server.node->statistics().pending_handshakes == 0);
}

TEMPLATE_TEST_CASE("closing a node lets the calls in flight finish both ways, then closes",
                   "[net][rpc][shutdown]", sim_world, tcp_world) {
    TestType world;
    host<TestType> server(world, 1), client(world, 2);
    int started = 0;
    add_pause(server, 300ms, started);
    add_pause(client, 300ms, started);
    add_echo(server);
    auto inbound = start_call(*client.node, server.peer(), "pause", random_bytes(5, 1));
    auto outbound = start_call(*server.node, client.peer(), "pause", random_bytes(6, 2));
    REQUIRE(world.run_until([&] { return started == 2; }));
    auto closing = start_close(*server.node);
    CHECK(server.node->connection_count() > 0); // draining (each side may have dialed)
    // New calls go nowhere: not on the draining connection, and nothing listens any more.
    auto late = start_call(*client.node, server.peer(), "echo", random_bytes(7, 3));
    auto own = start_call(*server.node, client.peer(), "pause", {});
    REQUIRE(world.run_until([&] {
        return inbound->done && outbound->done && late->done && own->done && closing->done;
    }));
    CHECK_FALSE(inbound->ec);
    CHECK(inbound->response == random_bytes(5, 1));
    CHECK_FALSE(outbound->ec);
    CHECK(outbound->response == random_bytes(6, 2));
    CHECK(late->ec == errc::refused);
    CHECK(own->ec == errc::connection_closed);
    CHECK_FALSE(closing->ec);
    CHECK(started == 2);
    REQUIRE(world.run_until([&] {
        return server.node->connection_count() == 0 && client.node->connection_count() == 0;
    }));
    // A second close, and closing with nothing in flight, complete at once.
    auto again = start_close(*server.node);
    REQUIRE(world.run_until([&] { return again->done; }));
    CHECK_FALSE(again->ec);
}

TEMPLATE_TEST_CASE("a drain ends at drain_timeout and fails the calls still open",
                   "[net][rpc][shutdown]", sim_world, tcp_world) {
    TestType world;
    net::node_options options;
    const bool draining = GENERATE(true, false);
    options.drain_timeout = draining ? 500ms : 0s;
    host<TestType> server(world, 1, options), client(world, 2);
    slow_handler seen;
    add_slow(server, seen);
    auto stuck = start_call(*client.node, server.peer(), "slow", {}, 3600s);
    REQUIRE(world.run_until([&] { return seen.started; }));
    auto closing = start_close(*server.node);
    if (!draining) CHECK(server.node->connection_count() == 0);
    REQUIRE(world.run_until([&] { return stuck->done && closing->done; }));
    // Neither the call's own deadline nor the handler ended it: the drain did.
    CHECK(stuck->ec == errc::connection_closed);
    CHECK(closing->ec == (draining ? make_error_code(errc::timeout) : std::error_code{}));
    REQUIRE(world.run_until([&] { return seen.cancelled; }));
}

TEMPLATE_TEST_CASE("connections of one PeerId past max_connections_per_peer are closed after the "
                   "handshake and counted, and dialing it reuses one",
                   "[net][rpc][overload]", sim_world, tcp_world) {
    TestType world;
    CHECK(net::node_options{}.max_connections_per_peer == 4);
    host<TestType> server(world, 1);
    add_echo(server);
    // Six nodes that share one identity, as one peer opening connection after connection.
    std::deque<host<TestType>> clones;
    for (int i = 0; i < 6; ++i)
        add_echo(clones.emplace_back(world, 2));
    for (std::size_t i = 0; i < clones.size(); ++i) {
        INFO("clone " << i);
        const auto outcome =
            call(world, *clones[i].node, server.peer(), "echo", random_bytes(8, i + 1));
        if (i < 4) {
            CHECK_FALSE(outcome.ec);
            CHECK(outcome.response == random_bytes(8, i + 1));
        } else {
            CHECK(outcome.ec == errc::connection_closed);
        }
    }
    auto stats = server.node->statistics();
    CHECK(stats.connections_refused == 2);
    CHECK(stats.open_connections == 4);
    CHECK(stats.open_streams == 0);
    CHECK(server.node->connection_count() == 4);

    // Another peer is served as before, and a call to the capped PeerId goes over one of its
    // open connections instead of a fifth.
    host<TestType> other(world, 3);
    CHECK_FALSE(call(world, *other.node, server.peer(), "echo", {}).ec);
    const auto back = call(world, *server.node, clones[5].peer(), "echo", random_bytes(9, 9));
    CHECK_FALSE(back.ec);
    CHECK(back.response == random_bytes(9, 9));
    stats = server.node->statistics();
    CHECK(stats.connections_refused == 2);
    CHECK(stats.open_connections == 5);
}

TEST_CASE("streams a peer opens past max_streams are refused and counted, also once their "
          "connection closed",
          "[net][rpc][overload]") {
    sim_world world;
    net::node_options small;
    small.mux.max_streams = 2;
    host<sim_world> server(world, 1, small), client(world, 2);
    int started = 0;
    add_pause(server, 1s, started);
    // The client opens its five streams before the server's settings (2 streams) arrive:
    // until then the protocol's default of 8 applies.
    std::vector<std::shared_ptr<call_outcome>> calls;
    for (std::uint64_t i = 0; i < 5; ++i)
        calls.push_back(start_call(*client.node, server.peer(), "pause", random_bytes(4, i)));
    REQUIRE(world.run_until(
        [&] { return std::all_of(calls.begin(), calls.end(), [](auto& c) { return c->done; }); }));
    std::size_t answered = 0, refused = 0;
    for (const auto& c : calls) {
        if (!c->ec) ++answered;
        if (c->ec == errc::refused) ++refused;
    }
    CHECK(answered == 2);
    CHECK(refused == 3);
    CHECK(started == 2);
    CHECK(server.node->statistics().streams_refused == 3);
    CHECK(client.node->statistics().streams_refused == 0);
    client.node->close();
    REQUIRE(world.run_until([&] { return server.node->connection_count() == 0; }));
    const auto stats = server.node->statistics();
    CHECK(stats.streams_refused == 3);
    CHECK(stats.open_connections == 0);
    CHECK(stats.open_streams == 0);
}

namespace {

/// "echo" served by datagram too; "big" answers 4000 bytes by datagram if it can.
template <class Node>
void add_datagram_methods(Node& node) {
    node.add_handler("echo",
                     [](const net::call_context&, byte_view request,
                        byte_buffer& response) -> asio::awaitable<std::error_code> {
                         response.assign(request.begin(), request.end());
                         co_return std::error_code{};
                     },
                     {.datagrams = true});
    node.add_handler("big",
                     [](const net::call_context&, byte_view,
                        byte_buffer& response) -> asio::awaitable<std::error_code> {
                         response = random_bytes(4000, 4);
                         co_return std::error_code{};
                     },
                     {.datagrams = true});
    node.add_handler(
        "fails",
        [](const net::call_context&, byte_view, byte_buffer&) -> asio::awaitable<std::error_code> {
            co_return make_error_code(errc::not_found);
        },
        {.datagrams = true});
    node.add_handler("who",
                     [](const net::call_context& context, byte_view,
                        byte_buffer& response) -> asio::awaitable<std::error_code> {
                         response =
                             to_buffer(as_bytes(context.remote.to_string() + " " + context.method));
                         const auto key = context.remote_key.view();
                         response.insert(response.end(), key.begin(), key.end());
                         co_return std::error_code{};
                     },
                     {.datagrams = true});
}

template <class World>
void add_datagram_methods(host<World>& h) {
    add_datagram_methods(*h.node);
}

/// What "who" answers `caller`: its PeerId, the method and its key.
template <class Node>
byte_buffer who_answer(const Node& caller) {
    byte_buffer out = to_buffer(as_bytes(caller.id().to_string() + " who"));
    const auto key = caller.identity().public_key().view();
    out.insert(out.end(), key.begin(), key.end());
    return out;
}

} // namespace

TEMPLATE_TEST_CASE("a call to a peer whose key is known goes by one datagram each way",
                   "[net][rpc][datagram]", sim_world, tcp_world) {
    TestType world;
    host<TestType> server(world, 1), client(world, 2);
    add_datagram_methods(server);
    for (const std::size_t size : {std::size_t{0}, std::size_t{1}, std::size_t{1000}}) {
        INFO(TestType::name << " size " << size);
        const auto outcome =
            call(world, *client.node, server.keyed_peer(), "echo", random_bytes(size, size));
        REQUIRE_FALSE(outcome.ec);
        CHECK(outcome.response == random_bytes(size, size));
    }
    CHECK(call(world, *client.node, server.keyed_peer(), "fails", {}).ec == errc::not_found);
    const auto who = call(world, *client.node, server.keyed_peer(), "who", {});
    REQUIRE_FALSE(who.ec);
    CHECK(who.response == who_answer(*client.node));
    CHECK_FALSE(client.node->key_of(server.node->id()));

    const auto c = client.node->statistics();
    const auto s = server.node->statistics();
    CHECK(c.datagram_calls == 5);
    CHECK(c.datagrams_sent == 5);
    CHECK(c.datagrams_received == 5);
    CHECK(s.datagrams_received == 5);
    CHECK(s.datagrams_sent == 5);
    CHECK(c.datagram_fallbacks == 0);
    CHECK(c.datagrams_dropped + s.datagrams_dropped == 0);
    // No connection, no handshake.
    CHECK(client.node->connection_count() == 0);
    CHECK(server.node->connection_count() == 0);
    CHECK(c.handshakes_completed + s.handshakes_completed == 0);
}

TEMPLATE_TEST_CASE("calls that a datagram cannot carry go by stream", "[net][rpc][datagram]",
                   sim_world, tcp_world) {
    TestType world;
    host<TestType> server(world, 1), client(world, 2);
    add_datagram_methods(server);
    server.node->add_handler("stream_only",
                             [](const net::call_context&, byte_view request,
                                byte_buffer& response) -> asio::awaitable<std::error_code> {
                                 response.assign(request.begin(), request.end());
                                 co_return std::error_code{};
                             });
    INFO(TestType::name);
    // A request too large is not sent as a datagram at all.
    const auto large =
        call(world, *client.node, server.keyed_peer(), "echo", random_bytes(2000, 1));
    REQUIRE_FALSE(large.ec);
    CHECK(large.response == random_bytes(2000, 1));
    CHECK(client.node->statistics().datagrams_sent == 0);
    // A reply too large, a method not served by datagram and an unknown one: the callee says
    // so, and the call goes by stream.
    const auto big = call(world, *client.node, server.keyed_peer(), "big", {});
    REQUIRE_FALSE(big.ec);
    CHECK(big.response == random_bytes(4000, 4));
    const auto plain =
        call(world, *client.node, server.keyed_peer(), "stream_only", random_bytes(10, 2));
    REQUIRE_FALSE(plain.ec);
    CHECK(plain.response == random_bytes(10, 2));
    CHECK(call(world, *client.node, server.keyed_peer(), "missing", {}).ec == errc::refused);
    // By stream, the handler sees the key the connection proved.
    const auto who = call(world, *client.node, server.peer(), "who", {});
    REQUIRE_FALSE(who.ec);
    CHECK(who.response == who_answer(*client.node));
    CHECK(client.node->key_of(server.node->id()) == server.node->identity().public_key());
    // A key that does not prove the PeerId is not used.
    auto wrong_key = server.keyed_peer();
    wrong_key.key = identity_of(9).public_key();
    CHECK_FALSE(call(world, *client.node, wrong_key, "echo", {}).ec);

    const auto c = client.node->statistics();
    CHECK(c.datagrams_sent == 3);
    CHECK(c.datagram_fallbacks == 5);
    CHECK(c.datagram_calls == 0);
    CHECK(server.node->statistics().datagrams_sent == 3);
    CHECK(client.node->connection_count() == 1);
}

TEST_CASE("a callee that takes no datagrams is called by stream, then for a while: after three "
          "unanswered requests, or after one its host answers with a notice",
          "[net][rpc][datagram]") {
    struct expected {
        bool notices; // off: as behind a firewall that filters ICMP
        duration first_call;
        std::uint64_t datagrams_sent, refusals;
    };
    // Three requests, 0.25 + 0.5 + 1 s of waiting, or one and its notice a round trip (20 ms)
    // later; then a dial, handshake and call: 3 round trips.
    for (const auto& e :
         {expected{false, 1750ms + 60ms, 3, 0}, expected{true, 20ms + 60ms, 1, 1}}) {
        INFO("notices " << e.notices);
        net::sim::network_config config;
        config.port_unreachable_notices = e.notices;
        sim_world world(config);
        net::node_options no_datagrams;
        no_datagrams.datagrams.enabled = false;
        host<sim_world> server(world, 1, no_datagrams), client(world, 2);
        add_echo(server);
        const time_point start = world.now();
        const auto first =
            call(world, *client.node, server.keyed_peer(), "echo", random_bytes(5, 5));
        REQUIRE_FALSE(first.ec);
        CHECK(first.response == random_bytes(5, 5));
        CHECK(world.now() - start == e.first_call);
        auto c = client.node->statistics();
        CHECK(c.datagrams_sent == e.datagrams_sent);
        CHECK(c.datagram_fallbacks == 1);
        CHECK(c.datagram_refusals == e.refusals);
        CHECK(server.node->statistics().datagrams_received == 0);

        // Within the silence period the next call goes by stream at once.
        const time_point second_start = world.now();
        CHECK_FALSE(call(world, *client.node, server.keyed_peer(), "echo", {}).ec);
        CHECK(world.now() - second_start == 20ms);
        c = client.node->statistics();
        CHECK(c.datagrams_sent == e.datagrams_sent);
        CHECK(c.datagram_fallbacks == 2);
        CHECK(c.datagram_refusals == e.refusals);
    }
}

TEST_CASE("a peer that answered datagrams and then stops is found out within a few round "
          "trips",
          "[net][rpc][datagram]") {
    sim_world world;
    host<sim_world> server(world, 1), client(world, 2);
    add_datagram_methods(server);
    REQUIRE_FALSE(call(world, *client.node, server.keyed_peer(), "echo", {}).ec);
    world.network.crash(server.transport.node());
    // The first answer timed the round trip (20 ms): the waits are 4, 8 and 16 of them.
    const time_point start = world.now();
    CHECK(call(world, *client.node, server.keyed_peer(), "echo", {}).ec == errc::unreachable);
    CHECK(world.now() - start == 80ms + 160ms + 320ms);
    CHECK(client.node->statistics().datagrams_sent == 4);
    // The next call goes by stream, whose dial gives up at the simulated connect timeout.
    const time_point dial = world.now();
    CHECK(call(world, *client.node, server.keyed_peer(), "echo", {}).ec);
    CHECK(world.now() - dial == world.network.config().connect_timeout);
    CHECK(client.node->statistics().datagrams_sent == 4);
}

TEMPLATE_TEST_CASE("a peer whose process is gone, its host up, is found out by the first "
                   "attempt's notice",
                   "[net][rpc][datagram]", sim_world, tcp_world) {
    TestType world;
    host<TestType> server(world, 1), client(world, 2);
    add_datagram_methods(server);
    REQUIRE_FALSE(call(world, *client.node, server.keyed_peer(), "echo", {}).ec);
    const auto peer = server.keyed_peer();
    server.node.reset(); // its sockets close with it; the host answers for the ports
    world.settle();
    INFO(TestType::name);
    const time_point start = world.now();
    // Not the three attempts 4, 8 and 16 round trips apart: one, its notice, and a dial
    // that is refused.
    CHECK(call(world, *client.node, peer, "echo", {}).ec);
    const auto c = client.node->statistics();
    CHECK(c.datagrams_sent == 2);
    CHECK(c.datagram_refusals == 1);
    CHECK(c.datagram_fallbacks == 1);
    if constexpr (std::is_same_v<TestType, sim_world>)
        CHECK(world.now() - start == 20ms + 20ms); // the notice, then the dial's refusal
}

TEST_CASE("datagram calls survive loss by sending again", "[net][rpc][datagram]") {
    net::sim::network_config lossy;
    lossy.default_link.loss = 0.2;
    sim_world world(lossy);
    host<sim_world> server(world, 1), client(world, 2);
    add_datagram_methods(server);
    std::vector<std::shared_ptr<call_outcome>> outcomes;
    for (std::uint64_t i = 0; i < 200; ++i)
        outcomes.push_back(
            start_call(*client.node, server.keyed_peer(), "echo", random_bytes(100, i)));
    REQUIRE(world.run_until([&] {
        return std::all_of(outcomes.begin(), outcomes.end(), [](auto& o) { return o->done; });
    }));
    // 0.8^2 = 0.64 of the exchanges get through, so many requests were sent again. A call
    // whose three all failed went by stream if the peer had not answered yet, and failed
    // as `unreachable` if it had (0.36^3: about 1 in 21).
    std::uint64_t unreachable = 0;
    for (std::uint64_t i = 0; i < 200; ++i) {
        if (outcomes[i]->ec == errc::unreachable) {
            ++unreachable;
            continue;
        }
        REQUIRE_FALSE(outcomes[i]->ec);
        CHECK(outcomes[i]->response == random_bytes(100, i));
    }
    const auto c = client.node->statistics();
    CHECK(c.datagrams_sent > 250);
    CHECK(c.datagram_calls + c.datagram_fallbacks + unreachable == 200);
    CHECK(unreachable < 20);
    CHECK(c.datagram_calls > 180);
}

TEMPLATE_TEST_CASE("datagrams from outside the swarm or forged are dropped", "[net][rpc][datagram]",
                   sim_world, tcp_world) {
    TestType world;
    net::node_options keyed;
    keyed.security.swarm_key.emplace();
    keyed.security.swarm_key->fill(std::byte{7});
    host<TestType> server(world, 1, keyed), member(world, 2, keyed), outsider(world, 3);
    add_datagram_methods(server);
    CHECK_FALSE(call(world, *member.node, server.keyed_peer(), "echo", {}).ec);
    CHECK(member.node->statistics().datagram_calls == 1);
    // The outsider's requests open nowhere; after its three it tries a stream, whose
    // handshake fails too.
    CHECK(call(world, *outsider.node, server.keyed_peer(), "echo", {}).ec ==
          errc::handshake_failed);
    CHECK(server.node->statistics().datagrams_dropped == 3);
    CHECK(outsider.node->statistics().datagrams_sent == 3);
    CHECK(outsider.node->statistics().datagrams_received == 0);
}

TEST_CASE("datagrams reach both address families: every listener's port, and an ephemeral one "
          "for a family no listener serves",
          "[net][rpc][datagram]") {
    tcp_world world;
    using tcp_node = net::node<net::tcp::transport>;
    auto& server_host = world.add_host();
    tcp_node server(server_host, identity_of(1));
    const auto v4 = world.listen_at(server, server_host, {asio::ip::address_v4::loopback(), 0});
    const auto v6 = world.listen_at(server, server_host, {asio::ip::address_v6::loopback(), 0});
    add_datagram_methods(server);
    const auto key = server.identity().public_key();
    auto& listener_host = world.add_host();
    tcp_node v6_listener(listener_host, identity_of(2));
    world.listen_at(v6_listener, listener_host, {asio::ip::address_v6::loopback(), 0});
    tcp_node client(world.add_host(), identity_of(3));

    // Each of the server's listeners takes datagrams; the v6 listener calls v4 from a port of
    // its own, and the client, which listens nowhere, opens one for each family.
    for (tcp_node* caller : {&v6_listener, &client})
        for (const auto& endpoint : {v4, v6, v4, v6}) {
            const auto outcome = call(world, *caller, tcp_node::peer{server.id(), endpoint, key},
                                      "echo", random_bytes(10, 1));
            REQUIRE_FALSE(outcome.ec);
            CHECK(outcome.response == random_bytes(10, 1));
        }
    for (tcp_node* caller : {&v6_listener, &client}) {
        const auto stats = caller->statistics();
        CHECK(stats.datagram_calls == 4);
        CHECK(stats.datagram_fallbacks == 0);
        CHECK(stats.datagrams_sent == 4);
        CHECK(caller->connection_count() == 0);
    }
    CHECK(server.statistics().datagrams_received == 8);
    CHECK(server.connection_count() == 0);
}

TEST_CASE("a node refuses datagram options out of range", "[net][rpc][datagram]") {
    sim_world world;
    auto& transport = world.add_host();
    const double infinity = std::numeric_limits<double>::infinity();
    const std::vector<std::function<void(net::datagram_options&)>> changes = {
        [](auto& d) { d.max_size = 127; },
        [](auto& d) { d.max_size = 65508; },
        [](auto& d) { d.attempts = 0; },
        [](auto& d) { d.retry_interval = 0s; },
        [](auto& d) { d.min_retry_interval = 0s; },
        [](auto& d) { d.max_serving = 0; },
        [](auto& d) { d.max_cached_keys = 0; },
        [](auto& d) { d.max_clock_skew = 0s; },
        [](auto& d) { d.max_new_keys_per_second = -1; },
        [=](auto& d) { d.max_new_keys_per_second = infinity; },
        [](auto& d) { d.max_new_keys_per_second = std::numeric_limits<double>::quiet_NaN(); },
    };
    using node_type = net::node<net::sim::transport>;
    for (const auto& change : changes) {
        net::node_options options;
        change(options.datagrams);
        CHECK_THROWS_AS(node_type(transport, identity_of(1), options), std::invalid_argument);
    }
    net::node_options unlimited;
    unlimited.datagrams.max_new_keys_per_second = 0;
    CHECK_NOTHROW(node_type(transport, identity_of(1), unlimited));
}

TEMPLATE_TEST_CASE("a datagram call waiting for its reply ends when the node closes",
                   "[net][rpc][datagram]", sim_world, tcp_world) {
    TestType world;
    host<TestType> server(world, 1), client(world, 2);
    slow_handler seen;
    add_slow(server, seen, {.datagrams = true});
    auto outcome = start_call(*client.node, server.keyed_peer(), "slow", {}, 60s);
    REQUIRE(world.run_until([&] { return seen.started; }));
    client.node->close();
    REQUIRE(world.run_until([&] { return outcome->done; }));
    CHECK(outcome->ec == errc::connection_closed);
    // The server's handler ends at the call's timeout; nothing waits on the closed node.
    server.node->close_now();
}

TEST_CASE("a thousand concurrent datagram calls past max_serving all end answered, the excess "
          "by stream",
          "[net][rpc][datagram]") {
    sim_world world;
    net::node_options few;
    few.datagrams.max_serving = 16;
    host<sim_world> server(world, 1, few), client(world, 2);
    int started = 0;
    add_pause(server, 100ms, started, {.datagrams = true});
    std::vector<std::shared_ptr<call_outcome>> outcomes;
    for (std::uint64_t i = 0; i < 1000; ++i)
        outcomes.push_back(
            start_call(*client.node, server.keyed_peer(), "pause", random_bytes(8, i), 60s));
    REQUIRE(world.run_until([&] {
        return std::all_of(outcomes.begin(), outcomes.end(), [](auto& o) { return o->done; });
    }));
    for (std::uint64_t i = 0; i < 1000; ++i) {
        REQUIRE_FALSE(outcomes[i]->ec);
        CHECK(outcomes[i]->response == random_bytes(8, i));
    }
    // Requests past the 16 in service were answered `by stream`, and went that way.
    const auto c = client.node->statistics();
    CHECK(c.datagram_calls >= 16);
    CHECK(c.datagram_fallbacks > 0);
    CHECK(c.datagram_calls + c.datagram_fallbacks == 1000);
    CHECK(server.node->statistics().datagrams_dropped == 0);
}
