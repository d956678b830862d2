#include "support/identities.hpp"

#include <hivemesh/crypto/datagram.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <vector>

using hivemesh::byte_buffer;
using hivemesh::byte_view;
using hivemesh::errc;
using hivemesh::time_point;
using namespace hivemesh::crypto;
using namespace std::chrono_literals;

namespace {

using hivemesh::test::identity_of;

const time_point start{std::chrono::milliseconds(1'800'000'000'000)};

byte_buffer text(std::size_t n) {
    byte_buffer out(n);
    for (std::size_t i = 0; i < n; ++i)
        out[i] = static_cast<std::byte>(i * 7 + 3);
    return out;
}

byte_buffer sealed(datagram_sealer& from, const public_key& to, byte_view payload,
                   time_point at = start) {
    byte_buffer out;
    REQUIRE_FALSE(from.seal(to, payload, at, out));
    return out;
}

/// Opens a copy of `datagram` at `at`: the error, and the payload when it opened.
std::error_code open_copy(datagram_sealer& at_receiver, byte_view datagram, time_point at,
                          byte_buffer* payload = nullptr, public_key* sender = nullptr) {
    byte_buffer copy(datagram.begin(), datagram.end());
    datagram_sealer::opened opened;
    const auto ec = at_receiver.open(copy, at, opened);
    if (!ec && payload) payload->assign(opened.payload.begin(), opened.payload.end());
    if (!ec && sender) *sender = opened.sender;
    return ec;
}

datagram_options with_swarm_key(std::uint8_t fill) {
    datagram_options options;
    options.swarm_key.emplace();
    options.swarm_key->fill(std::byte{fill});
    return options;
}

} // namespace

TEST_CASE("a sealed datagram opens at its receiver, either way, with the sender named",
          "[crypto][datagram]") {
    const auto a_id = identity_of(1), b_id = identity_of(2);
    datagram_sealer a(a_id, {}), b(b_id, {});
    for (std::size_t n : {0, 1, 100, 1200}) {
        const byte_buffer payload = text(n);
        const byte_buffer to_b = sealed(a, b_id.public_key(), payload);
        CHECK(to_b.size() == n + datagram_overhead);
        byte_buffer got;
        public_key sender;
        REQUIRE_FALSE(open_copy(b, to_b, start, &got, &sender));
        CHECK(got == payload);
        CHECK(sender == a_id.public_key());

        const byte_buffer to_a = sealed(b, a_id.public_key(), payload);
        REQUIRE_FALSE(open_copy(a, to_a, start, &got, &sender));
        CHECK(got == payload);
        CHECK(sender == b_id.public_key());
    }
    // Encrypted, and a fresh nonce each time: the same payload seals differently.
    const byte_buffer payload = text(64);
    const byte_buffer once = sealed(a, b_id.public_key(), payload);
    const byte_buffer twice = sealed(a, b_id.public_key(), payload);
    CHECK(once != twice);
    CHECK(std::search(once.begin(), once.end(), payload.begin(), payload.end()) == once.end());
    CHECK(a.cached_keys() == 1);
    CHECK(b.cached_keys() == 1);
}

TEST_CASE("a datagram changed anywhere, cut short or for someone else does not open",
          "[crypto][datagram]") {
    const auto a_id = identity_of(1), b_id = identity_of(2), c_id = identity_of(3);
    datagram_sealer a(a_id, {}), b(b_id, {}), c(c_id, {});
    const byte_buffer datagram = sealed(a, b_id.public_key(), text(40));

    for (std::size_t i = 0; i < datagram.size(); ++i) {
        for (std::uint8_t bit : {0x01, 0x80}) {
            byte_buffer changed = datagram;
            changed[i] ^= std::byte{bit};
            const auto ec = open_copy(b, changed, start);
            INFO("byte " << i << " bit " << int(bit));
            if (i == 0)
                CHECK(ec == errc::unsupported_version);
            else
                CHECK((ec == errc::authentication_failed || ec == errc::invalid_argument));
        }
    }
    for (std::size_t n = 0; n < datagram_overhead; ++n)
        CHECK(open_copy(b, byte_view(datagram).first(n), start) == errc::truncated_input);
    CHECK(open_copy(b, byte_view(datagram).first(datagram.size() - 1), start) ==
          errc::authentication_failed);
    CHECK(open_copy(c, datagram, start) == errc::authentication_failed);
    // Sent back to its sender, it names the sender itself: refused before any key is made.
    CHECK(open_copy(a, datagram, start) == errc::invalid_argument);
    CHECK(open_copy(b, datagram, start) == std::error_code{});
}

TEST_CASE("a datagram opens within the clock window only", "[crypto][datagram]") {
    const auto a_id = identity_of(1), b_id = identity_of(2);
    datagram_options options;
    options.max_clock_skew = 30s;
    datagram_sealer a(a_id, {}), b(b_id, options);
    const byte_buffer datagram = sealed(a, b_id.public_key(), text(10));
    CHECK(open_copy(b, datagram, start + 30s) == std::error_code{});
    CHECK(open_copy(b, datagram, start - 30s) == std::error_code{});
    CHECK(open_copy(b, datagram, start + 30s + 1ms) == errc::authentication_failed);
    CHECK(open_copy(b, datagram, start - 30s - 1ms) == errc::authentication_failed);
    // Sub-millisecond parts of the sending time do not count.
    const byte_buffer late = sealed(a, b_id.public_key(), text(10), start + 999us);
    CHECK(open_copy(b, late, start + 30s) == std::error_code{});

    datagram_options no_skew, no_cache;
    no_skew.max_clock_skew = 0s;
    no_cache.max_cached_keys = 0;
    CHECK_THROWS_AS(datagram_sealer(a_id, no_skew), std::invalid_argument);
    CHECK_THROWS_AS(datagram_sealer(a_id, no_cache), std::invalid_argument);
}

TEST_CASE("with a swarm key only members' datagrams open", "[crypto][datagram]") {
    const auto a_id = identity_of(1), b_id = identity_of(2);
    datagram_sealer member_a(a_id, with_swarm_key(7)), member_b(b_id, with_swarm_key(7));
    datagram_sealer outsider_a(a_id, {}), other_swarm_a(a_id, with_swarm_key(8));
    const byte_buffer payload = text(20);
    byte_buffer got;
    CHECK(open_copy(member_b, sealed(member_a, b_id.public_key(), payload), start, &got) ==
          std::error_code{});
    CHECK(got == payload);
    CHECK(open_copy(member_b, sealed(outsider_a, b_id.public_key(), payload), start) ==
          errc::authentication_failed);
    CHECK(open_copy(member_b, sealed(other_swarm_a, b_id.public_key(), payload), start) ==
          errc::authentication_failed);
}

TEST_CASE("a datagram is not sealed for our own key or an invalid one", "[crypto][datagram]") {
    const auto a_id = identity_of(1);
    datagram_sealer a(a_id, {});
    byte_buffer out{std::byte{9}};
    CHECK(a.seal(a_id.public_key(), text(5), start, out) == errc::invalid_argument);
    // All zeros is a point of small order: no key agreement with it.
    CHECK(a.seal(public_key{}, text(5), start, out) == errc::invalid_argument);
    CHECK(out == byte_buffer{std::byte{9}});
    CHECK(a.cached_keys() == 0);

    std::array<unsigned char, 32> shared;
    shared.fill(1);
    CHECK_FALSE(a_id.key_agreement(public_key{}, shared));
    CHECK(std::all_of(shared.begin(), shared.end(), [](unsigned char x) { return x == 0; }));
}

TEST_CASE("the key cache keeps the most recently used peers", "[crypto][datagram]") {
    const auto a_id = identity_of(1);
    datagram_options options;
    options.max_cached_keys = 2;
    datagram_sealer a(a_id, options);
    std::vector<hivemesh::crypto::identity> peers;
    for (std::uint8_t i = 2; i < 6; ++i)
        peers.push_back(identity_of(i));
    for (const auto& peer : peers) {
        datagram_sealer receiver(peer, {});
        CHECK(open_copy(receiver, sealed(a, peer.public_key(), text(3)), start) ==
              std::error_code{});
        CHECK(a.cached_keys() <= 2);
    }
    CHECK(a.cached_keys() == 2);
    // An evicted peer's key is made again, and the same.
    datagram_sealer first(peers[0], {});
    CHECK(open_copy(first, sealed(a, peers[0].public_key(), text(3)), start) == std::error_code{});
    CHECK(a.cached_keys() == 2);

    // Both ends derive the same key from their own secret and the other's public key.
    std::array<unsigned char, 32> ab, ba;
    REQUIRE(a_id.key_agreement(peers[1].public_key(), ab));
    REQUIRE(peers[1].key_agreement(a_id.public_key(), ba));
    CHECK(ab == ba);
}

TEST_CASE("keys for unknown senders are made at most max_new_keys_per_second",
          "[crypto][datagram]") {
    const auto b_id = identity_of(1);
    datagram_options options;
    options.max_new_keys_per_second = 3;
    datagram_sealer b(b_id, options);
    std::vector<hivemesh::crypto::identity> senders;
    std::vector<byte_buffer> datagrams;
    for (std::uint8_t i = 2; i < 8; ++i) {
        senders.push_back(identity_of(i));
        datagram_sealer from(senders.back(), {});
        datagrams.push_back(sealed(from, b_id.public_key(), text(8)));
    }
    // The burst: 3 senders at once, then none until the next token (1/3 s later).
    for (std::size_t i = 0; i < 3; ++i)
        CHECK(open_copy(b, datagrams[i], start) == std::error_code{});
    CHECK(open_copy(b, datagrams[3], start) == errc::rate_limited);
    CHECK(open_copy(b, datagrams[3], start + 333ms) == errc::rate_limited);
    CHECK(open_copy(b, datagrams[3], start + 334ms) == std::error_code{});
    // Known senders need no token.
    for (std::size_t i = 0; i < 4; ++i)
        CHECK(open_copy(b, datagrams[i], start + 334ms) == std::error_code{});
    CHECK(open_copy(b, datagrams[4], start + 334ms) == errc::rate_limited);
    // A clock that steps back adds nothing; a second later the bucket is full, not fuller.
    CHECK(open_copy(b, datagrams[4], start) == errc::rate_limited);
    CHECK(open_copy(b, datagrams[4], start + 10s) == std::error_code{});
    CHECK(open_copy(b, datagrams[5], start + 10s) == std::error_code{});
    CHECK(b.cached_keys() == 6);
    // Sealing is this side's choice of peer, and is not capped.
    datagram_sealer c(identity_of(9), options);
    for (const auto& sender : senders)
        sealed(c, sender.public_key(), text(3));
    CHECK(c.cached_keys() == senders.size());

    datagram_options unlimited, negative, infinite;
    unlimited.max_new_keys_per_second = 0;
    negative.max_new_keys_per_second = -1;
    infinite.max_new_keys_per_second = std::numeric_limits<double>::infinity();
    datagram_sealer d(b_id, unlimited);
    for (const auto& datagram : datagrams)
        CHECK(open_copy(d, datagram, start) == std::error_code{});
    CHECK_THROWS_AS(datagram_sealer(b_id, negative), std::invalid_argument);
    CHECK_THROWS_AS(datagram_sealer(b_id, infinite), std::invalid_argument);
}

TEST_CASE("forged datagrams evict no cached key", "[crypto][datagram]") {
    const auto a_id = identity_of(1), b_id = identity_of(2);
    datagram_options options;
    options.max_cached_keys = 2;
    options.max_new_keys_per_second = 0;
    datagram_sealer b(b_id, options);
    datagram_sealer a(a_id, {});
    CHECK(open_copy(b, sealed(a, b_id.public_key(), text(4)), start) == std::error_code{});
    CHECK(b.cached_keys() == 1);
    for (std::uint8_t i = 3; i < 9; ++i) { // under other swarm keys: well formed, not for b
        datagram_sealer forger(identity_of(i), with_swarm_key(i));
        CHECK(open_copy(b, sealed(forger, b_id.public_key(), text(4)), start) ==
              errc::authentication_failed);
    }
    byte_buffer altered = sealed(a, b_id.public_key(), text(4));
    altered.back() ^= std::byte{1};
    CHECK(open_copy(b, altered, start) == errc::authentication_failed);
    CHECK(b.cached_keys() == 1);

    // With a cap, a forged datagram still takes a token, but a cached sender needs none.
    options.max_new_keys_per_second = 1;
    datagram_sealer capped(b_id, options);
    CHECK(open_copy(capped, sealed(a, b_id.public_key(), text(4)), start) == std::error_code{});
    datagram_sealer forger(identity_of(3), with_swarm_key(3));
    CHECK(open_copy(capped, sealed(forger, b_id.public_key(), text(4)), start + 1s) ==
          errc::authentication_failed);
    CHECK(open_copy(capped, sealed(forger, b_id.public_key(), text(4)), start + 1s) ==
          errc::rate_limited);
    CHECK(open_copy(capped, sealed(a, b_id.public_key(), text(4)), start + 1s) ==
          std::error_code{});
}
