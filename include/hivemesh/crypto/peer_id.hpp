// PeerId: who a peer is, as proven by its Ed25519 key.
//
// A PeerId is the 32-byte BLAKE2b-256 hash of the peer's Ed25519 public key. Its printable
// form is base58 (Bitcoin alphabet) of those 32 bytes, 43 or 44 characters, so addresses
// look like `/ip4/127.0.0.1/tcp/4242/p2p/<PeerId>` as hivemind users know them.
#pragma once

#include "hivemesh/core/bytes.hpp"
#include "hivemesh/core/error.hpp"

#include <sodium.h>

#include <algorithm>
#include <array>
#include <compare>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <ostream>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>

namespace hivemesh::crypto {

/// Initialises libsodium once per process; throws std::runtime_error if it cannot.
inline void ensure_sodium_initialized() {
    static const bool ok = sodium_init() >= 0;
    if (!ok) throw std::runtime_error("hivemesh: libsodium failed to initialise");
}

namespace detail {

inline constexpr std::string_view base58_alphabet =
    "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz";

} // namespace detail

/// Base58 of a big-endian number, one '1' per leading zero byte.
inline std::string base58_encode(byte_view bytes) {
    std::size_t zeros = 0;
    while (zeros < bytes.size() && bytes[zeros] == std::byte{0})
        ++zeros;
    // log(256)/log(58) < 1.37: enough digits for any value.
    std::string digits((bytes.size() - zeros) * 137 / 100 + 1, '\0');
    std::size_t length = 0;
    for (std::size_t i = zeros; i < bytes.size(); ++i) {
        auto carry = static_cast<unsigned>(bytes[i]);
        std::size_t j = 0;
        for (; j < length || carry != 0; ++j) {
            carry += 256u * static_cast<unsigned char>(digits[j]);
            digits[j] = static_cast<char>(carry % 58);
            carry /= 58;
        }
        length = j;
    }
    std::string out(zeros, '1');
    for (std::size_t i = length; i-- > 0;)
        out.push_back(detail::base58_alphabet[static_cast<unsigned char>(digits[i])]);
    return out;
}

/// Decodes base58 into exactly `out.size()` bytes; false for bad characters or a value
/// that does not fit that size exactly (wrong length, extra leading '1's).
inline bool base58_decode(std::string_view text, std::span<std::byte> out) {
    std::fill(out.begin(), out.end(), std::byte{0});
    if (text.empty() || text.size() > out.size() * 2) return false;
    for (char c : text) {
        const auto digit = detail::base58_alphabet.find(c);
        if (digit == std::string_view::npos) return false;
        auto carry = static_cast<unsigned>(digit);
        for (std::size_t i = out.size(); i-- > 0;) {
            carry += 58u * static_cast<unsigned>(out[i]);
            out[i] = static_cast<std::byte>(carry & 0xFF);
            carry >>= 8;
        }
        if (carry != 0) return false; // overflow: more than out.size() bytes
    }
    // Canonical form only: re-encoding must give the same text.
    return base58_encode(out) == text;
}

/// The identity of a peer: BLAKE2b-256 of its Ed25519 public key.
class peer_id {
public:
    static constexpr std::size_t size = 32;
    using bytes_type = std::array<std::byte, size>;

    /// The all-zero id; never the hash of a real key in practice.
    constexpr peer_id() noexcept = default;
    constexpr explicit peer_id(const bytes_type& bytes) noexcept
        : bytes_(bytes) {}

    /// The PeerId of an Ed25519 public key (32 bytes).
    static peer_id from_public_key(byte_view public_key) {
        ensure_sodium_initialized();
        bytes_type hash{};
        crypto_generichash(reinterpret_cast<unsigned char*>(hash.data()), hash.size(),
                           reinterpret_cast<const unsigned char*>(public_key.data()),
                           public_key.size(), nullptr, 0);
        return peer_id(hash);
    }

    /// Parses the printable form; nullopt if `text` is not a canonical PeerId.
    static std::optional<peer_id> parse(std::string_view text) noexcept {
        bytes_type bytes{};
        try {
            if (!base58_decode(text, bytes)) return std::nullopt;
        } catch (const std::bad_alloc&) {
            return std::nullopt;
        }
        return peer_id(bytes);
    }

    /// Parses the printable form; throws std::system_error(invalid_argument) otherwise.
    static peer_id from_string(std::string_view text) {
        auto id = parse(text);
        if (!id)
            throw std::system_error(errc::invalid_argument,
                                    "hivemesh: not a PeerId: " + std::string(text));
        return *id;
    }

    std::string to_string() const { return base58_encode(bytes_); }
    /// The first characters of to_string(), for logs.
    std::string short_string() const { return to_string().substr(0, 10); }

    const bytes_type& bytes() const noexcept { return bytes_; }
    byte_view view() const noexcept { return bytes_; }
    bool is_zero() const noexcept {
        return std::all_of(bytes_.begin(), bytes_.end(),
                           [](std::byte b) { return b == std::byte{0}; });
    }

    friend auto operator<=>(const peer_id&, const peer_id&) = default;
    friend bool operator==(const peer_id&, const peer_id&) = default;
    friend std::ostream& operator<<(std::ostream& os, const peer_id& id) {
        return os << id.to_string();
    }

private:
    bytes_type bytes_{};
};

} // namespace hivemesh::crypto

template <>
struct std::hash<hivemesh::crypto::peer_id> {
    std::size_t operator()(const hivemesh::crypto::peer_id& id) const noexcept {
        // The id is already a cryptographic hash: any 8 bytes are uniformly distributed.
        std::size_t h;
        std::memcpy(&h, id.bytes().data(), sizeof h);
        return h;
    }
};
