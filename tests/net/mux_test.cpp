#include "net/memory_channel.hpp"
#include "support/bytes.hpp"

#include <hivemesh/core/random.hpp>
#include <hivemesh/net/mux.hpp>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

using namespace hivemesh;
using net::mux_connection;
using net::mux_stream;
using test::memory_channel;
using test::random_bytes;

namespace {

crypto::peer_id fake_id(std::uint8_t fill) {
    crypto::peer_id::bytes_type bytes{};
    bytes.fill(std::byte{fill});
    return crypto::peer_id(bytes);
}

/// Spawns `coroutine` and rethrows anything it throws when the test inspects it.
struct task_result {
    bool done = false;
    std::exception_ptr failure;
};

template <class Awaitable>
std::shared_ptr<task_result> spawn(asio::io_context& io, Awaitable coroutine) {
    auto result = std::make_shared<task_result>();
    asio::co_spawn(io, std::move(coroutine), [result](std::exception_ptr e) {
        result->done = true;
        result->failure = e;
    });
    return result;
}

/// Runs handlers until `done()` or nothing is left to run; the real-time bound only
/// keeps a broken test from hanging, it asserts nothing about speed.
template <class Predicate>
bool run_until(asio::io_context& io, Predicate done) {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!done()) {
        if (io.run_one_for(std::chrono::seconds(1)) == 0 && io.stopped()) io.restart();
        if (std::chrono::steady_clock::now() > give_up) return false;
    }
    return true;
}

/// Inside a coroutine: polls `done()` between short real-time sleeps until it holds.
template <class Predicate>
asio::awaitable<void> poll_until(asio::io_context& io, Predicate done) {
    while (!done()) {
        asio::steady_timer t(io, std::chrono::microseconds(100));
        co_await t.async_wait(asio::use_awaitable);
    }
}

/// Awaits `op` and requires it to succeed. The co_await stays out of the assertion macro:
/// g++ 12 miscompiles co_await inside one (CONTRIBUTING.md).
asio::awaitable<void> require_ok(asio::awaitable<std::error_code> op) {
    const std::error_code ec = co_await std::move(op);
    REQUIRE_FALSE(ec);
}

/// Opens a stream on `connection`, sends `message` on it and returns what the next receive
/// on that stream reports: how the stream ended from the other side.
asio::awaitable<std::error_code> send_on_new_stream(mux_connection& connection,
                                                    byte_buffer message) {
    mux_stream s;
    co_await require_ok(connection.open(s));
    co_await require_ok(s.send(std::move(message)));
    byte_buffer m;
    const std::error_code ec = co_await s.receive(m);
    co_return ec;
}

/// Every message on `s` until the peer ends it; any other error fails the test.
asio::awaitable<std::vector<byte_buffer>> receive_until_end(mux_stream& s) {
    std::vector<byte_buffer> got;
    while (true) {
        byte_buffer m;
        const auto ec = co_await s.receive(m);
        if (ec == asio::error::eof) break;
        REQUIRE_FALSE(ec);
        got.push_back(std::move(m));
    }
    co_return got;
}

/// Two multiplexed connections over an in-memory channel.
struct mux_pair {
    asio::io_context io;
    std::shared_ptr<memory_channel::shared_state> wire;
    std::shared_ptr<mux_connection> a, b;
    std::vector<mux_stream> incoming_a, incoming_b;
    std::vector<bool> ready_on_arrival_b; ///< each incoming_b stream's ready() when handed over
    std::error_code closed_a, closed_b;
    bool a_closed = false, b_closed = false;

    memory_channel* channel_a = nullptr; ///< owned by `a`
    memory_channel* channel_b = nullptr; ///< owned by `b`

    /// `placing`: both channels offer records to the multiplexers' placement, as a
    /// plaintext secure stream does with large ones.
    explicit mux_pair(net::mux_options options_a = {}, net::mux_options options_b = {},
                      bool placing = false) {
        auto [end_a, end_b] = memory_channel::make_pair(io.get_executor());
        wire = end_a->state();
        channel_a = end_a.get();
        channel_b = end_b.get();
        channel_a->placing = channel_b->placing = placing;
        a = std::make_shared<mux_connection>(io.get_executor(), std::move(end_a), fake_id(2), true,
                                             options_a);
        b = std::make_shared<mux_connection>(io.get_executor(), std::move(end_b), fake_id(1), false,
                                             options_b);
        a->start(
            {}, [this](mux_stream s) { incoming_a.push_back(std::move(s)); },
            [this](std::error_code ec) {
                a_closed = true;
                closed_a = ec;
            });
        b->start(
            to_buffer(as_bytes(std::string_view("hello from b"))),
            [this](mux_stream s) {
                ready_on_arrival_b.push_back(s.ready());
                incoming_b.push_back(std::move(s));
            },
            [this](std::error_code ec) {
                b_closed = true;
                closed_b = ec;
            });
    }
    ~mux_pair() {
        incoming_a.clear();
        incoming_b.clear();
        a->close();
        b->close();
        io.poll();
    }
    template <class Predicate>
    void run(Predicate done) {
        REQUIRE(run_until(io, done));
    }
    void run(const std::shared_ptr<task_result>& task) {
        run([&] { return task->done; });
        if (task->failure) std::rethrow_exception(task->failure);
    }
};

} // namespace

TEST_CASE("messages of every size cross a stream both ways", "[net][mux]") {
    const bool placing = GENERATE(false, true);
    CAPTURE(placing);
    net::mux_options options;
    options.initial_window = 512 << 10; // messages larger than the window must still flow
    mux_pair pair(options, options, placing);
    const std::size_t frame = options.frame_payload;
    const std::vector<std::size_t> sizes = {0,     1,         100,     frame - 1,
                                            frame, frame + 1, 1 << 20, (3 << 20) + 7};
    byte_buffer hello_seen;
    auto client = spawn(pair.io, [&]() -> asio::awaitable<void> {
        mux_stream s;
        co_await require_ok(pair.a->open(s));
        for (std::size_t i = 0; i < sizes.size(); ++i)
            co_await require_ok(s.send(random_bytes(sizes[i], i), i + 1 == sizes.size()));
        for (std::size_t i = 0; i < sizes.size(); ++i) {
            byte_buffer echo;
            co_await require_ok(s.receive(echo));
            CHECK(echo == random_bytes(sizes[i], i));
        }
        byte_buffer none;
        const std::error_code end = co_await s.receive(none);
        CHECK(end == asio::error::eof);
        hello_seen = pair.a->remote_hello();
    });
    auto server = spawn(pair.io, [&]() -> asio::awaitable<void> {
        co_await poll_until(pair.io, [&] { return !pair.incoming_b.empty(); });
        mux_stream s = std::move(pair.incoming_b.front());
        CHECK(s.remote() == fake_id(1));
        std::vector<byte_buffer> got = co_await receive_until_end(s);
        REQUIRE(got.size() == sizes.size());
        for (std::size_t i = 0; i < got.size(); ++i)
            co_await require_ok(s.send(std::move(got[i]), i + 1 == got.size()));
    });
    pair.run(client);
    pair.run(server);
    CHECK(as_string_view(hello_seen) == "hello from b");
    CHECK(pair.a->stream_count() == 0);
    CHECK(pair.b->stream_count() == 0);
    // Every data frame but the one that opens the stream goes straight to its message.
    if (placing) CHECK(pair.channel_b->placements > 0);
    if (placing) CHECK(pair.channel_a->placements > 0);
}

TEST_CASE("a stream is handed over with the message its first frame carried, and without one "
          "when that frame held only its start",
          "[net][mux]") {
    net::mux_options options;
    mux_pair pair(options, options);
    const std::size_t frame = options.frame_payload;
    mux_stream small, large; // kept open: dropping them would reset them
    auto client = spawn(pair.io, [&]() -> asio::awaitable<void> {
        co_await require_ok(pair.a->open(small));
        co_await require_ok(small.send(random_bytes(100, 1)));
        co_await require_ok(pair.a->open(large));
        co_await require_ok(large.send(random_bytes(frame + 1, 2)));
        co_await poll_until(pair.io, [&] { return pair.incoming_b.size() == 2; });
    });
    pair.run(client);
    REQUIRE(pair.ready_on_arrival_b == std::vector<bool>{true, false});
    auto server = spawn(pair.io, [&]() -> asio::awaitable<void> {
        byte_buffer first, second;
        co_await require_ok(pair.incoming_b[0].receive(first));
        CHECK(first == random_bytes(100, 1));
        co_await require_ok(pair.incoming_b[1].receive(second));
        CHECK(second == random_bytes(frame + 1, 2));
    });
    pair.run(server);
}

TEST_CASE("the storage of a read message lands a later one, on any stream, up to a window",
          "[net][mux]") {
    const bool placing = GENERATE(false, true);
    CAPTURE(placing);
    net::mux_options options;
    options.initial_window = 512 << 10;
    mux_pair pair(options, options, placing);
    const std::size_t part = options.frame_payload + 1000; // two frames each
    const std::size_t count = 8;
    // Sends `count` messages of `size` on a new stream and ends it.
    auto send_stream = [&](std::size_t size, std::size_t seed) -> asio::awaitable<void> {
        mux_stream s;
        co_await require_ok(pair.a->open(s));
        for (std::size_t i = 0; i < count; ++i)
            co_await require_ok(s.send(random_bytes(size, seed + i), i + 1 == count));
    };
    // Reads the next incoming stream, into one buffer or a fresh one per message.
    std::size_t streams_read = 0;
    auto read_stream = [&](std::size_t size, std::size_t seed,
                           bool one_buffer) -> asio::awaitable<void> {
        co_await poll_until(pair.io, [&] { return pair.incoming_b.size() > streams_read; });
        mux_stream s = std::move(pair.incoming_b[streams_read++]);
        byte_buffer kept;
        for (std::size_t i = 0; i < count; ++i) {
            byte_buffer fresh;
            byte_buffer& m = one_buffer ? kept : fresh;
            co_await require_ok(s.receive(m));
            REQUIRE(m == random_bytes(size, seed + i));
        }
    };
    const auto& stats = pair.b->statistics();
    const auto run_stream = [&](std::size_t size, std::size_t seed, bool one_buffer) {
        auto sender = spawn(pair.io, send_stream(size, seed));
        auto reader = spawn(pair.io, read_stream(size, seed, one_buffer));
        pair.run(sender);
        pair.run(reader);
    };

    // Storage larger than a window is never kept: nothing to reuse yet.
    run_stream(options.initial_window + 1000, 300, true);
    CHECK(stats.landings_reused == 0);

    run_stream(part, 0, true);
    const auto first = stats.landings_reused;
    // The messages on the wire while the first was read landed fresh; the rest reused.
    CHECK(first >= count / 2);
    CHECK(first < count);
    // The buffers read last wait for the next stream.
    run_stream(part, 100, true);
    CHECK(stats.landings_reused >= first + count - 1);
    // Storage the reader keeps is not reused; spares left from before still are, once each.
    const auto before_fresh = stats.landings_reused;
    run_stream(part, 200, false);
    CHECK(stats.landings_reused <= before_fresh + 4);
    // Reused storage is written over, not cleared first: messages shorter and longer than
    // the ones it held arrive exactly (read_stream compares every byte and the size).
    const auto before_sizes = stats.landings_reused;
    run_stream(options.frame_payload + 10, 400, true);
    run_stream(options.frame_payload + 5000, 500, true);
    CHECK(stats.landings_reused >= before_sizes + count);
}

TEST_CASE("messages with a lead and an owned, shared or borrowed body arrive whole, across "
          "frames, on every stream",
          "[net][mux]") {
    const bool placing = GENERATE(false, true);
    CAPTURE(placing);
    net::mux_options options;
    options.frame_payload = 1000; // every message but the empty ones spans several frames
    mux_pair pair(options, options, placing);
    const auto shared = std::make_shared<const byte_buffer>(random_bytes(4321, 7));
    const byte_buffer borrowed = random_bytes(3000, 5);
    const byte_buffer long_lead = random_bytes(net::mux_message::max_lead, 6);
    const auto joined = [](byte_view lead, byte_view body) {
        byte_buffer out(lead.begin(), lead.end());
        out.insert(out.end(), body.begin(), body.end());
        return out;
    };
    const std::byte seven{7}, nine{9}, one{1};
    // Per stream: an owned body with a lead, the shared body bare and with a lead, the
    // borrowed body with the longest lead, a lead alone.
    const std::vector<byte_buffer> expected{joined(byte_view(&seven, 1), random_bytes(2500, 3)),
                                            *shared, joined(byte_view(&nine, 1), *shared),
                                            joined(long_lead, borrowed),
                                            joined(byte_view(&one, 1), {})};
    auto sender = [&]() -> asio::awaitable<void> {
        mux_stream s;
        co_await require_ok(pair.a->open(s));
        std::vector<net::mux_message> messages(5);
        messages[0].add_lead(byte_view(&seven, 1));
        messages[0].body = random_bytes(2500, 3);
        messages[1].shared_body = shared;
        messages[2].add_lead(byte_view(&nine, 1));
        messages[2].shared_body = shared;
        messages[3].add_lead(byte_view(long_lead).first(10));
        messages[3].add_lead(byte_view(long_lead).subspan(10));
        messages[3].borrowed_body = borrowed;
        messages[4].add_lead(byte_view(&one, 1));
        for (std::size_t i = 0; i < messages.size(); ++i)
            co_await require_ok(s.send(std::move(messages[i]), i == 4));
    };
    auto first = spawn(pair.io, sender());
    auto second = spawn(pair.io, sender());
    std::vector<std::vector<byte_buffer>> received;
    auto reader = spawn(pair.io, [&]() -> asio::awaitable<void> {
        co_await poll_until(pair.io, [&] { return pair.incoming_b.size() >= 2; });
        for (auto& s : pair.incoming_b) {
            auto got = co_await receive_until_end(s);
            received.push_back(std::move(got));
        }
    });
    pair.run(first);
    pair.run(second);
    pair.run(reader);
    REQUIRE(received.size() == 2);
    CHECK(received[0] == expected);
    CHECK(received[1] == expected);
    CHECK(*shared == random_bytes(4321, 7));
    if (placing) CHECK(pair.channel_b->placements > 0);
    net::mux_message full;
    full.add_lead(long_lead);
    CHECK_THROWS_AS(full.add_lead(byte_view(&one, 1)), std::length_error);
    CHECK(full.lead().size() == net::mux_message::max_lead);
}

TEST_CASE("a borrowed body is read no more once its send ended, though a write is under way",
          "[net][mux]") {
    const bool gather = GENERATE(false, true); // the channel reads bodies while it waits
    CAPTURE(gather);
    mux_pair pair;
    pair.channel_a->gather_writes = gather;
    auto body = std::make_unique<byte_buffer>(random_bytes(5000, 4));
    mux_stream stream;
    bool opened = false;
    std::error_code sent;
    auto sender = spawn(pair.io, [&]() -> asio::awaitable<void> {
        co_await require_ok(pair.a->open(stream));
        co_await require_ok(stream.send(random_bytes(10, 9)));
        opened = true;
        co_await poll_until(pair.io, [&] { return pair.channel_a->holding; });
        net::mux_message message;
        message.borrowed_body = *body;
        sent = co_await stream.send(std::move(message));
    });
    pair.run([&] { return opened; });
    pair.channel_a->holding = true;
    pair.run([&] { return pair.channel_a->writes_held > 0; });
    stream.reset(errc::cancelled);
    pair.run(sender);
    CHECK(sent == errc::cancelled);
    body.reset(); // a read of it from now on is a use after free (ASan)
    pair.channel_a->holding = false;
    // Only a write that still reads the body had to end with the connection.
    CHECK(pair.a->is_open() == !gather);
    if (gather) return;
    byte_buffer got;
    auto again = spawn(pair.io, [&]() -> asio::awaitable<void> {
        mux_stream next;
        co_await require_ok(pair.a->open(next));
        co_await require_ok(next.send(random_bytes(100, 8)));
        co_await poll_until(pair.io, [&] { return pair.incoming_b.size() == 2; });
        co_await require_ok(pair.incoming_b[1].receive(got));
    });
    pair.run(again);
    CHECK(got == random_bytes(100, 8));
}

TEST_CASE("a stream that ends while a frame is being placed into it drops only that frame",
          "[net][mux]") {
    net::mux_options options;
    options.frame_payload = 1000;
    mux_pair pair(options, options, true);
    const auto big = random_bytes(5000, 1), small = random_bytes(10, 2);
    auto sender = [&](const byte_buffer& message) -> asio::awaitable<void> {
        mux_stream s;
        co_await require_ok(pair.a->open(s));
        // The receiver may reset the stream before the message is out: either is fine.
        const std::error_code ignored = co_await s.send(message, true);
        (void)ignored;
        byte_buffer none;
        const std::error_code ended = co_await s.receive(none);
        (void)ended;
    };
    // The first placement into stream 1 resets that stream before the bytes land.
    pair.channel_b->on_placed = [&] {
        pair.channel_b->on_placed = nullptr;
        CHECK(pair.incoming_b.size() == 1);
        if (!pair.incoming_b.empty()) pair.incoming_b.front().reset(errc::cancelled);
    };
    auto doomed = spawn(pair.io, sender(big));
    pair.run([&] { return pair.channel_b->placements >= 1; });
    pair.run(doomed);
    // The connection is intact: a second stream carries its message whole, through
    // placements too.
    auto fine = spawn(pair.io, sender(big));
    byte_buffer got;
    auto reader = spawn(pair.io, [&]() -> asio::awaitable<void> {
        co_await poll_until(pair.io, [&] { return pair.incoming_b.size() >= 2; });
        auto& s = pair.incoming_b.back();
        co_await require_ok(s.receive(got));
        const std::error_code sent = co_await s.send(small, true);
        CHECK_FALSE(sent);
    });
    pair.run(reader);
    pair.run(fine);
    CHECK(got == big);
    CHECK(pair.a->is_open());
    CHECK(pair.b->is_open());
    CHECK(pair.channel_b->placements >= 2);
    CHECK(pair.b->statistics().peak_buffered <= big.size());
}

TEST_CASE("more streams than the peer allows wait for a free slot", "[net][mux]") {
    net::mux_options server_options;
    server_options.max_streams = 16;
    mux_pair pair({}, server_options);
    constexpr int calls = 200;
    int answered = 0;
    std::size_t most_open = 0;
    for (int i = 0; i < calls; ++i) {
        spawn(pair.io, [&, i]() -> asio::awaitable<void> {
            mux_stream s;
            co_await require_ok(pair.a->open(s));
            most_open = std::max(most_open, pair.a->stream_count());
            co_await require_ok(s.send(random_bytes(10, static_cast<std::uint64_t>(i)), true));
            byte_buffer reply;
            co_await require_ok(s.receive(reply));
            CHECK(reply == random_bytes(10, static_cast<std::uint64_t>(i)));
            ++answered;
        });
    }
    spawn(pair.io, [&]() -> asio::awaitable<void> {
        int served = 0;
        while (served < calls) {
            co_await poll_until(pair.io, [&] { return !pair.incoming_b.empty(); });
            auto streams = std::move(pair.incoming_b);
            pair.incoming_b.clear();
            for (auto& s : streams) {
                byte_buffer m;
                co_await require_ok(s.receive(m));
                co_await require_ok(s.send(std::move(m), true));
                ++served;
            }
        }
    });
    pair.run([&] { return answered == calls; });
    CHECK(most_open <= 16);
    CHECK_FALSE(pair.a_closed);
}

TEST_CASE("a small message overtakes a large one on another stream", "[net][mux]") {
    mux_pair pair;
    std::vector<std::string> arrival;
    auto big = spawn(pair.io, [&]() -> asio::awaitable<void> {
        mux_stream s;
        co_await require_ok(pair.a->open(s));
        co_await require_ok(s.send(random_bytes(8 << 20, 1), true));
    });
    auto small = spawn(pair.io, [&]() -> asio::awaitable<void> {
        mux_stream s;
        co_await require_ok(pair.a->open(s));
        co_await require_ok(s.send(random_bytes(100, 2), true));
    });
    auto reader = spawn(pair.io, [&]() -> asio::awaitable<void> {
        co_await poll_until(pair.io, [&] { return pair.incoming_b.size() >= 2; });
        auto read_one = [&](mux_stream& s) -> asio::awaitable<void> {
            byte_buffer m;
            co_await require_ok(s.receive(m));
            arrival.push_back(m.size() == 100 ? "small" : "big");
        };
        auto s0 = std::move(pair.incoming_b[0]);
        auto s1 = std::move(pair.incoming_b[1]);
        spawn(pair.io, read_one(s0));
        co_await read_one(s1);
        co_await poll_until(pair.io, [&] { return arrival.size() >= 2; });
    });
    pair.run(reader);
    pair.run(big);
    pair.run(small);
    REQUIRE(arrival.size() == 2);
    CHECK(arrival[0] == "small");
}

TEST_CASE("a receiver that stops reading stalls the sender at its window", "[net][mux]") {
    net::mux_options receiver;
    receiver.initial_window = 256 << 10;
    mux_pair pair({}, receiver);
    std::size_t sent = 0;
    bool sender_done = false;
    spawn(pair.io, [&]() -> asio::awaitable<void> {
        mux_stream s;
        co_await require_ok(pair.a->open(s));
        for (int i = 0; i < 64; ++i) {
            co_await require_ok(s.send(random_bytes(32 << 10, 9)));
            sent += 32 << 10;
        }
        sender_done = true;
    });
    // Let everything settle without reading: the sender must stop at the window.
    pair.run([&] { return !pair.incoming_b.empty(); });
    for (int i = 0; i < 1000; ++i)
        pair.io.poll();
    CHECK_FALSE(sender_done);
    CHECK(sent <= (256 << 10) + (64 << 10));
    CHECK(pair.wire->bytes_written[0] <= (256 << 10) + (80 << 10));
    // Reading releases it.
    std::size_t received = 0;
    auto reader = spawn(pair.io, [&]() -> asio::awaitable<void> {
        auto& s = pair.incoming_b.front();
        for (int i = 0; i < 64; ++i) {
            byte_buffer m;
            co_await require_ok(s.receive(m));
            received += m.size();
        }
    });
    pair.run(reader);
    CHECK(received == 64u * (32 << 10));
    pair.run([&] { return sender_done; });
}

TEST_CASE("a window grows by the channel's round trips and clock, also after the clock stepped "
          "back",
          "[net][mux]") {
    using namespace std::chrono_literals;
    mux_pair pair;
    pair.channel_b->round_trip = 10ms;
    mux_stream sender;
    pair.run(spawn(pair.io,
                   [&]() -> asio::awaitable<void> { co_await require_ok(pair.a->open(sender)); }));
    // Moves `mib` messages of 1 MiB from a to b, read as they come, with b's clock at `at`.
    auto move = [&](int mib, std::chrono::nanoseconds at) {
        pair.channel_b->clock = time_point(at);
        auto sending = spawn(pair.io, [&, mib]() -> asio::awaitable<void> {
            for (int i = 0; i < mib; ++i)
                co_await require_ok(sender.send(random_bytes(1 << 20, 3)));
        });
        pair.run([&] { return !pair.incoming_b.empty(); });
        pair.run(spawn(pair.io, [&, mib]() -> asio::awaitable<void> {
            for (int i = 0; i < mib; ++i) {
                byte_buffer m;
                co_await require_ok(pair.incoming_b.front().receive(m));
            }
        }));
        pair.run(sending);
        return pair.b->statistics().widest_window;
    };
    const std::uint32_t initial = net::mux_options{}.initial_window;
    CHECK(move(1, 3600s) == initial); // the first sample spans the hour since the epoch
    CHECK(move(2, 0s) == initial);    // the clock stepped back an hour: a new sample
    // 2 MiB in the round trip since: more than half the window, which doubles.
    CHECK(move(1, 10ms) == 2 * initial);
    // 1 MiB in 100 ms, a fortieth of the window a round trip: it stays.
    CHECK(move(1, 110ms) == 2 * initial);
}

TEST_CASE("a reset reaches the other side with its code", "[net][mux]") {
    mux_pair pair;
    std::error_code seen;
    auto client = spawn(pair.io, [&]() -> asio::awaitable<void> {
        seen = co_await send_on_new_stream(*pair.a, random_bytes(10, 1));
    });
    pair.run([&] { return !pair.incoming_b.empty(); });
    pair.incoming_b.front().reset(errc::refused);
    pair.run(client);
    CHECK(seen == errc::refused);
    CHECK(pair.a->stream_count() == 0);
    CHECK(pair.b->stream_count() == 0);
}

TEST_CASE("dropping a stream resets it, unless it already said everything", "[net][mux]") {
    mux_pair pair;
    std::error_code first, second;
    byte_buffer kept;
    auto client = spawn(pair.io, [&]() -> asio::awaitable<void> {
        mux_stream s1, s2;
        co_await require_ok(pair.a->open(s1));
        co_await require_ok(s1.send(random_bytes(1, 1)));
        co_await require_ok(pair.a->open(s2));
        co_await require_ok(s2.send(random_bytes(1, 2)));
        byte_buffer m;
        first = co_await s1.receive(m);
        second = co_await s2.receive(kept);
        if (!second) second = co_await s2.receive(m);
    });
    pair.run([&] { return pair.incoming_b.size() == 2; });
    // Stream 1: dropped with nothing said -> the client sees cancelled.
    pair.incoming_b[0] = mux_stream();
    // Stream 2: a final message with end_stream, then dropped -> the client keeps it.
    auto server = spawn(pair.io, [&]() -> asio::awaitable<void> {
        mux_stream s = std::move(pair.incoming_b[1]);
        co_await require_ok(s.send(random_bytes(5, 5), true));
    });
    pair.run(server);
    pair.run(client);
    CHECK(first == errc::cancelled);
    CHECK(kept == random_bytes(5, 5));
    CHECK(second == asio::error::eof);
    pair.run([&] { return pair.a->stream_count() == 0 && pair.b->stream_count() == 0; });
}

TEST_CASE("a peer that ends cleanly while our send is queued: what it sent stays readable",
          "[net][mux]") {
    mux_pair pair;
    mux_stream s;
    auto opened = spawn(pair.io, [&]() -> asio::awaitable<void> {
        const std::error_code open_error = co_await pair.a->open(s);
        REQUIRE_FALSE(open_error);
        const std::error_code sent = co_await s.send(random_bytes(10, 1));
        REQUIRE_FALSE(sent);
    });
    pair.run(opened);
    pair.run([&] { return pair.incoming_b.size() == 1; });
    // More than the peer's window, which it never reads: stays queued.
    std::optional<std::error_code> big;
    auto sender = spawn(pair.io, [&]() -> asio::awaitable<void> {
        big = co_await s.send(random_bytes(8u << 20, 2));
    });
    for (int i = 0; i < 50; ++i)
        pair.io.poll();
    REQUIRE_FALSE(big.has_value());
    auto server = spawn(pair.io, [&]() -> asio::awaitable<void> {
        mux_stream peer = std::move(pair.incoming_b[0]);
        co_await require_ok(peer.send(random_bytes(5, 5), true));
    }); // dropped after its last message: a clean end
    pair.run(server);
    pair.run(sender);
    CHECK(big == errc::cancelled);
    byte_buffer first, second;
    std::error_code got_first, got_second;
    auto reader = spawn(pair.io, [&]() -> asio::awaitable<void> {
        got_first = co_await s.receive(first);
        got_second = co_await s.receive(second);
    });
    pair.run(reader);
    CHECK_FALSE(got_first);
    CHECK(first == random_bytes(5, 5));
    CHECK(got_second == asio::error::eof);
}

TEST_CASE("a message over the peer's limit is refused before sending", "[net][mux]") {
    net::mux_options server_options;
    server_options.max_message_size = 1000;
    mux_pair pair({}, server_options);
    std::error_code too_big, fits;
    auto client = spawn(pair.io, [&]() -> asio::awaitable<void> {
        // Wait for the server's settings, which carry its limit.
        co_await poll_until(pair.io, [&] { return !pair.a->remote_hello().empty(); });
        mux_stream s;
        co_await require_ok(pair.a->open(s));
        too_big = co_await s.send(random_bytes(1001, 1));
        fits = co_await s.send(random_bytes(1000, 1));
    });
    pair.run(client);
    CHECK(too_big == errc::message_too_large);
    CHECK_FALSE(fits);
}

TEST_CASE("closing a connection fails its streams and pending opens", "[net][mux]") {
    net::mux_options server_options;
    server_options.max_streams = 1;
    mux_pair pair({}, server_options);
    std::error_code read_error, open_error;
    auto first = spawn(pair.io, [&]() -> asio::awaitable<void> {
        read_error = co_await send_on_new_stream(*pair.a, random_bytes(1, 1));
    });
    pair.run([&] { return !pair.incoming_b.empty() && !pair.a->remote_hello().empty(); });
    auto second = spawn(pair.io, [&]() -> asio::awaitable<void> {
        mux_stream s;
        open_error = co_await pair.a->open(s); // waits: the server allows one stream
    });
    for (int i = 0; i < 100; ++i)
        pair.io.poll();
    CHECK_FALSE(second->done);
    pair.a->close();
    pair.run(first);
    pair.run(second);
    CHECK(read_error == errc::connection_closed);
    CHECK(open_error == errc::connection_closed);
    pair.run([&] { return pair.b_closed; });
    CHECK(pair.closed_b == errc::connection_closed);
}

TEST_CASE("after a goaway the streams under way finish, no new one opens, and the "
          "connection closes once idle",
          "[net][mux]") {
    mux_pair pair;
    mux_stream call;
    byte_buffer reply;
    std::error_code reply_error, end_error, open_error;
    auto caller = spawn(pair.io, [&]() -> asio::awaitable<void> {
        co_await require_ok(pair.a->open(call));
        co_await require_ok(call.send(random_bytes(100, 1), true));
        reply_error = co_await call.receive(reply);
        byte_buffer more;
        end_error = co_await call.receive(more);
    });
    pair.run([&] { return !pair.incoming_b.empty(); });
    pair.b->go_away();
    pair.b->go_away(); // idempotent
    CHECK_FALSE(pair.b->accepts_streams());
    pair.run([&] { return !pair.a->accepts_streams(); });
    CHECK(pair.a->is_open()); // a stream is still under way
    auto late = spawn(pair.io, [&]() -> asio::awaitable<void> {
        mux_stream s;
        open_error = co_await pair.a->open(s);
    });
    pair.run(late);
    CHECK(open_error == errc::connection_closed);

    // The goaway's sender still serves the stream it had.
    auto served = spawn(pair.io, [&]() -> asio::awaitable<void> {
        auto& s = pair.incoming_b.front();
        byte_buffer request;
        co_await require_ok(s.receive(request));
        co_await require_ok(s.send(std::move(request), true));
    });
    pair.run(served);
    pair.run(caller);
    CHECK_FALSE(reply_error);
    CHECK(reply == random_bytes(100, 1));
    CHECK(end_error == asio::error::eof);
    // The receiver of the goaway closes the idle connection; no stream failed.
    pair.run([&] { return pair.a_closed && pair.b_closed; });
    CHECK(pair.closed_a == errc::connection_closed);
}

TEST_CASE("until_idle waits for the last stream, or the close", "[net][mux]") {
    mux_pair pair;
    bool idle = false;
    auto waiter = spawn(pair.io, [&]() -> asio::awaitable<void> {
        co_await pair.b->until_idle(); // no stream yet: at once
        mux_stream s;
        co_await require_ok(pair.b->open(s));
        co_await require_ok(s.send(random_bytes(10, 2), true));
        co_await pair.b->until_idle();
        idle = true;
    });
    pair.run([&] { return !pair.incoming_a.empty(); });
    for (int i = 0; i < 50; ++i)
        pair.io.poll();
    CHECK_FALSE(idle);
    pair.incoming_a.front().reset(errc::refused); // the last stream ends
    pair.run(waiter);
    CHECK(idle);
    CHECK(pair.b->is_open());
}

// ---- a hand-written peer that breaks the protocol -----------------------------------

namespace {

struct raw_peer {
    asio::io_context io;
    std::unique_ptr<memory_channel> raw;
    std::shared_ptr<mux_connection> victim;
    std::vector<mux_stream> incoming;
    bool closed = false;
    std::error_code reason;

    explicit raw_peer(net::mux_options options = {}) {
        auto [end_raw, end_mux] = memory_channel::make_pair(io.get_executor());
        raw = std::move(end_raw);
        victim = std::make_shared<mux_connection>(io.get_executor(), std::move(end_mux), fake_id(9),
                                                  false, options);
        victim->start(
            {}, [this](mux_stream s) { incoming.push_back(std::move(s)); },
            [this](std::error_code ec) {
                closed = true;
                reason = ec;
            });
    }
    ~raw_peer() {
        incoming.clear();
        victim->close();
        io.poll();
    }
    void send(byte_buffer frame) {
        auto task = spawn(io, [this, frame = std::move(frame)]() -> asio::awaitable<void> {
            const byte_view head, body = frame;
            co_await require_ok(raw->write(std::span(&head, 1), std::span(&body, 1)));
        });
        REQUIRE(run_until(io, [&] { return task->done; }));
        for (int i = 0; i < 20; ++i)
            io.poll();
    }
    /// Frames the victim sent, decoded (payloads copied).
    std::vector<std::pair<net::frame, byte_buffer>> received() {
        std::vector<std::pair<net::frame, byte_buffer>> out;
        auto& queue = raw->state()->queues[0];
        while (!queue.empty()) {
            net::frame f;
            byte_buffer record = std::move(queue.front());
            queue.pop_front();
            REQUIRE_FALSE(net::decode_frame(record, f, 1 << 20));
            byte_buffer payload(f.payload.begin(), f.payload.end());
            out.emplace_back(std::move(f), std::move(payload));
        }
        return out;
    }
};

byte_buffer data_frame(std::uint32_t stream, std::uint8_t flags, std::size_t size) {
    byte_buffer out;
    binary_writer w(out);
    net::write_data_header(w, stream, flags);
    w.write_bytes(random_bytes(size, stream));
    return out;
}

} // namespace

TEST_CASE("hostile frames close the connection with a clear error", "[net][mux]") {
    constexpr auto open = net::frame_flags::open;
    constexpr auto end_message = net::frame_flags::end_message;
    struct case_t {
        const char* name;
        std::vector<byte_buffer> frames;
        errc expected = errc::protocol_violation;
    };
    auto bytes = [](std::initializer_list<int> values) {
        byte_buffer out;
        for (int v : values)
            out.push_back(static_cast<std::byte>(v));
        return out;
    };
    const std::vector<case_t> cases = {
        {"empty record", {byte_buffer{}}},
        {"unknown type", {bytes({99, 1, 0, 0, 0})}},
        {"data on stream 0", {data_frame(0, open, 1)}},
        {"unknown flags", {data_frame(1, 0x80, 1)}},
        {"stream of the wrong parity", {data_frame(2, open, 1)}},
        {"duplicate open", {data_frame(1, open, 1), data_frame(1, open, 1)}},
        {"window increment of zero", {data_frame(1, open, 1), bytes({3, 1, 0, 0, 0, 0, 0, 0, 0})}},
        {"truncated window frame", {data_frame(1, open, 1), bytes({3, 1, 0, 0, 0, 1})}},
        {"data after end of stream",
         {data_frame(1, open | net::frame_flags::end_message | net::frame_flags::end_stream, 1),
          data_frame(1, end_message, 1)}},
        {"frame over the payload limit",
         {data_frame(1, open, net::mux_options{}.frame_payload + 1)},
         errc::message_too_large},
        {"second settings",
         {[] {
              byte_buffer f;
              binary_writer w(f);
              net::write_settings_frame(w, {1024, 4, 1024, {}});
              return f;
          }(),
          [] {
              byte_buffer f;
              binary_writer w(f);
              net::write_settings_frame(w, {1024, 4, 1024, {}});
              return f;
          }()}},
    };
    for (const auto& c : cases) {
        INFO(c.name);
        raw_peer peer;
        for (const auto& f : c.frames)
            peer.send(f);
        CHECK(peer.closed);
        CHECK(peer.reason == c.expected);
    }
}

TEST_CASE("a peer overrunning its window is cut off", "[net][mux]") {
    net::mux_options options;
    options.initial_window = 128 << 10;
    raw_peer peer(options);
    constexpr auto open = net::frame_flags::open;
    constexpr auto end_message = net::frame_flags::end_message;
    // Bytes of a message still being assembled are credited at once while nothing is
    // queued ahead of it, so a message larger than the window may keep coming.
    peer.send(data_frame(1, open, 64 << 10));
    peer.send(data_frame(1, 0, 64 << 10));
    peer.send(data_frame(1, 0, 1));
    CHECK_FALSE(peer.closed);
    // Complete messages nobody reads hold their credit: the window is a hard limit.
    peer.send(data_frame(3, open | end_message, 64 << 10));
    peer.send(data_frame(3, end_message, 64 << 10));
    peer.send(data_frame(3, end_message, 1)); // nobody reads stream 3: over its window
    CHECK(peer.closed);
    CHECK(peer.reason == errc::protocol_violation);
}

TEST_CASE("streams beyond the limit are refused, and oversized messages reset", "[net][mux]") {
    net::mux_options options;
    options.max_streams = 2;
    options.max_message_size = 1000;
    raw_peer peer(options);
    constexpr auto open = net::frame_flags::open;
    constexpr auto end_message = net::frame_flags::end_message;
    peer.send(data_frame(1, open, 10));
    peer.send(data_frame(3, open, 10));
    peer.send(data_frame(5, open, 10)); // third stream: refused
    peer.send(data_frame(1, 0, 991));   // 1001 bytes in one message: reset
    CHECK_FALSE(peer.closed);
    CHECK(peer.incoming.size() == 2);
    std::vector<std::pair<std::uint32_t, std::uint32_t>> resets;
    for (auto& [f, payload] : peer.received())
        if (f.type == net::frame_type::reset) resets.emplace_back(f.stream, f.value);
    REQUIRE(resets.size() == 2);
    CHECK(resets[0] ==
          std::pair<std::uint32_t, std::uint32_t>{5, static_cast<std::uint32_t>(errc::refused)});
    CHECK(resets[1] == std::pair<std::uint32_t, std::uint32_t>{
                           1, static_cast<std::uint32_t>(errc::message_too_large)});
    CHECK(peer.victim->statistics().streams_refused == 1);
    // Late data for the reset stream, or any stream id without the open flag, is dropped.
    peer.send(data_frame(1, end_message, 5));
    peer.send(data_frame(7, end_message, 5));
    CHECK_FALSE(peer.closed);
    CHECK(peer.incoming.size() == 2);
}

TEST_CASE("after our goaway, streams the peer opens are refused", "[net][mux]") {
    raw_peer peer;
    peer.victim->go_away();
    peer.send(data_frame(1, net::frame_flags::open | net::frame_flags::end_message, 10));
    CHECK_FALSE(peer.closed);
    CHECK(peer.incoming.empty());
    bool goaway = false;
    std::vector<std::pair<std::uint32_t, std::uint32_t>> resets;
    for (auto& [f, payload] : peer.received()) {
        goaway = goaway || f.type == net::frame_type::goaway;
        if (f.type == net::frame_type::reset) resets.emplace_back(f.stream, f.value);
    }
    CHECK(goaway);
    REQUIRE(resets.size() == 1);
    CHECK(resets[0] ==
          std::pair<std::uint32_t, std::uint32_t>{1, static_cast<std::uint32_t>(errc::refused)});
    CHECK(peer.victim->statistics().streams_refused == 0); // a drain, not the peer's excess
}
