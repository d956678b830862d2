#include "support/bytes.hpp"
#include "support/identities.hpp"

#include <hivemesh/core/random.hpp>
#include <hivemesh/net/secure_stream.hpp>

#include <catch2/catch.hpp>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/local/connect_pair.hpp>
#include <asio/local/stream_protocol.hpp>
#include <asio/read.hpp>
#include <asio/steady_timer.hpp>

#include <algorithm>
#include <chrono>
#include <concepts>
#include <exception>
#include <functional>
#include <optional>
#include <utility>
#include <vector>

using hivemesh::byte_buffer;
using hivemesh::byte_view;
using hivemesh::errc;
using hivemesh::crypto::cipher;
using hivemesh::crypto::identity;
using hivemesh::crypto::role;
using hivemesh::crypto::secure_options;
using hivemesh::net::secure_stream;
using unix_socket = asio::local::stream_protocol::socket;
using tcp_socket = asio::ip::tcp::socket;

namespace {

using hivemesh::test::identity_of;
using hivemesh::test::random_bytes;

bool same(byte_view a, byte_view b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
}

/// Runs coroutines on `context` until all finish; rethrows the first exception (a failed
/// REQUIRE inside a coroutine). The time limit only stops a hung test; it asserts nothing.
void run_all(asio::io_context& context, std::vector<asio::awaitable<void>> tasks) {
    std::size_t finished = 0;
    std::exception_ptr failure;
    const std::size_t count = tasks.size();
    for (auto& task : tasks)
        asio::co_spawn(context, std::move(task), [&](std::exception_ptr e) {
            if (e && !failure) failure = e;
            ++finished;
        });
    context.run_for(std::chrono::minutes(2));
    context.restart();
    if (failure) std::rethrow_exception(failure);
    REQUIRE(finished == count);
}

/// The same for a fixed set of coroutines, started in this order.
template <std::same_as<asio::awaitable<void>>... Tasks>
void run_all(asio::io_context& context, Tasks... tasks) {
    std::vector<asio::awaitable<void>> all;
    (all.push_back(std::move(tasks)), ...);
    run_all(context, std::move(all));
}

std::pair<unix_socket, unix_socket> unix_pair(asio::io_context& context) {
    unix_socket a(context), b(context);
    asio::local::connect_pair(a, b);
    return {std::move(a), std::move(b)};
}

std::pair<tcp_socket, tcp_socket> tcp_pair(asio::io_context& context) {
    asio::ip::tcp::acceptor acceptor(context, {asio::ip::make_address("127.0.0.1"), 0});
    tcp_socket a(context), b(context);
    a.connect(acceptor.local_endpoint());
    acceptor.accept(b);
    a.set_option(asio::ip::tcp::no_delay(true));
    b.set_option(asio::ip::tcp::no_delay(true));
    return {std::move(a), std::move(b)};
}

template <class Socket>
struct connected {
    secure_stream<Socket> dialer;
    secure_stream<Socket> listener;
};

/// Secure streams over the two ends of `sockets`, not handshaken yet.
template <class Socket>
connected<Socket> secure_ends(std::pair<Socket, Socket> sockets) {
    return {secure_stream<Socket>(std::move(sockets.first)),
            secure_stream<Socket>(std::move(sockets.second))};
}

/// Handshakes both ends concurrently; returns (dialer error, listener error).
template <class Socket>
std::pair<std::error_code, std::error_code>
handshake_both(asio::io_context& context, connected<Socket>& ends, const identity& dialer_identity,
               const identity& listener_identity, const secure_options& dialer_options = {},
               const secure_options& listener_options = {},
               std::optional<hivemesh::crypto::peer_id> expected = {}) {
    std::error_code dialer_error, listener_error;
    // A coroutine lambda's captures live in the closure: keep it alive while it runs.
    const auto dial = [&]() -> asio::awaitable<void> {
        dialer_error =
            co_await ends.dialer.handshake(role::dialer, dialer_identity, expected, dialer_options);
        if (dialer_error) ends.dialer.close(); // as a transport would on failure
    };
    const auto listen = [&]() -> asio::awaitable<void> {
        listener_error = co_await ends.listener.handshake(role::listener, listener_identity, {},
                                                          listener_options);
        if (listener_error) ends.listener.close();
    };
    run_all(context, dial(), listen());
    return {dialer_error, listener_error};
}

std::vector<byte_buffer> test_messages(std::uint64_t seed) {
    std::vector<byte_buffer> messages;
    for (std::size_t size :
         {std::size_t{0}, std::size_t{1}, std::size_t{64 * 1024}, std::size_t{(1 << 20) + 3}})
        messages.push_back(random_bytes(size, seed + size));
    for (std::size_t i = 0; i < 300; ++i) // many small records share each read
        messages.push_back(random_bytes(i % 97, seed * 1000 + i));
    // Records just under, at and over what an idle read takes in, and what a released
    // read buffer may grow to.
    const std::size_t idle = secure_stream<unix_socket>::idle_read_size;
    const std::size_t released = secure_stream<unix_socket>::released_buffer_size;
    for (std::size_t size = idle - 40; size <= idle + 8; ++size)
        messages.push_back(random_bytes(size, seed * 2000 + size));
    for (std::size_t size : {released / 4 - 32, released / 4 + 1, released - 32, released + 1})
        messages.push_back(random_bytes(size, seed * 3000 + size));
    messages.push_back(random_bytes((1 << 20) + 5, seed + 7)); // a large one after many small
    return messages;
}

template <class Socket>
asio::awaitable<void> send_all(secure_stream<Socket>& stream,
                               const std::vector<byte_buffer>& messages, bool one_write) {
    // co_await stays out of the assertion macros: they repeat their expression in an
    // unevaluated branch, and g++ 12 mis-compiles co_await there.
    std::error_code ec;
    if (one_write) {
        // The first half whole, the second as heads (a few bytes) followed by bodies.
        const std::size_t half = messages.size() / 2;
        const std::vector<byte_view> views(messages.begin(), messages.begin() + half);
        ec = co_await stream.write(views);
        CHECK_FALSE(ec);
        std::vector<byte_view> heads, bodies;
        for (std::size_t i = half; i < messages.size(); ++i) {
            const byte_view whole = messages[i];
            const std::size_t cut = std::min<std::size_t>(whole.size(), i % 4);
            heads.push_back(whole.first(cut));
            bodies.push_back(whole.subspan(cut));
        }
        ec = co_await stream.write(heads, bodies);
        CHECK_FALSE(ec);
    } else {
        for (const auto& message : messages) {
            ec = co_await stream.write(byte_view(message));
            CHECK_FALSE(ec);
        }
    }
    ec = co_await stream.shutdown();
    CHECK_FALSE(ec);
    ec = co_await stream.write(byte_view(messages[1]));
    CHECK(ec == errc::connection_closed);
}

/// Reads every message, with wait() before each read() if `waiting` (as a multiplexer does).
template <class Socket>
asio::awaitable<void> receive_all(secure_stream<Socket>& stream,
                                  const std::vector<byte_buffer>& expected, bool waiting) {
    std::error_code ec;
    for (std::size_t i = 0; i < expected.size(); ++i) {
        byte_view message;
        if (waiting) ec = co_await stream.wait();
        if (!ec) ec = co_await stream.read(message);
        CAPTURE(i, ec.message());
        REQUIRE_FALSE(ec);
        REQUIRE(message.size() == expected[i].size());
        CHECK(same(message, expected[i]));
    }
    byte_view message;
    if (waiting) {
        ec = co_await stream.wait(); // the close record's bytes are a message's
        CHECK_FALSE(ec);
    }
    ec = co_await stream.read(message);
    CHECK(ec == asio::error::eof);
    ec = co_await stream.read(message);
    CHECK(ec == asio::error::eof); // sticky
}

/// As receive_all, reading with placement (a head of 3 bytes): every other offer is taken,
/// into a buffer of its own, the others declined. Encrypted records are never offered;
/// plaintext ones are exactly when over min_placed_size bytes are still to come, so the
/// large messages of test_messages() are, unless they happen to be buffered whole.
template <class Socket>
asio::awaitable<void> receive_all_placing(secure_stream<Socket>& stream,
                                          const std::vector<byte_buffer>& expected,
                                          std::size_t& offers, std::size_t& taken) {
    constexpr std::size_t head_size = 3;
    for (std::size_t i = 0; i < expected.size(); ++i) {
        byte_buffer landed;
        bool offered = false;
        auto place = [&](byte_view head, std::size_t rest) -> std::span<std::byte> {
            CHECK_FALSE(offered); // once per record
            offered = true;
            CHECK(head.size() == head_size);
            CHECK(head.size() + rest == expected[i].size());
            CHECK(same(head, byte_view(expected[i]).first(head_size)));
            if (offers++ % 2 == 1) return {};
            landed.assign(rest, std::byte{0xEE});
            return landed;
        };
        byte_view message;
        std::size_t placed = 99;
        const auto ec = co_await stream.read(message, head_size, place, placed);
        CAPTURE(i, ec.message());
        REQUIRE_FALSE(ec);
        if (placed > 0) {
            ++taken;
            REQUIRE(placed == landed.size());
            REQUIRE(message.size() == head_size);
            byte_buffer whole(message.begin(), message.end());
            whole.insert(whole.end(), landed.begin(), landed.end());
            CHECK(same(whole, expected[i]));
        } else {
            REQUIRE(message.size() == expected[i].size());
            CHECK(same(message, expected[i]));
        }
    }
    byte_view message;
    std::size_t placed = 0;
    auto never = [](byte_view, std::size_t) -> std::span<std::byte> { return {}; };
    const auto ec = co_await stream.read(message, head_size, never, placed);
    CHECK(ec == asio::error::eof);
}

template <class Socket>
void exchange_everything(asio::io_context& context, connected<Socket>& ends, bool one_write,
                         bool placing = false, bool waiting = false) {
    const auto to_listener = test_messages(1), to_dialer = test_messages(2);
    std::size_t offers = 0, taken = 0;
    std::vector<asio::awaitable<void>> tasks;
    tasks.push_back(send_all(ends.dialer, to_listener, one_write));
    tasks.push_back(send_all(ends.listener, to_dialer, one_write));
    if (placing) {
        tasks.push_back(receive_all_placing(ends.listener, to_listener, offers, taken));
        tasks.push_back(receive_all_placing(ends.dialer, to_dialer, offers, taken));
    } else {
        tasks.push_back(receive_all(ends.listener, to_listener, waiting));
        tasks.push_back(receive_all(ends.dialer, to_dialer, waiting));
    }
    run_all(context, std::move(tasks));
    if (!placing) return;
    if (ends.dialer.cipher() != cipher::plaintext) {
        CHECK(offers == 0);
    } else { // two messages of 1 MiB each way cannot all have been buffered whole
        CHECK(offers >= 2);
        CHECK(taken >= 1);
    }
}

template <class Socket, class MakePair>
void check_round_trips(MakePair make_pair) {
    const auto alice = identity_of(1), bob = identity_of(2);
    struct mode {
        bool plaintext, aes;
    };
    for (const mode m : {mode{false, true}, mode{false, false}, mode{true, false}}) {
        for (const int variant : {0, 1, 2, 3}) {
            const bool one_write = variant == 0, placing = variant == 2, waiting = variant == 3;
            CAPTURE(m.plaintext, m.aes, one_write, placing, waiting);
            asio::io_context context;
            auto ends = secure_ends(make_pair(context));
            secure_options options;
            options.plaintext = m.plaintext;
            options.allow_aes_gcm = m.aes;
            const auto [dialer_error, listener_error] =
                handshake_both(context, ends, alice, bob, options, options, bob.id());
            REQUIRE_FALSE(dialer_error);
            REQUIRE_FALSE(listener_error);
            CHECK(ends.dialer.remote_id() == bob.id());
            CHECK(ends.listener.remote_id() == alice.id());
            CHECK(ends.listener.remote_key() == alice.public_key());
            const cipher expected = m.plaintext ? cipher::plaintext
                                    : m.aes && hivemesh::crypto::aes256_gcm_available()
                                        ? cipher::aes256_gcm
                                        : cipher::chacha20_poly1305;
            CHECK(ends.dialer.cipher() == expected);
            CHECK(ends.listener.cipher() == expected);
            exchange_everything(context, ends, one_write, placing, waiting);
        }
    }
}

/// Writes raw bytes on a plain socket.
template <class Socket>
asio::awaitable<void> write_raw(Socket& socket, byte_buffer bytes) {
    std::error_code ec;
    co_await asio::async_write(socket, asio::buffer(bytes),
                               asio::redirect_error(asio::use_awaitable, ec));
}

byte_buffer le32(std::uint32_t value) {
    byte_buffer out(4);
    for (int i = 0; i < 4; ++i)
        out[static_cast<std::size_t>(i)] = static_cast<std::byte>(value >> (8 * i));
    return out;
}

} // namespace

TEST_CASE("secure_stream carries messages of every size both ways over Unix sockets",
          "[net][secure_stream]") {
    check_round_trips<unix_socket>([](asio::io_context& c) { return unix_pair(c); });
}

TEST_CASE("secure_stream carries messages of every size both ways over loopback TCP",
          "[net][secure_stream]") {
    check_round_trips<tcp_socket>([](asio::io_context& c) { return tcp_pair(c); });
}

TEST_CASE("a listener refuses a raw socket that writes garbage", "[net][secure_stream]") {
    const auto bob = identity_of(2);
    hivemesh::random_generator rng(99);
    std::vector<byte_buffer> garbage_inputs;
    garbage_inputs.push_back(random_bytes(200, rng())); // random length header
    auto plausible = le32(39);                          // right size, random hello
    const auto body = random_bytes(39, rng());
    plausible.insert(plausible.end(), body.begin(), body.end());
    garbage_inputs.push_back(plausible);
    auto long_frame = le32(4097); // over the frame limit
    long_frame.resize(4 + 4097);
    garbage_inputs.push_back(long_frame);
    garbage_inputs.push_back(le32(0)); // empty frame
    for (const auto& garbage : garbage_inputs) {
        asio::io_context context;
        auto [raw, accepted] = tcp_pair(context);
        secure_stream<tcp_socket> listener(std::move(accepted));
        std::error_code ec, read_error;
        const auto listen = [&]() -> asio::awaitable<void> {
            ec = co_await listener.handshake(role::listener, bob);
            byte_view message;
            read_error = co_await listener.read(message);
        };
        run_all(context, write_raw(raw, garbage), listen());
        CHECK(ec == errc::handshake_failed);
        CHECK(read_error == errc::handshake_failed); // the stream stays failed
        CHECK_THROWS_AS(listener.remote_id(), std::logic_error);
    }
}

TEST_CASE("secure_stream refuses bad records from an authenticated peer", "[net][secure_stream]") {
    const auto alice = identity_of(1), bob = identity_of(2);
    struct bad_record {
        byte_buffer bytes;
        errc expected;
    };
    auto forged = le32(100);
    forged.resize(104, std::byte{0x5A});
    std::vector<bad_record> cases;
    cases.push_back({le32(0xFFFFFFFF), errc::message_too_large});
    cases.push_back({le32(4096 + 1), errc::message_too_large});
    cases.push_back({le32(3), errc::protocol_violation});
    cases.push_back({forged, errc::authentication_failed});
    for (const auto& c : cases) {
        asio::io_context context;
        auto ends = secure_ends(unix_pair(context));
        secure_options options;
        options.max_record_size = 4096;
        const auto errors = handshake_both(context, ends, alice, bob, options, options);
        REQUIRE_FALSE(errors.first);
        REQUIRE_FALSE(errors.second);
        std::error_code first, second;
        const auto receive = [&]() -> asio::awaitable<void> {
            byte_view message;
            first = co_await ends.listener.read(message);
            second = co_await ends.listener.read(message);
        };
        run_all(context, write_raw(ends.dialer.next_layer(), c.bytes), receive());
        CHECK(first == c.expected);
        CHECK(second == c.expected);
    }
}

TEST_CASE("secure_stream refuses to send an oversized message", "[net][secure_stream]") {
    const auto alice = identity_of(1), bob = identity_of(2);
    asio::io_context context;
    auto ends = secure_ends(unix_pair(context));
    secure_options options;
    options.max_record_size = 4096;
    REQUIRE_FALSE(handshake_both(context, ends, alice, bob, options, options).first);
    std::error_code too_large, after;
    const auto exchange = [&]() -> asio::awaitable<void> {
        const byte_buffer big(4096), fine(10);
        const std::vector<byte_view> batch{fine, big};
        too_large = co_await ends.dialer.write(batch);
        after = co_await ends.dialer.write(byte_view(fine));
        byte_view message;
        const auto ec = co_await ends.listener.read(message); // only `fine` went out
        CHECK_FALSE(ec);
        CHECK(message.size() == 10);
    };
    run_all(context, exchange());
    CHECK(too_large == errc::message_too_large);
    CHECK_FALSE(after);
}

TEST_CASE("a stream that ends without a close record is truncated", "[net][secure_stream]") {
    const auto alice = identity_of(1), bob = identity_of(2);
    asio::io_context context;
    auto ends = secure_ends(unix_pair(context));
    REQUIRE_FALSE(handshake_both(context, ends, alice, bob).first);
    std::error_code first, second, third;
    const auto exchange = [&]() -> asio::awaitable<void> {
        const auto ec = co_await ends.dialer.write(hivemesh::as_bytes("last words"));
        CHECK_FALSE(ec);
        ends.dialer.close(); // no shutdown(): no close record
        byte_view message;
        first = co_await ends.listener.read(message);
        CHECK(hivemesh::as_string_view(message) == "last words");
        second = co_await ends.listener.wait();
        third = co_await ends.listener.read(message);
    };
    run_all(context, exchange());
    CHECK_FALSE(first);
    CHECK(second == errc::connection_truncated); // wait() reports it as read() would
    CHECK(third == errc::connection_truncated);  // sticky
}

TEST_CASE("a plaintext record cut off while placed is truncated, and the head survives",
          "[net][secure_stream]") {
    const auto alice = identity_of(1), bob = identity_of(2);
    secure_options options;
    options.plaintext = true;
    for (const bool wrong_span : {false, true}) {
        CAPTURE(wrong_span);
        asio::io_context context;
        auto ends = secure_ends(unix_pair(context));
        REQUIRE_FALSE(handshake_both(context, ends, alice, bob, options, options).first);
        // A data record announcing 100,000 payload bytes, of which 30,000 arrive.
        const std::size_t payload = 100'000, sent = 30'000;
        byte_buffer raw = le32(static_cast<std::uint32_t>(1 + payload));
        raw.push_back(std::byte{0}); // record_type::data
        const auto body = random_bytes(sent, 5);
        raw.insert(raw.end(), body.begin(), body.end());
        byte_buffer landed;
        std::error_code first, second;
        bool threw = false;
        const auto receive = [&]() -> asio::awaitable<void> {
            auto place = [&](byte_view head, std::size_t rest) -> std::span<std::byte> {
                CHECK(same(head, byte_view(body).first(8)));
                landed.resize(wrong_span ? rest - 1 : rest);
                return landed;
            };
            byte_view message;
            std::size_t placed = 0;
            try {
                first = co_await ends.listener.read(message, 8, place, placed);
            } catch (const std::logic_error&) {
                threw = true;
                co_return;
            }
            CHECK(placed == 0);
            second = co_await ends.listener.read(message);
        };
        const auto send = [&]() -> asio::awaitable<void> {
            co_await write_raw(ends.dialer.next_layer(), raw);
            ends.dialer.close();
        };
        run_all(context, send(), receive());
        if (wrong_span) {
            CHECK(threw);
            continue;
        }
        CHECK(first == errc::connection_truncated);
        CHECK(second == errc::connection_truncated); // sticky
        // What did arrive went straight to the placement.
        CHECK(same(byte_view(landed).first(sent - 8), byte_view(body).subspan(8)));
    }
}

TEST_CASE("the handshake fails promptly when the connection goes away", "[net][secure_stream]") {
    const auto alice = identity_of(1), bob = identity_of(2);
    SECTION("peer closes in the middle of a frame") {
        asio::io_context context;
        auto sockets = unix_pair(context); // no structured binding: lambdas capture it
        auto& raw = sockets.first;
        secure_stream<unix_socket> listener(std::move(sockets.second));
        std::error_code ec;
        const auto hang_up = [&]() -> asio::awaitable<void> {
            auto partial = le32(39);
            partial.resize(14);
            co_await write_raw(raw, partial);
            raw.close();
        };
        const auto listen = [&]() -> asio::awaitable<void> {
            ec = co_await listener.handshake(role::listener, bob);
        };
        run_all(context, hang_up(), listen());
        CHECK(ec == errc::connection_closed);
    }
    SECTION("listener reads the hello and hangs up") {
        asio::io_context context;
        auto sockets = unix_pair(context);
        auto& raw = sockets.second;
        secure_stream<unix_socket> dialer(std::move(sockets.first));
        std::error_code ec;
        const auto hang_up = [&]() -> asio::awaitable<void> {
            byte_buffer hello(4 + 39);
            co_await asio::async_read(raw, asio::buffer(hello), asio::use_awaitable);
            raw.close();
        };
        const auto dial = [&]() -> asio::awaitable<void> {
            ec = co_await dialer.handshake(role::dialer, alice, bob.id());
        };
        run_all(context, hang_up(), dial());
        CHECK(ec == errc::connection_closed);
    }
    SECTION("closing our own stream from a timer cancels the handshake") {
        asio::io_context context;
        auto [dialing, silent] = unix_pair(context);
        secure_stream<unix_socket> dialer(std::move(dialing));
        std::error_code ec;
        const auto deadline = [&]() -> asio::awaitable<void> {
            asio::steady_timer timer(context, std::chrono::milliseconds(20));
            co_await timer.async_wait(asio::use_awaitable);
            dialer.close();
        };
        const auto dial = [&]() -> asio::awaitable<void> {
            ec = co_await dialer.handshake(role::dialer, alice, bob.id());
        };
        run_all(context, deadline(), dial());
        CHECK(ec == asio::error::operation_aborted);
    }
}

TEST_CASE("secure_stream reports the wrong peer and a foreign swarm", "[net][secure_stream]") {
    const auto alice = identity_of(1), bob = identity_of(2), mallory = identity_of(3);
    {
        asio::io_context context;
        auto ends = secure_ends(tcp_pair(context));
        const auto [dialer_error, listener_error] =
            handshake_both(context, ends, alice, mallory, {}, {}, bob.id());
        CHECK(dialer_error == errc::peer_id_mismatch);
        CHECK(listener_error == errc::connection_closed); // the dialer hung up
    }
    {
        asio::io_context context;
        auto ends = secure_ends(tcp_pair(context));
        secure_options swarm;
        swarm.swarm_key = std::array<std::byte, 32>{std::byte{7}};
        const auto [dialer_error, listener_error] =
            handshake_both(context, ends, alice, bob, {}, swarm, bob.id());
        CHECK(dialer_error == errc::handshake_failed);
        CHECK(listener_error == errc::connection_closed);
    }
}
