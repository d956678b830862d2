// PeerId: who a peer is, as proven by its Ed25519 key.
//
// A PeerId is the 32-byte BLAKE2b-256 hash of the peer's Ed25519 public key. Its printable
// form is base58 (Bitcoin alphabet) of those 32 bytes, 43 or 44 characters, so addresses
// look like `/ip4/127.0.0.1/tcp/4242/p2p/<PeerId>` as hivemind users know them.
#pragma once

#include "hivemesh/core/bytes.hpp"
#include "hivemesh/core/config.hpp"
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
HIVEMESH_DECL std::string base58_encode(byte_view bytes);

/// Decodes base58 into exactly `out.size()` bytes; false for bad characters or a value
/// that does not fit that size exactly (wrong length, extra leading '1's).
HIVEMESH_DECL bool base58_decode(std::string_view text, std::span<std::byte> out);

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
    HIVEMESH_DECL static peer_id from_public_key(byte_view public_key);

    /// Parses the printable form; nullopt if `text` is not a canonical PeerId.
    HIVEMESH_DECL static std::optional<peer_id> parse(std::string_view text) noexcept;

    /// Parses the printable form; throws std::system_error(invalid_argument) otherwise.
    HIVEMESH_DECL static peer_id from_string(std::string_view text);

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

#if !defined(HIVEMESH_SEPARATE_COMPILATION)
#include "hivemesh/crypto/impl/peer_id.ipp"
#endif
