// A peer's long-term identity: an Ed25519 key pair, its public key and signatures, and the
// identity file that keeps the key across restarts.
//
// Identity file (69 bytes, mode 0600):
//   u32 magic 0x44494D48 ("HMID" on disk) | u8 version 1 | 32-byte Ed25519 seed |
//   32-byte public key (redundant: it detects a corrupted or foreign seed)
#pragma once

#include "hivemesh/core/binary.hpp"
#include "hivemesh/core/bytes.hpp"
#include "hivemesh/core/config.hpp"
#include "hivemesh/core/error.hpp"
#include "hivemesh/core/file.hpp"
#include "hivemesh/crypto/peer_id.hpp"

#include <sodium.h>

#include <cerrno>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <system_error>

namespace hivemesh::crypto {

namespace detail {

/// A value that is exactly N bytes: a public key, a signature.
template <class Derived, std::size_t N>
class fixed_bytes {
public:
    static constexpr std::size_t size = N;
    using bytes_type = std::array<std::byte, N>;

    constexpr fixed_bytes() noexcept = default;
    constexpr explicit fixed_bytes(const bytes_type& bytes) noexcept
        : bytes_(bytes) {}

    /// The value held in `bytes`; nullopt unless it is exactly N bytes long.
    static std::optional<Derived> from_bytes(byte_view bytes) noexcept {
        if (bytes.size() != N) return std::nullopt;
        bytes_type value;
        std::copy(bytes.begin(), bytes.end(), value.begin());
        return Derived(value);
    }

    constexpr const bytes_type& bytes() const noexcept { return bytes_; }
    constexpr byte_view view() const noexcept { return bytes_; }

    friend constexpr bool operator==(const Derived& a, const Derived& b) noexcept {
        return a.bytes() == b.bytes();
    }

private:
    bytes_type bytes_{};
};

} // namespace detail

/// A 32-byte Ed25519 public key. The default value (all zeros) verifies nothing.
class public_key : public detail::fixed_bytes<public_key, crypto_sign_PUBLICKEYBYTES> {
public:
    using fixed_bytes::fixed_bytes;

    /// The PeerId this key proves (BLAKE2b-256 of the key).
    peer_id id() const { return peer_id::from_public_key(bytes()); }
};

/// A 64-byte Ed25519 signature.
class signature : public detail::fixed_bytes<signature, crypto_sign_BYTES> {
public:
    using fixed_bytes::fixed_bytes;
};

namespace detail {

/// sodium_init without exceptions, for noexcept callers.
inline bool sodium_ready() noexcept {
    static const bool ok = sodium_init() >= 0;
    return ok;
}

inline const unsigned char* uchars(const std::byte* p) noexcept {
    return reinterpret_cast<const unsigned char*>(p);
}
inline unsigned char* uchars(std::byte* p) noexcept {
    return reinterpret_cast<unsigned char*>(p);
}

/// An Ed25519 secret key in libsodium's layout (seed || public key), wiped when destroyed.
struct ed25519_secret_key {
    std::array<unsigned char, crypto_sign_SECRETKEYBYTES> bytes{};

    ed25519_secret_key() = default;
    ed25519_secret_key(const ed25519_secret_key&) = delete;
    ed25519_secret_key& operator=(const ed25519_secret_key&) = delete;
    ~ed25519_secret_key() { sodium_memzero(bytes.data(), bytes.size()); }
};

/// 32 secret bytes on the stack, wiped when they go out of scope.
struct wiped_seed {
    std::array<unsigned char, crypto_sign_SEEDBYTES> bytes{};

    wiped_seed() = default;
    wiped_seed(const wiped_seed&) = delete;
    wiped_seed& operator=(const wiped_seed&) = delete;
    ~wiped_seed() { sodium_memzero(bytes.data(), bytes.size()); }
};

inline constexpr std::uint32_t identity_file_magic = 0x44494D48; // "HMID" little-endian
inline constexpr std::uint8_t identity_file_version = 1;
inline constexpr std::size_t identity_file_size =
    4 + 1 + crypto_sign_SEEDBYTES + crypto_sign_PUBLICKEYBYTES;

} // namespace detail

/// True if `sig` is `key`'s signature of `message`. False for any malformed key or signature.
HIVEMESH_DECL bool verify(const public_key& key, byte_view message, const signature& sig) noexcept;

/// A peer's Ed25519 key pair. Movable; not implicitly copyable, because every copy of a
/// secret key is one more place it can leak from: use clone() when a copy is really meant.
/// The secret key lives on the heap, so moves do not leave stray copies behind, and it is
/// wiped when the identity is destroyed. A moved-from identity can only be destroyed or
/// assigned to; signing with it throws std::logic_error.
class identity {
public:
    static constexpr std::size_t seed_size = crypto_sign_SEEDBYTES;

    /// A fresh random key pair.
    HIVEMESH_DECL static identity generate();

    /// The key pair derived from a 32-byte seed: the same seed always gives the same
    /// identity (tests, simulations). Throws std::system_error(invalid_argument) if the
    /// seed is not 32 bytes.
    HIVEMESH_DECL static identity from_seed(byte_view seed);

    /// Loads the identity stored at `path`, or creates a new one there (mode 0600) if no
    /// file exists. Errors: insecure_permissions (the file is accessible to group or
    /// others), bad_magic, unsupported_version, truncated_input, trailing_data,
    /// corrupt_data (public key does not match the seed), invalid_argument (not a regular
    /// file), and system errors from the file system. Returns nullopt on error.
    HIVEMESH_DECL static std::optional<identity> load_or_create(const std::filesystem::path& path,
                                                                std::error_code& ec);

    /// Throwing form of load_or_create(path, ec): throws std::system_error.
    HIVEMESH_DECL static identity load_or_create(const std::filesystem::path& path);

    identity(identity&&) noexcept = default;
    identity& operator=(identity&&) noexcept = default;
    identity(const identity&) = delete;
    identity& operator=(const identity&) = delete;
    ~identity() = default;

    /// An explicit copy of the key pair.
    HIVEMESH_DECL identity clone() const;

    const crypto::public_key& public_key() const noexcept { return public_key_; }
    /// The PeerId of public_key(), computed once.
    const peer_id& id() const noexcept { return id_; }

    /// Signs `message` (deterministic Ed25519: the same message gives the same signature).
    HIVEMESH_DECL crypto::signature sign(byte_view message) const;

    /// Writes to `out` the X25519 secret this identity shares with `peer`'s key, both
    /// Ed25519 keys converted to their X25519 form: the same on both sides, with no message
    /// exchanged. False, with `out` zeroed, when `peer` is not a valid key or the result
    /// is degenerate (a low-order point).
    HIVEMESH_DECL bool key_agreement(const crypto::public_key& peer,
                                     std::span<unsigned char, 32> out) const;

private:
    HIVEMESH_DECL explicit identity(const unsigned char* seed);

    void require_secret() const {
        if (!secret_) throw std::logic_error("hivemesh: use of a moved-from crypto::identity");
    }

    HIVEMESH_DECL static std::optional<identity> load(const std::filesystem::path& path,
                                                      std::error_code& ec);

    HIVEMESH_DECL static std::optional<identity> create(const std::filesystem::path& path,
                                                        std::error_code& ec);

    std::unique_ptr<detail::ed25519_secret_key> secret_;
    crypto::public_key public_key_;
    peer_id id_;
};

} // namespace hivemesh::crypto

#if !defined(HIVEMESH_SEPARATE_COMPILATION)
#include "hivemesh/crypto/impl/identity.ipp"
#endif
