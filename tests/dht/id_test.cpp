#include "hivemesh/dht/id.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

using hivemesh::byte_view;
using hivemesh::random_generator;
using hivemesh::dht::id;

namespace {

id id_from_hex(const std::string& hex) {
    REQUIRE(hex.size() == 2 * id::size);
    id::bytes_type bytes{};
    for (std::size_t i = 0; i < id::size; ++i)
        bytes[i] = static_cast<std::uint8_t>(std::stoul(hex.substr(2 * i, 2), nullptr, 16));
    return id(bytes);
}

id sodium_blake2b_160(byte_view data) {
    id::bytes_type out{};
    REQUIRE(sodium_init() >= 0);
    REQUIRE(crypto_generichash(out.data(), 20, reinterpret_cast<const unsigned char*>(data.data()),
                               data.size(), nullptr, 0) == 0);
    return id(out);
}

// Big-endian comparison written out byte by byte: the oracle for operator<=>.
bool less_big_endian(const id& a, const id& b) {
    for (std::size_t i = 0; i < id::size; ++i)
        if (a.bytes()[i] != b.bytes()[i]) return a.bytes()[i] < b.bytes()[i];
    return false;
}

std::size_t leading_zero_bits(const id& value) {
    for (std::size_t i = 0; i < id::bits; ++i)
        if (value.bit(i)) return i;
    return id::bits;
}

hivemesh::crypto::peer_id random_peer(random_generator& rng) {
    hivemesh::crypto::peer_id::bytes_type bytes{};
    for (auto& b : bytes)
        b = static_cast<std::byte>(rng.uniform(256));
    return hivemesh::crypto::peer_id(bytes);
}

} // namespace

TEST_CASE("of_key is BLAKE2b-160 of the key bytes", "[dht]") {
    // Known answers computed independently (Python hashlib.blake2b, digest_size=20).
    CHECK(id::of_key(std::string_view("")).to_hex() == "3345524abf6bbe1809449224b5972c41790b6cf2");
    CHECK(id::of_key(std::string_view("abc")).to_hex() ==
          "384264f676f39536840523f284921cdc68b6846b");
    CHECK(id::of_key(std::string_view("hivemesh")) ==
          id_from_hex("6e9b6af765c77f1268777b3d51c621aa869bf4c9"));

    // And against libsodium's crypto_generichash with outlen 20, for many lengths.
    random_generator rng(7);
    for (std::size_t length = 0; length < 300; length += 7) {
        std::vector<std::byte> key(length);
        for (auto& b : key)
            b = static_cast<std::byte>(rng.uniform(256));
        INFO("length " << length);
        CHECK(id::of_key(byte_view(key)) == sodium_blake2b_160(key));
    }
    // The string_view overload hashes the same bytes.
    CHECK(id::of_key(std::string_view("abc")) == id::of_key(hivemesh::as_bytes("abc")));
}

TEST_CASE("of_peer hashes the PeerId's 32 bytes", "[dht]") {
    hivemesh::crypto::peer_id::bytes_type bytes{};
    for (std::size_t i = 0; i < bytes.size(); ++i)
        bytes[i] = static_cast<std::byte>(i);
    const hivemesh::crypto::peer_id peer(bytes);
    CHECK(id::of_peer(peer).to_hex() == "b1b133b99f516e6c82ceda892ef5af50fa4b4e71");
    CHECK(id::of_peer(peer) == sodium_blake2b_160(peer.view()));

    random_generator rng(8);
    const auto other = random_peer(rng);
    CHECK(id::of_peer(other) == id::of_key(other.view()));
    CHECK(id::of_peer(other) != id::of_peer(peer));
}

TEST_CASE("XOR distance is symmetric, zero only to itself, and self-inverse", "[dht]") {
    random_generator rng(1);
    const id zero;
    for (int i = 0; i < 200; ++i) {
        const id a = id::random(rng);
        const id b = id::random(rng);
        CHECK((a ^ b) == (b ^ a));
        CHECK((a ^ a) == zero);
        CHECK((a ^ zero) == a);
        CHECK(((a ^ b) ^ b) == a);
        if (a != b) CHECK((a ^ b) != zero);
        for (std::size_t byte = 0; byte < id::size; ++byte)
            CHECK((a ^ b).bytes()[byte] == (a.bytes()[byte] ^ b.bytes()[byte]));
    }
}

TEST_CASE("bit and set_bit: bit 0 is the most significant bit of byte 0", "[dht]") {
    id value;
    value.set_bit(0, true);
    CHECK(value.bytes()[0] == 0x80);
    CHECK(value.bit(0));
    CHECK_FALSE(value.bit(1));
    value.set_bit(7, true);
    CHECK(value.bytes()[0] == 0x81);
    value.set_bit(8, true);
    CHECK(value.bytes()[1] == 0x80);
    value.set_bit(159, true);
    CHECK(value.bytes()[19] == 0x01);
    CHECK(value.bit(159));
    value.set_bit(0, false);
    CHECK(value.bytes()[0] == 0x01);
    CHECK_FALSE(value.bit(0));
    value.set_bit(7, true); // setting a set bit changes nothing
    CHECK(value.bytes()[0] == 0x01);

    // Every bit round-trips and touches only itself.
    random_generator rng(2);
    const id base = id::random(rng);
    for (std::size_t i = 0; i < id::bits; ++i) {
        id flipped = base;
        flipped.set_bit(i, !base.bit(i));
        CHECK(flipped.bit(i) == !base.bit(i));
        const id diff = flipped ^ base;
        CHECK(diff.bytes()[i / 8] == (1u << (7 - i % 8)));
        CHECK(leading_zero_bits(diff) == i);
    }
}

TEST_CASE("common_prefix_length counts shared leading bits", "[dht]") {
    random_generator rng(3);
    const id a = id::random(rng);
    CHECK(common_prefix_length(a, a) == 160);
    for (std::size_t i = 0; i < id::bits; ++i) {
        id b = a;
        b.set_bit(i, !a.bit(i));
        // Bits after the first difference do not matter.
        for (std::size_t j = i + 1; j < id::bits; j += 3)
            b.set_bit(j, rng.uniform(2) == 1);
        CHECK(common_prefix_length(a, b) == i);
        CHECK(common_prefix_length(b, a) == i);
    }
    for (int n = 0; n < 200; ++n) {
        const id x = id::random(rng);
        const id y = id::random(rng);
        CHECK(common_prefix_length(x, y) == leading_zero_bits(x ^ y));
    }
    id zero, top;
    top.set_bit(0, true);
    CHECK(common_prefix_length(zero, top) == 0);
}

TEST_CASE("random_with_prefix keeps the prefix and randomises the rest", "[dht]") {
    random_generator rng(4);
    const id prefix = id::random(rng);
    for (std::size_t bits : {0u, 1u, 5u, 8u, 13u, 64u, 100u, 159u, 160u}) {
        INFO("prefix bits " << bits);
        bool differs_after_prefix = false;
        for (int n = 0; n < 20; ++n) {
            const id value = id::random_with_prefix(prefix, bits, rng);
            CHECK(common_prefix_length(value, prefix) >= bits);
            if (common_prefix_length(value, prefix) < id::bits) differs_after_prefix = true;
        }
        CHECK(differs_after_prefix == (bits < id::bits));
    }
    // More than 160 prefix bits is the same as 160.
    CHECK(id::random_with_prefix(prefix, 500, rng) == prefix);
    // Seeded: the same generator state gives the same id.
    random_generator r1(99), r2(99);
    CHECK(id::random_with_prefix(prefix, 10, r1) == id::random_with_prefix(prefix, 10, r2));
    CHECK(id::random(r1) == id::random(r2));
}

TEST_CASE("distances order as big-endian numbers", "[dht]") {
    random_generator rng(5);
    std::vector<id> values;
    for (int i = 0; i < 300; ++i)
        values.push_back(id::random(rng));
    // Some values that differ only late, to exercise every byte of the comparison.
    for (std::size_t byte = 0; byte < id::size; ++byte) {
        id v = values[0];
        v.set_bit(byte * 8 + 7, !v.bit(byte * 8 + 7));
        values.push_back(v);
    }
    for (std::size_t i = 0; i + 1 < values.size(); ++i) {
        const id& a = values[i];
        const id& b = values[i + 1];
        CHECK((a < b) == less_big_endian(a, b));
        CHECK((a > b) == less_big_endian(b, a));
    }

    const id target = id::random(rng);
    for (std::size_t i = 0; i + 1 < values.size(); ++i) {
        const id& a = values[i];
        const id& b = values[i + 1];
        CHECK(hivemesh::dht::closer(target, a, b) == less_big_endian(a ^ target, b ^ target));
        CHECK(hivemesh::dht::closer(target, b, a) == less_big_endian(b ^ target, a ^ target));
    }
    CHECK_FALSE(hivemesh::dht::closer(target, target, target));

    // Sorting by distance: the target itself first, then by first differing bit.
    std::vector<id> sorted = values;
    sorted.push_back(target);
    std::sort(sorted.begin(), sorted.end(),
              [&](const id& a, const id& b) { return hivemesh::dht::closer(target, a, b); });
    CHECK(sorted.front() == target);
    for (std::size_t i = 0; i + 1 < sorted.size(); ++i)
        CHECK(common_prefix_length(sorted[i], target) >=
              common_prefix_length(sorted[i + 1], target));

    // Hand-made: distance 0x00..01 < 0x00..0100 < 0x80..
    id t, near, mid, far;
    near.set_bit(159, true);
    mid.set_bit(151, true);
    far.set_bit(0, true);
    CHECK(hivemesh::dht::closer(t, near, mid));
    CHECK(hivemesh::dht::closer(t, mid, far));
    CHECK_FALSE(hivemesh::dht::closer(t, far, near));
}

TEST_CASE("from_bytes takes exactly 20 bytes", "[dht]") {
    std::array<std::byte, 21> buffer{};
    for (std::size_t i = 0; i < buffer.size(); ++i)
        buffer[i] = static_cast<std::byte>(i + 1);
    const auto parsed = id::from_bytes(byte_view(buffer.data(), 20));
    REQUIRE(parsed.has_value());
    for (std::size_t i = 0; i < id::size; ++i)
        CHECK(parsed->bytes()[i] == i + 1);
    CHECK(parsed->view().size() == 20);
    CHECK(id::from_bytes(parsed->view()) == parsed);

    CHECK_FALSE(id::from_bytes(byte_view(buffer.data(), 19)).has_value());
    CHECK_FALSE(id::from_bytes(byte_view(buffer.data(), 21)).has_value());
    CHECK_FALSE(id::from_bytes(byte_view()).has_value());
}

TEST_CASE("to_hex is 40 lowercase hex digits", "[dht]") {
    CHECK(id().to_hex() == std::string(40, '0'));
    id::bytes_type bytes{};
    for (std::size_t i = 0; i < bytes.size(); ++i)
        bytes[i] = static_cast<std::uint8_t>(i * 13 + 0xA0);
    const id value(bytes);
    CHECK(value.to_hex() == "a0adbac7d4e1eefb0815222f3c495663707d8a97");
    CHECK(value.short_string() == "a0adbac7");
    std::ostringstream os;
    os << value;
    CHECK(os.str() == value.to_hex());

    random_generator rng(6);
    for (int i = 0; i < 50; ++i) {
        const id v = id::random(rng);
        CHECK(id_from_hex(v.to_hex()) == v);
    }
    CHECK(std::hash<id>{}(value) == std::hash<id>{}(id(bytes)));
}
