#include <hivemesh/crypto/peer_id.hpp>

#include <catch2/catch.hpp>

#include <array>
#include <set>
#include <sstream>
#include <string>
#include <unordered_set>

using hivemesh::crypto::peer_id;

namespace {

peer_id id_of(std::uint8_t fill) {
    std::array<std::byte, 32> key{};
    key.fill(std::byte{fill});
    return peer_id::from_public_key(key);
}

} // namespace

TEST_CASE("a PeerId is the BLAKE2b-256 hash of the public key", "[crypto][peer_id]") {
    std::array<std::byte, 32> key{};
    for (std::size_t i = 0; i < key.size(); ++i)
        key[i] = static_cast<std::byte>(i);
    std::array<unsigned char, 32> expected{};
    crypto_generichash(expected.data(), expected.size(),
                       reinterpret_cast<const unsigned char*>(key.data()), key.size(), nullptr, 0);
    const peer_id id = peer_id::from_public_key(key);
    CHECK(std::memcmp(id.bytes().data(), expected.data(), 32) == 0);
    CHECK(id == peer_id::from_public_key(key));
    CHECK(id != id_of(1));
    CHECK_FALSE(id.is_zero());
    CHECK(peer_id{}.is_zero());
}

TEST_CASE("base58 printing matches known values", "[crypto][peer_id]") {
    // All zero bytes print as one '1' per byte.
    CHECK(peer_id{}.to_string() == std::string(32, '1'));
    // 0x00..00 01: thirty-one '1's then '2'.
    peer_id::bytes_type one{};
    one[31] = std::byte{1};
    CHECK(peer_id(one).to_string() == std::string(31, '1') + "2");
    // 58 = "21" in base 58.
    peer_id::bytes_type fifty_eight{};
    fifty_eight[31] = std::byte{58};
    CHECK(peer_id(fifty_eight).to_string() == std::string(31, '1') + "21");
    // All 0xFF: 2^256 - 1 in base 58 (computed independently).
    peer_id::bytes_type all_ones{};
    all_ones.fill(std::byte{0xFF});
    CHECK(peer_id(all_ones).to_string() == "JEKNVnkbo3jma5nREBBJCDoXFVeKkD56V3xKrvRmWxFG");
}

TEST_CASE("PeerIds round-trip through their printable form", "[crypto][peer_id]") {
    for (int fill = 0; fill < 256; fill += 5) {
        const peer_id id = id_of(static_cast<std::uint8_t>(fill));
        const std::string text = id.to_string();
        CHECK(text.size() >= 43);
        CHECK(text.size() <= 44);
        const auto parsed = peer_id::parse(text);
        REQUIRE(parsed);
        CHECK(*parsed == id);
        CHECK(peer_id::from_string(text) == id);
        CHECK(id.short_string() == text.substr(0, 10));
        std::ostringstream os;
        os << id;
        CHECK(os.str() == text);
    }
}

TEST_CASE("malformed PeerIds are refused", "[crypto][peer_id]") {
    const std::string good = id_of(7).to_string();
    const std::string bad[] = {
        "",
        "0",                                   // '0' is not in the alphabet
        good.substr(0, 20),                    // too short: not 32 bytes
        "1" + good,                            // an extra leading zero byte
        good + "1",                            // too long
        std::string(64, 'z'),                  // overflows 32 bytes
        std::string(200, '2'),                 // far too long
        good.substr(0, good.size() - 1) + "O", // 'O' is not in the alphabet
        good.substr(0, good.size() - 1) + "l", // nor is 'l'
        good + std::string(1, '\0'),
        " " + good,
    };
    for (const auto& text : bad) {
        INFO("input: " << text);
        CHECK_FALSE(peer_id::parse(text));
        CHECK_THROWS_AS(peer_id::from_string(text), std::system_error);
    }
}

TEST_CASE("PeerIds order, compare and hash consistently", "[crypto][peer_id]") {
    std::set<peer_id> ordered;
    std::unordered_set<peer_id> hashed;
    for (int fill = 0; fill < 100; ++fill) {
        ordered.insert(id_of(static_cast<std::uint8_t>(fill)));
        hashed.insert(id_of(static_cast<std::uint8_t>(fill)));
    }
    CHECK(ordered.size() == 100);
    CHECK(hashed.size() == 100);
    // Ordering is lexicographic over the bytes.
    const peer_id a = id_of(1), b = id_of(2);
    CHECK((a < b) == (std::memcmp(a.bytes().data(), b.bytes().data(), 32) < 0));
}
