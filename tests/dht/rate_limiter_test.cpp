#include <hivemesh/dht/rate_limiter.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <limits>
#include <system_error>

using hivemesh::time_point;
using hivemesh::crypto::peer_id;
using hivemesh::dht::rate_limiter;
using std::chrono::milliseconds;
using std::chrono::seconds;

namespace {

peer_id peer(std::uint8_t n) {
    peer_id::bytes_type bytes{};
    bytes.fill(std::byte{n});
    return peer_id(bytes);
}

const time_point start{seconds(1'700'000'000)};

} // namespace

// Rates and times below are powers of two apart, so the expected token counts are exact.
TEST_CASE("rate limiter: burst, then refill at the configured rate", "[dht][rate_limiter]") {
    rate_limiter limiter(4.0, 3.0);
    const peer_id p = peer(1);
    CHECK(limiter.available(p, start) == 3.0);
    CHECK(limiter.tracked_peers() == 0);
    CHECK(limiter.allow(p, start));
    CHECK(limiter.allow(p, start));
    CHECK(limiter.allow(p, start));
    CHECK_FALSE(limiter.allow(p, start));
    CHECK(limiter.available(p, start) == 0.0);
    CHECK(limiter.tracked_peers() == 1);

    // 4 tokens per second: 125 ms gives half a token, not enough.
    CHECK(limiter.available(p, start + milliseconds(125)) == 0.5);
    CHECK_FALSE(limiter.allow(p, start + milliseconds(125)));
    // A refused request takes nothing: another 125 ms completes the token.
    CHECK(limiter.allow(p, start + milliseconds(250)));
    CHECK_FALSE(limiter.allow(p, start + milliseconds(250)));
    CHECK(limiter.available(p, start + milliseconds(250)) == 0.0);

    // Refill stops at the burst size.
    CHECK(limiter.available(p, start + milliseconds(750)) == 2.0);
    CHECK(limiter.available(p, start + seconds(100)) == 3.0);
    for (int i = 0; i < 3; ++i)
        CHECK(limiter.allow(p, start + seconds(100)));
    CHECK_FALSE(limiter.allow(p, start + seconds(100)));
}

TEST_CASE("rate limiter: costs", "[dht][rate_limiter]") {
    rate_limiter limiter(1.0, 3.0);
    const peer_id p = peer(1);
    CHECK(limiter.allow(p, start, 2.5));
    CHECK_FALSE(limiter.allow(p, start, 0.75));
    CHECK(limiter.allow(p, start, 0.5));
    CHECK(limiter.available(p, start) == 0.0);
    // A zero cost always passes; a cost over the burst never does.
    CHECK(limiter.allow(p, start, 0.0));
    CHECK_FALSE(limiter.allow(peer(2), start, 3.5));
    CHECK(limiter.allow(peer(2), start, 3.0));
    // Negative and non-finite costs are refused and take nothing.
    CHECK_FALSE(limiter.allow(peer(3), start, -1.0));
    CHECK_FALSE(limiter.allow(peer(3), start, std::numeric_limits<double>::quiet_NaN()));
    CHECK_FALSE(limiter.allow(peer(3), start, std::numeric_limits<double>::infinity()));
    CHECK(limiter.available(peer(3), start) == 3.0);
}

TEST_CASE("rate limiter: peers are independent", "[dht][rate_limiter]") {
    rate_limiter limiter(2.0, 2.0);
    const peer_id a = peer(1), b = peer(2);
    CHECK(limiter.allow(a, start));
    CHECK(limiter.allow(a, start));
    CHECK_FALSE(limiter.allow(a, start));
    CHECK(limiter.allow(b, start));
    CHECK(limiter.available(b, start) == 1.0);
    CHECK(limiter.available(a, start) == 0.0);
    CHECK(limiter.allow(b, start));
    CHECK_FALSE(limiter.allow(b, start));
    CHECK(limiter.allow(a, start + milliseconds(500)));
    CHECK(limiter.available(b, start + milliseconds(500)) == 1.0);
}

TEST_CASE("rate limiter: time running back grants nothing", "[dht][rate_limiter]") {
    rate_limiter limiter(4.0, 1.0);
    const peer_id p = peer(1);
    const time_point later = start + seconds(10);
    CHECK(limiter.allow(p, later));
    CHECK_FALSE(limiter.allow(p, start));
    CHECK(limiter.available(p, start) == 0.0);
    // The clock going back did not move the peer's last activity back either.
    CHECK(limiter.available(p, later + milliseconds(125)) == 0.5);
    CHECK(limiter.allow(p, later + milliseconds(250)));

    // Extreme times: no overflow (UBSan watches), the bucket just fills.
    const peer_id q = peer(2);
    CHECK(limiter.allow(q, time_point::min()));
    CHECK(limiter.available(q, time_point::max()) == 1.0);
    CHECK(limiter.allow(q, time_point::max()));
    CHECK_FALSE(limiter.allow(q, time_point::min()));
}

TEST_CASE("rate limiter: zero rate never refills", "[dht][rate_limiter]") {
    rate_limiter limiter(0.0, 2.0);
    const peer_id p = peer(1);
    CHECK(limiter.allow(p, start));
    CHECK(limiter.allow(p, start));
    CHECK_FALSE(limiter.allow(p, start + seconds(1'000'000)));
    CHECK(limiter.per_second() == 0.0);
    CHECK(limiter.burst() == 2.0);
}

TEST_CASE("rate limiter: tracking is bounded, least recently active forgotten",
          "[dht][rate_limiter]") {
    rate_limiter limiter(1.0, 1.0, 3);
    CHECK(limiter.max_tracked_peers() == 3);
    for (std::uint8_t n = 1; n <= 3; ++n)
        CHECK(limiter.allow(peer(n), start));
    CHECK(limiter.tracked_peers() == 3);
    // Peer 1 becomes the most recently active (a refused request counts as activity).
    CHECK_FALSE(limiter.allow(peer(1), start));

    // A fourth peer pushes out peer 2, the least recently active.
    CHECK(limiter.allow(peer(4), start));
    CHECK(limiter.tracked_peers() == 3);
    CHECK(limiter.available(peer(2), start) == 1.0); // forgotten: starts full again
    CHECK(limiter.available(peer(1), start) == 0.0);
    CHECK(limiter.available(peer(3), start) == 0.0);
    CHECK(limiter.available(peer(4), start) == 0.0);

    // available() is not activity: peer 3 is next out.
    CHECK(limiter.allow(peer(2), start));
    CHECK(limiter.tracked_peers() == 3);
    CHECK(limiter.available(peer(3), start) == 1.0);
    CHECK_FALSE(limiter.allow(peer(1), start));
    CHECK_FALSE(limiter.allow(peer(4), start));
    CHECK_FALSE(limiter.allow(peer(2), start));

    // Many peers: memory stays bounded.
    for (int n = 10; n < 250; ++n)
        limiter.allow(peer(static_cast<std::uint8_t>(n)), start);
    CHECK(limiter.tracked_peers() == 3);

    rate_limiter single(1.0, 1.0, 1);
    CHECK(single.allow(peer(1), start));
    CHECK(single.allow(peer(2), start));
    CHECK(single.tracked_peers() == 1);
    CHECK_FALSE(single.allow(peer(2), start));
    CHECK(single.available(peer(1), start) == 1.0);
}

TEST_CASE("rate limiter: bad parameters are refused", "[dht][rate_limiter]") {
    const double inf = std::numeric_limits<double>::infinity();
    const double nan = std::numeric_limits<double>::quiet_NaN();
    CHECK_THROWS_AS(rate_limiter(-1.0, 1.0), std::system_error);
    CHECK_THROWS_AS(rate_limiter(1.0, -1.0), std::system_error);
    CHECK_THROWS_AS(rate_limiter(inf, 1.0), std::system_error);
    CHECK_THROWS_AS(rate_limiter(1.0, nan), std::system_error);
    CHECK_THROWS_AS(rate_limiter(1.0, 1.0, 0), std::system_error);
    CHECK_NOTHROW(rate_limiter(0.0, 0.0, 1));
}
