// The non-template functions of crypto/identity.hpp: the identity file's I/O, signing and
// verifying.
#pragma once

#include "hivemesh/crypto/identity.hpp"

namespace hivemesh::crypto {

HIVEMESH_DECL bool verify(const public_key& key, byte_view message, const signature& sig) noexcept {
    if (!detail::sodium_ready()) return false;
    return crypto_sign_verify_detached(detail::uchars(sig.bytes().data()),
                                       detail::uchars(message.data()), message.size(),
                                       detail::uchars(key.bytes().data())) == 0;
}

HIVEMESH_DECL identity identity::generate() {
    ensure_sodium_initialized();
    detail::wiped_seed seed;
    randombytes_buf(seed.bytes.data(), seed.bytes.size());
    return identity(seed.bytes.data());
}

HIVEMESH_DECL identity identity::from_seed(byte_view seed) {
    if (seed.size() != seed_size)
        throw std::system_error(errc::invalid_argument,
                                "hivemesh::crypto::identity::from_seed: seed must be 32 bytes");
    ensure_sodium_initialized();
    return identity(detail::uchars(seed.data()));
}

HIVEMESH_DECL std::optional<identity> identity::load_or_create(const std::filesystem::path& path,
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

HIVEMESH_DECL identity identity::load_or_create(const std::filesystem::path& path) {
    std::error_code ec;
    auto loaded = load_or_create(path, ec);
    if (!loaded)
        throw std::system_error(ec, "hivemesh: cannot load identity from " + path.string());
    return std::move(*loaded);
}

HIVEMESH_DECL identity identity::clone() const {
    require_secret();
    return identity(secret_->bytes.data());
}

HIVEMESH_DECL crypto::signature identity::sign(byte_view message) const {
    require_secret();
    crypto::signature::bytes_type out;
    crypto_sign_detached(detail::uchars(out.data()), nullptr, detail::uchars(message.data()),
                         message.size(), secret_->bytes.data());
    return crypto::signature(out);
}

HIVEMESH_DECL bool identity::key_agreement(const crypto::public_key& peer,
                                           std::span<unsigned char, 32> out) const {
    require_secret();
    std::array<unsigned char, crypto_scalarmult_curve25519_BYTES> peer_x;
    detail::wiped_seed own_x; // the X25519 form of our secret key
    static_assert(sizeof own_x.bytes == crypto_scalarmult_curve25519_SCALARBYTES);
    const bool ok =
        crypto_sign_ed25519_pk_to_curve25519(peer_x.data(), detail::uchars(peer.bytes().data())) ==
            0 &&
        crypto_sign_ed25519_sk_to_curve25519(own_x.bytes.data(), secret_->bytes.data()) == 0 &&
        crypto_scalarmult_curve25519(out.data(), own_x.bytes.data(), peer_x.data()) == 0;
    if (!ok) sodium_memzero(out.data(), out.size());
    return ok;
}

HIVEMESH_DECL identity::identity(const unsigned char* seed)
    : secret_(std::make_unique<detail::ed25519_secret_key>()) {
    crypto::public_key::bytes_type pk;
    crypto_sign_seed_keypair(detail::uchars(pk.data()), secret_->bytes.data(), seed);
    public_key_ = crypto::public_key(pk);
    id_ = public_key_.id();
}

HIVEMESH_DECL std::optional<identity> identity::load(const std::filesystem::path& path,
                                                     std::error_code& ec) {
    ec.clear();
    // O_NOFOLLOW: a symlink planted in place of the key file is refused, not followed.
    hivemesh::file_descriptor file(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
    if (file.fd < 0) {
        ec = hivemesh::last_system_error();
        return std::nullopt;
    }
    // fstat on the open descriptor, so the checked file is the one we read.
    struct stat status {};
    if (::fstat(file.fd, &status) != 0) {
        ec = hivemesh::last_system_error();
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
    const std::size_t size =
        hivemesh::read_up_to(file.fd, std::as_writable_bytes(std::span(content)), ec);
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
HIVEMESH_DECL std::optional<identity> identity::create(const std::filesystem::path& path,
                                                       std::error_code& ec) {
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
    temporary +=
        ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(randombytes_uniform(1u << 30));
    {
        hivemesh::file_descriptor file(
            ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
        if (file.fd < 0) {
            ec = hivemesh::last_system_error();
            return std::nullopt;
        }
        ec = hivemesh::write_all(file.fd, content.data(), content.size());
        if (!ec && ::fsync(file.fd) != 0) ec = hivemesh::last_system_error();
    }
    if (!ec && ::link(temporary.c_str(), path.c_str()) != 0) ec = hivemesh::last_system_error();
    ::unlink(temporary.c_str());
    if (ec) return std::nullopt;
    hivemesh::sync_directory_of(path);
    return created;
}

} // namespace hivemesh::crypto
