// DHT identifiers: 160-bit ids compared by XOR distance (Kademlia).
//
// A key's id is BLAKE2b-160 of the key's bytes; a node's id is BLAKE2b-160 of its PeerId's
// 32 bytes, so it follows from the node's public key and cannot be chosen freely.
#pragma once

#include "hivemesh/core/bytes.hpp"
#include "hivemesh/core/error.hpp"
#include "hivemesh/core/random.hpp"
#include "hivemesh/crypto/peer_id.hpp"

#include <sodium.h>

#include <algorithm>
#include <array>
#include <bit>
#include <compare>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>

namespace hivemesh::dht {

/// A 160-bit identifier; bit 0 is the most significant bit of byte 0.
class id {
public:
    static constexpr std::size_t size = 20;
    static constexpr std::size_t bits = size * 8;
    using bytes_type = std::array<std::uint8_t, size>;

    constexpr id() noexcept = default;
    constexpr explicit id(const bytes_type& bytes) noexcept
        : bytes_(bytes) {}

    /// The id under which `key` is stored: BLAKE2b-160 of its bytes (any key, even empty).
    static id of_key(byte_view key) {
        crypto::ensure_sodium_initialized();
        bytes_type hash{};
        crypto_generichash(hash.data(), hash.size(),
                           reinterpret_cast<const unsigned char*>(key.data()), key.size(), nullptr,
                           0);
        return id(hash);
    }
    static id of_key(std::string_view key) {
        return of_key(byte_view(reinterpret_cast<const std::byte*>(key.data()), key.size()));
    }

    /// The id of the node whose PeerId is `peer`.
    static id of_peer(const crypto::peer_id& peer) { return of_key(peer.view()); }

    /// An id from exactly 20 bytes; nullopt for any other length.
    static std::optional<id> from_bytes(byte_view bytes) noexcept {
        if (bytes.size() != size) return std::nullopt;
        bytes_type b{};
        std::memcpy(b.data(), bytes.data(), size);
        return id(b);
    }

    /// A uniformly random id.
    static id random(random_generator& rng) noexcept {
        bytes_type b{};
        // Byte by byte from each word, so the same seed gives the same id on any platform.
        for (std::size_t i = 0; i < size; i += 8) {
            const std::uint64_t word = rng();
            for (std::size_t j = 0; j < 8 && i + j < size; ++j)
                b[i + j] = static_cast<std::uint8_t>(word >> (8 * j));
        }
        return id(b);
    }

    /// A uniformly random id that shares the first `prefix_bits` bits with `prefix`.
    static id random_with_prefix(const id& prefix, std::size_t prefix_bits,
                                 random_generator& rng) noexcept {
        id out = random(rng);
        for (std::size_t i = 0; i < std::min(prefix_bits, bits); ++i)
            out.set_bit(i, prefix.bit(i));
        return out;
    }

    constexpr bool bit(std::size_t i) const noexcept { return (bytes_[i / 8] >> (7 - i % 8)) & 1u; }
    constexpr void set_bit(std::size_t i, bool value) noexcept {
        const auto mask = static_cast<std::uint8_t>(1u << (7 - i % 8));
        bytes_[i / 8] =
            static_cast<std::uint8_t>(value ? bytes_[i / 8] | mask : bytes_[i / 8] & ~mask);
    }

    /// Number of leading bits `a` and `b` share (160 when equal).
    friend constexpr std::size_t common_prefix_length(const id& a, const id& b) noexcept {
        for (std::size_t i = 0; i < size; ++i) {
            const auto x = static_cast<std::uint8_t>(a.bytes_[i] ^ b.bytes_[i]);
            if (x != 0) return i * 8 + static_cast<std::size_t>(std::countl_zero(x));
        }
        return bits;
    }

    /// XOR distance, itself an id (ordered as a big-endian number).
    friend constexpr id operator^(const id& a, const id& b) noexcept {
        id out;
        for (std::size_t i = 0; i < size; ++i)
            out.bytes_[i] = static_cast<std::uint8_t>(a.bytes_[i] ^ b.bytes_[i]);
        return out;
    }

    const bytes_type& bytes() const noexcept { return bytes_; }
    byte_view view() const noexcept {
        return byte_view(reinterpret_cast<const std::byte*>(bytes_.data()), size);
    }

    /// Lowercase hex, 40 characters.
    std::string to_hex() const {
        static constexpr char digits[] = "0123456789abcdef";
        std::string out(2 * size, '0');
        for (std::size_t i = 0; i < size; ++i) {
            out[2 * i] = digits[bytes_[i] >> 4];
            out[2 * i + 1] = digits[bytes_[i] & 0xF];
        }
        return out;
    }
    /// The first characters of to_hex(), for logs.
    std::string short_string() const { return to_hex().substr(0, 8); }

    friend constexpr auto operator<=>(const id&, const id&) = default;
    friend constexpr bool operator==(const id&, const id&) = default;
    friend std::ostream& operator<<(std::ostream& os, const id& value) {
        return os << value.to_hex();
    }

private:
    bytes_type bytes_{};
};

/// True if `a` is strictly closer to `target` than `b` by XOR distance.
inline bool closer(const id& target, const id& a, const id& b) noexcept {
    // The first bit where `a` and `b` differ decides: the one that agrees with `target`
    // there is closer. Random ids almost always differ in their first byte, so this reads a
    // byte or two where comparing the two distances would build and compare 40 bytes.
    const auto& x = a.bytes();
    const auto& y = b.bytes();
    for (std::size_t i = 0; i < id::size; ++i) {
        const unsigned differ = static_cast<unsigned>(x[i] ^ y[i]);
        if (differ == 0) continue;
        const unsigned top = 1u << (std::bit_width(differ) - 1);
        return ((x[i] ^ target.bytes()[i]) & top) == 0;
    }
    return false; // a == b
}

} // namespace hivemesh::dht

template <>
struct std::hash<hivemesh::dht::id> {
    std::size_t operator()(const hivemesh::dht::id& value) const noexcept {
        // Ids are hashes already: any 8 bytes are uniformly distributed.
        std::size_t h;
        std::memcpy(&h, value.bytes().data(), sizeof h);
        return h;
    }
};
