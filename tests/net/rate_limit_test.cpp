// The rate caps of net/rate_limit.hpp: the token bucket's schedule against exact figures and
// against the bound it promises, checked window by window; the throttled stream on the
// simulated network, whose virtual time makes every wait exact; the node's checks of its
// options. Whole nodes under caps, on the simulated network and on TCP, are in rpc_test.cpp.
#include "support/bytes.hpp"
#include "support/identities.hpp"
#include "support/windows.hpp"

#include <hivemesh/core/random.hpp>
#include <hivemesh/net/node.hpp>
#include <hivemesh/net/rate_limit.hpp>
#include <hivemesh/net/sim.hpp>

#include <asio/buffer.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/io_context.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <utility>
#include <vector>

using namespace hivemesh;
using namespace std::chrono_literals;

namespace {

using net::detail::token_bucket;
using sim_node = net::node<net::sim::transport>;
using capped_sim_stream = net::detail::throttled_stream<net::sim::stream, net::sim::timer>;
using std::chrono::microseconds;
using test::busiest_window;
using test::timed_bytes;

/// Two simulated nodes of `network` joined by a stream: {the dialer's end, the acceptor's}.
std::pair<net::sim::stream, net::sim::stream> joined(net::sim::network& network) {
    net::sim::transport a(network, network.add_node()), b(network, network.add_node());
    auto listener = b.listen(0);
    std::optional<net::sim::stream> ends[2];
    a.async_connect(listener.local_endpoint(), [&](std::error_code ec, net::sim::stream s) {
        CHECK_FALSE(ec);
        ends[0].emplace(std::move(s));
    });
    listener.async_accept([&](std::error_code ec, net::sim::stream s) {
        CHECK_FALSE(ec);
        ends[1].emplace(std::move(s));
    });
    network.time().run();
    REQUIRE(ends[0]);
    REQUIRE(ends[1]);
    return {std::move(*ends[0]), std::move(*ends[1])};
}

/// Reads `stream` into `into` until it is full or a read fails (the error goes to
/// `failed`), noting when each read completed, after `start`, and how much it brought.
template <class Stream>
void read_into(net::sim::network& network, Stream& stream, byte_buffer& into, time_point start,
               std::vector<timed_bytes>& reads, std::optional<std::error_code>& failed) {
    asio::co_spawn(
        network.get_executor(),
        [&network, &stream, &into, start, &reads, &failed]() -> asio::awaitable<void> {
            for (std::size_t offset = 0; offset < into.size();) {
                auto [ec, n] = co_await stream.async_read_some(
                    asio::buffer(into.data() + offset, into.size() - offset),
                    asio::experimental::as_tuple(asio::use_awaitable));
                if (ec) {
                    failed = ec;
                    co_return;
                }
                reads.push_back({network.time().now() - start, n});
                offset += n;
            }
        },
        asio::detached);
}

} // namespace

TEST_CASE("a rate cap is 0 or at least a byte a second, and its burst 50 ms of it, 64 KiB to "
          "64 MiB",
          "[net][rate]") {
    CHECK(net::is_valid_rate_limit(0));
    CHECK(net::is_valid_rate_limit(1));
    CHECK(net::is_valid_rate_limit(1e12));
    CHECK_FALSE(net::is_valid_rate_limit(-1));
    CHECK_FALSE(net::is_valid_rate_limit(0.5));
    CHECK_FALSE(net::is_valid_rate_limit(std::numeric_limits<double>::infinity()));
    CHECK_FALSE(net::is_valid_rate_limit(std::numeric_limits<double>::quiet_NaN()));
    CHECK(net::rate_limit_burst(1) == 65'536);
    CHECK(net::rate_limit_burst(1e6) == 65'536);
    CHECK(net::rate_limit_burst(1e8) == 5'000'000);
    CHECK(net::rate_limit_burst(1e12) == std::size_t{64} << 20);
}

TEST_CASE("a node refuses a negative, non-finite or tiny rate cap", "[net][rate]") {
    asio::io_context io;
    net::sim::network network(io, 1);
    net::sim::transport transport(network, network.add_node());
    for (const double bad : {-1.0, 0.5, std::numeric_limits<double>::infinity(),
                             std::numeric_limits<double>::quiet_NaN()}) {
        net::node_options up;
        up.max_upload_rate = bad;
        CHECK_THROWS_AS(sim_node(transport, test::identity_of(1), up), std::invalid_argument);
        net::node_options down;
        down.max_download_rate = bad;
        CHECK_THROWS_AS(sim_node(transport, test::identity_of(1), down), std::invalid_argument);
    }
    net::node_options capped;
    capped.max_upload_rate = 1e6;
    capped.max_download_rate = 1;
    const sim_node node(transport, test::identity_of(1), capped);
    CHECK(node.options().max_upload_rate == 1e6);
    CHECK(node.options().max_download_rate == 1);
}

TEST_CASE("a token bucket starts full, then hands out bytes at its rate in the order asked",
          "[net][rate]") {
    token_bucket bucket(1e6, 65'536); // a byte costs exactly 1 µs
    const duration t0 = 10s;
    CHECK(bucket.take(t0, 65'536) == 0us);                // the whole burst at once
    CHECK(bucket.take(t0, 1'000) == microseconds(1'000)); // then what refills
    CHECK(bucket.take(t0, 65'536) == microseconds(66'536));
    bucket.give_back(65'536, 536);             // a write that sent 536 of them
    CHECK(bucket.take(t0 + 100ms, 10) == 0us); // full again by then
    CHECK(bucket.take(t0 + 100ms, 65'536) == microseconds(10));
    CHECK(bucket.delayed_bytes() == 1'000 + 65'536 + 65'536);
    CHECK(bucket.delay() == microseconds(1'000 + 66'536 + 10));

    // Asked back to back it moves the burst, then exactly the rate.
    token_bucket busy(1e6, 65'536);
    duration now = t0;
    std::uint64_t moved = 0;
    for (int i = 0; i < 1'000; ++i) {
        now += busy.take(now, 10'000);
        moved += 10'000;
    }
    CHECK(moved == 65'536 + static_cast<std::uint64_t>((now - t0) / 1us));
}

TEST_CASE("bytes used when a token bucket says never exceed rate x T + burst in any window",
          "[net][rate]") {
    random_generator random(5);
    for (const double rate : {1e3, 1e6, 3.3e7}) {
        const std::size_t burst = net::rate_limit_burst(rate);
        const auto burst_time = std::chrono::duration_cast<duration>(
            std::chrono::duration<double>(static_cast<double>(burst) / rate));
        token_bucket bucket(rate, burst);
        std::vector<timed_bytes> uses;
        duration now = 1s;
        for (int i = 0; i < 20'000; ++i) {
            // Gaps from none to two bursts' worth: busy and idle spells.
            now += duration(static_cast<duration::rep>(
                random.uniform(static_cast<std::uint64_t>(2 * burst_time.count()) + 1)));
            const std::size_t wanted = 1 + static_cast<std::size_t>(random.uniform(burst));
            const duration wait = bucket.take(now, wanted);
            // A quarter send less, or nothing (a partial write, a cancelled one).
            std::size_t used = wanted;
            if (random.uniform(4) == 0) {
                used = static_cast<std::size_t>(random.uniform(wanted + 1));
                bucket.give_back(wanted, used);
            }
            if (used > 0) uses.push_back({now + wait, used});
        }
        std::stable_sort(uses.begin(), uses.end(),
                         [](const timed_bytes& a, const timed_bytes& b) { return a.at < b.at; });
        for (const duration width : {duration(1ms), duration(1s), 10 * burst_time}) {
            const double bound =
                rate * std::chrono::duration<double>(width).count() + static_cast<double>(burst);
            CAPTURE(rate, width.count());
            // +1: costs are whole nanoseconds rounded up, so the burst's time holds at most
            // rate x 1 ns more than the burst.
            CHECK(static_cast<double>(busiest_window(uses, width)) <= bound + 1);
        }
    }
}

TEST_CASE("a throttled stream writes a burst at a time as the bucket refills, and closing ends a "
          "wait at once",
          "[net][rate][sim]") {
    asio::io_context io;
    net::sim::network network(io, 1); // 10 ms links without a bandwidth limit
    auto ends = joined(network);
    auto& peer = ends.second;
    // 64 KiB a second with a 64 KiB burst: each burst after the first costs a second.
    capped_sim_stream capped(std::move(ends.first), std::make_shared<token_bucket>(65'536, 65'536),
                             nullptr);
    const auto data = test::random_bytes(4 * 65'536, 1);
    const time_point start = network.time().now();
    std::optional<duration> written;
    asio::async_write(capped, asio::buffer(data), [&](std::error_code ec, std::size_t n) {
        CHECK_FALSE(ec);
        CHECK(n == data.size());
        written = network.time().now() - start;
    });
    byte_buffer got(data.size());
    std::vector<timed_bytes> arrivals;
    std::optional<std::error_code> failed;
    read_into(network, peer, got, start, arrivals, failed);
    REQUIRE(network.time().run_until([&] { return arrivals.size() == 4; }, 10s));
    CHECK_FALSE(failed);
    REQUIRE(written);
    CHECK(*written == 3s); // the fourth burst went out then
    CHECK(got == data);
    const std::vector<duration> at{10ms, 1010ms, 2010ms, 3010ms}; // plus the link's 10 ms
    REQUIRE(arrivals.size() == at.size());
    for (std::size_t i = 0; i < at.size(); ++i) {
        CHECK(arrivals[i].at == at[i]);
        CHECK(arrivals[i].bytes == 65'536);
    }

    // The bucket is empty until 4 s: a write now (3.01 s) waits, and closing ends its wait
    // at once.
    std::optional<std::error_code> aborted;
    capped.async_write_some(asio::buffer(data), [&](std::error_code ec, std::size_t n) {
        CHECK(n == 0);
        aborted = ec;
    });
    network.time().run_for(500ms);
    CHECK_FALSE(aborted);
    const time_point closed_at = network.time().now();
    std::error_code ignored;
    capped.close(ignored);
    network.time().poll();
    REQUIRE(aborted);
    CHECK(*aborted == asio::error::operation_aborted);
    CHECK(network.time().now() == closed_at);
}

TEST_CASE("a throttled stream reads at most a burst and hands it on once paid for, and closing "
          "ends a wait at once",
          "[net][rate][sim]") {
    asio::io_context io;
    net::sim::network network(io, 1);
    auto ends = joined(network);
    auto& peer = ends.first;
    capped_sim_stream capped(std::move(ends.second), nullptr,
                             std::make_shared<token_bucket>(65'536, 65'536));
    const auto data = test::random_bytes(4 * 65'536, 2);
    asio::async_write(peer, asio::buffer(data),
                      [](std::error_code ec, std::size_t) { CHECK_FALSE(ec); });
    network.time().run_for(1s); // everything is there to read
    const time_point start = network.time().now();
    byte_buffer got(data.size());
    std::vector<timed_bytes> reads;
    std::optional<std::error_code> last;
    read_into(network, capped, got, start, reads, last);
    network.time().run_for(2500ms);
    // A burst from the full bucket at once, then a burst a second, though all of it is here.
    const std::vector<duration> at{0s, 1s, 2s};
    REQUIRE(reads.size() == at.size());
    for (std::size_t i = 0; i < at.size(); ++i) {
        CHECK(reads[i].at == at[i]);
        CHECK(reads[i].bytes == 65'536);
    }
    CHECK(std::equal(data.begin(), data.begin() + 3 * 65'536, got.begin()));
    // The fourth read has its bytes and waits until 3 s: closing ends the wait now.
    CHECK_FALSE(last);
    std::error_code ignored;
    capped.close(ignored);
    network.time().poll();
    REQUIRE(last);
    CHECK(*last == asio::error::operation_aborted);
    CHECK(network.time().now() - start == 2500ms);
}
