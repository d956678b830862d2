// A peer's long-term identity: an Ed25519 key pair, its public key and signatures, and the
// identity file that keeps the key across restarts.
//
// Identity file (69 bytes, mode 0600):
//   u32 magic 0x44494D48 ("HMID" on disk) | u8 version 1 | 32-byte Ed25519 seed |
//   32-byte public key (redundant: it detects a corrupted or foreign seed)
#pragma once

#include "hivemesh/core/binary.hpp"
#include "hivemesh/core/bytes.hpp"
#include "hivemesh/core/error.hpp"
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

inline std::error_code last_system_error() noexcept {
    return {errno, std::system_category()};
}

/// Closes a file descriptor when it goes out of scope.
struct file_descriptor {
    int fd = -1;
    explicit file_descriptor(int descriptor) noexcept
        : fd(descriptor) {}
    file_descriptor(const file_descriptor&) = delete;
    file_descriptor& operator=(const file_descriptor&) = delete;
    ~file_descriptor() {
        if (fd >= 0) ::close(fd);
    }
};

inline std::error_code write_all(int fd, const unsigned char* data, std::size_t size) noexcept {
    while (size > 0) {
        const ssize_t n = ::write(fd, data, size);
        if (n < 0) {
            if (errno == EINTR) continue;
            return last_system_error();
        }
        data += n;
        size -= static_cast<std::size_t>(n);
    }
    return {};
}

/// Reads at most `buffer.size()` bytes; returns how many were read.
inline std::size_t read_up_to(int fd, std::span<unsigned char> buffer,
                              std::error_code& ec) noexcept {
    std::size_t total = 0;
    while (total < buffer.size()) {
        const ssize_t n = ::read(fd, buffer.data() + total, buffer.size() - total);
        if (n < 0) {
            if (errno == EINTR) continue;
            ec = last_system_error();
            return total;
        }
        if (n == 0) break;
        total += static_cast<std::size_t>(n);
    }
    return total;
}

} // namespace detail

/// True if `sig` is `key`'s signature of `message`. False for any malformed key or signature.
inline bool verify(const public_key& key, byte_view message, const signature& sig) noexcept {
    if (!detail::sodium_ready()) return false;
    return crypto_sign_verify_detached(detail::uchars(sig.bytes().data()),
                                       detail::uchars(message.data()), message.size(),
                                       detail::uchars(key.bytes().data())) == 0;
}

/// A peer's Ed25519 key pair. Movable; not implicitly copyable, because every copy of a
/// secret key is one more place it can leak from: use clone() when a copy is really meant.
/// The secret key lives on the heap, so moves do not leave stray copies behind, and it is
/// wiped when the identity is destroyed. A moved-from identity can only be destroyed or
/// assigned to; signing with it throws std::logic_error.
class identity {
public:
    static constexpr std::size_t seed_size = crypto_sign_SEEDBYTES;

    /// A fresh random key pair.
    static identity generate() {
        ensure_sodium_initialized();
        detail::wiped_seed seed;
        randombytes_buf(seed.bytes.data(), seed.bytes.size());
        return identity(seed.bytes.data());
    }

    /// The key pair derived from a 32-byte seed: the same seed always gives the same
    /// identity (tests, simulations). Throws std::system_error(invalid_argument) if the
    /// seed is not 32 bytes.
    static identity from_seed(byte_view seed) {
        if (seed.size() != seed_size)
            throw std::system_error(errc::invalid_argument,
                                    "hivemesh::crypto::identity::from_seed: seed must be 32 bytes");
        ensure_sodium_initialized();
        return identity(detail::uchars(seed.data()));
    }

    /// Loads the identity stored at `path`, or creates a new one there (mode 0600) if no
    /// file exists. Errors: insecure_permissions (the file is accessible to group or
    /// others), bad_magic, unsupported_version, truncated_input, trailing_data,
    /// corrupt_data (public key does not match the seed), invalid_argument (not a regular
    /// file), and system errors from the file system. Returns nullopt on error.
    static std::optional<identity> load_or_create(const std::filesystem::path& path,
                                                  std::error_code& ec) {
        ensure_sodium_initialized();
        ec.clear();
        // Another process may create the file between our attempts: retry once as a load.
        for (int attempt = 0; attempt < 2; ++attempt) {
            auto loaded = load(path, ec);
            if (loaded || ec != std::errc::no_such_file_or_directory) return loaded;
            auto created = create(path, ec);
            if (created || ec != std::errc::file_exists) return created;
        }
        return std::nullopt;
    }

    /// Throwing form of load_or_create(path, ec): throws std::system_error.
    static identity load_or_create(const std::filesystem::path& path) {
        std::error_code ec;
        auto loaded = load_or_create(path, ec);
        if (!loaded)
            throw std::system_error(ec, "hivemesh: cannot load identity from " + path.string());
        return std::move(*loaded);
    }

    identity(identity&&) noexcept = default;
    identity& operator=(identity&&) noexcept = default;
    identity(const identity&) = delete;
    identity& operator=(const identity&) = delete;
    ~identity() = default;

    /// An explicit copy of the key pair.
    identity clone() const {
        require_secret();
        return identity(secret_->bytes.data());
    }

    const crypto::public_key& public_key() const noexcept { return public_key_; }
    /// The PeerId of public_key(), computed once.
    const peer_id& id() const noexcept { return id_; }

    /// Signs `message` (deterministic Ed25519: the same message gives the same signature).
    crypto::signature sign(byte_view message) const {
        require_secret();
        crypto::signature::bytes_type out;
        crypto_sign_detached(detail::uchars(out.data()), nullptr, detail::uchars(message.data()),
                             message.size(), secret_->bytes.data());
        return crypto::signature(out);
    }

private:
    explicit identity(const unsigned char* seed)
        : secret_(std::make_unique<detail::ed25519_secret_key>()) {
        crypto::public_key::bytes_type pk;
        crypto_sign_seed_keypair(detail::uchars(pk.data()), secret_->bytes.data(), seed);
        public_key_ = crypto::public_key(pk);
        id_ = public_key_.id();
    }

    void require_secret() const {
        if (!secret_) throw std::logic_error("hivemesh: use of a moved-from crypto::identity");
    }

    static std::optional<identity> load(const std::filesystem::path& path, std::error_code& ec) {
        ec.clear();
        // O_NOFOLLOW: a symlink planted in place of the key file is refused, not followed.
        detail::file_descriptor file(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
        if (file.fd < 0) {
            ec = detail::last_system_error();
            return std::nullopt;
        }
        // fstat on the open descriptor, so the checked file is the one we read.
        struct stat status {};
        if (::fstat(file.fd, &status) != 0) {
            ec = detail::last_system_error();
            return std::nullopt;
        }
        if (!S_ISREG(status.st_mode)) {
            ec = errc::invalid_argument;
            return std::nullopt;
        }
        if ((status.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
            ec = errc::insecure_permissions;
            return std::nullopt;
        }
        // One byte more than a valid file, so an over-long file shows as trailing data.
        std::array<unsigned char, detail::identity_file_size + 1> content{};
        const std::size_t size = detail::read_up_to(file.fd, content, ec);
        struct wipe_on_exit {
            std::span<unsigned char> bytes;
            ~wipe_on_exit() { sodium_memzero(bytes.data(), bytes.size()); }
        } wipe{content};
        if (ec) return std::nullopt;

        binary_reader reader(byte_view(reinterpret_cast<const std::byte*>(content.data()), size));
        const auto magic = reader.read<std::uint32_t>();
        if (reader.ok() && magic != detail::identity_file_magic) reader.fail(errc::bad_magic);
        const auto version = reader.read<std::uint8_t>();
        if (reader.ok() && version != detail::identity_file_version)
            reader.fail(errc::unsupported_version);
        const byte_view seed = reader.read_bytes(seed_size);
        const byte_view stored_key = reader.read_bytes(crypto::public_key::size);
        if (auto error = reader.finish()) {
            ec = error;
            return std::nullopt;
        }
        identity loaded(detail::uchars(seed.data()));
        if (!std::equal(stored_key.begin(), stored_key.end(), loaded.public_key_.view().begin())) {
            ec = errc::corrupt_data;
            return std::nullopt;
        }
        return loaded;
    }

    // Writes a temporary file created with O_EXCL and mode 0600, then link()s it to `path`:
    // the key is never readable by others, and `path` appears only once fully written.
    // link() fails with EEXIST instead of replacing a file another process created.
    static std::optional<identity> create(const std::filesystem::path& path, std::error_code& ec) {
        ec.clear();
        detail::wiped_seed seed;
        randombytes_buf(seed.bytes.data(), seed.bytes.size());
        identity created(seed.bytes.data());

        std::array<unsigned char, detail::identity_file_size> content{};
        struct wipe_on_exit {
            std::span<unsigned char> bytes;
            ~wipe_on_exit() { sodium_memzero(bytes.data(), bytes.size()); }
        } wipe{content};
        {
            byte_buffer header;
            binary_writer writer(header);
            writer.write(detail::identity_file_magic);
            writer.write(detail::identity_file_version);
            std::memcpy(content.data(), header.data(), header.size());
            std::memcpy(content.data() + header.size(), seed.bytes.data(), seed.bytes.size());
            std::memcpy(content.data() + header.size() + seed.bytes.size(),
                        created.public_key_.bytes().data(), crypto::public_key::size);
        }

        std::filesystem::path temporary = path;
        temporary += ".tmp-" + std::to_string(::getpid()) + "-" +
                     std::to_string(randombytes_uniform(1u << 30));
        {
            detail::file_descriptor file(::open(
                temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
            if (file.fd < 0) {
                ec = detail::last_system_error();
                return std::nullopt;
            }
            ec = detail::write_all(file.fd, content.data(), content.size());
            if (!ec && ::fsync(file.fd) != 0) ec = detail::last_system_error();
        }
        if (!ec && ::link(temporary.c_str(), path.c_str()) != 0) ec = detail::last_system_error();
        ::unlink(temporary.c_str());
        if (ec) return std::nullopt;
        // Make the new directory entry durable too; a failure here loses nothing we rely on.
        const auto directory = path.has_parent_path() ? path.parent_path() : ".";
        detail::file_descriptor dir(::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
        if (dir.fd >= 0) ::fsync(dir.fd);
        return created;
    }

    std::unique_ptr<detail::ed25519_secret_key> secret_;
    crypto::public_key public_key_;
    peer_id id_;
};

} // namespace hivemesh::crypto
