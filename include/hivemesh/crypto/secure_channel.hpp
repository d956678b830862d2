// The secure session protocol without I/O: the three-message handshake that authenticates
// both peers and agrees on keys, and the record layer that seals and opens traffic. Callers
// (net/secure_stream.hpp, tests, fuzzers) move the bytes; nothing here touches a socket.
//
// Handshake (dialer D, listener L; integers little-endian; fixed sizes, parsed exactly):
//   1. D->L hello  (39 bytes): u32 magic "HMSH" | u8 version 1 | u8 mode (0 secure,
//      1 plaintext) | u8 cipher mask (bit 0 ChaCha20-Poly1305, mandatory; bit 1 AES-256-GCM;
//      unknown bits ignored) | D's ephemeral X25519 key (32)
//   2. L->D reply (145 bytes): u8 chosen cipher (0 plaintext, 1 ChaCha20-Poly1305,
//      2 AES-256-GCM) | L's ephemeral key (32) | seal(k_L, L's Ed25519 key (32) | sig_L (64))
//   3. D->L finish (112 bytes): seal(k_D, D's Ed25519 key (32) | sig_D (64))
// seal() is ChaCha20-Poly1305-IETF with nonce 0 (each handshake key seals one message).
//
// Keys. crypto_kx gives both sides the same 64 bytes (client tx || client rx). With
// L(name) = u8 length | "hivemesh/secure/v1 <name>" (the length keeps labels prefix-free):
//   prk = BLAKE2b-512(key = swarm key if any, L("key material") | client tx | client rx)
//   key(name, th) = BLAKE2b-256(key = prk, L(name) | th)
// where th is a transcript hash, BLAKE2b-256(L("transcript") | the messages so far):
// th2 = hello + reply's first 33 bytes, th3 = + reply's sealed part, th4 = + finish.
// k_L = key("listener handshake", th2), k_D = key("dialer handshake", th3); traffic keys
// key("dialer to listener", th4) and key("listener to dialer", th4). Without the same
// swarm key a peer cannot open message 2 or 3. sig_L signs L("listener signature") | th2 |
// L's key, sig_D signs L("dialer signature") | th3 | D's key: bound to the role, to both
// ephemeral keys and the negotiation, to L's identity (for D), and to the signer's key,
// so a signature relayed from another session or role does not verify.
// Every failure is errc::handshake_failed (garbage, wrong magic/version/mode, bad key, bad
// tag, bad signature) except errc::peer_id_mismatch (authenticated, but not the expected
// peer), so a caller has one code to count and penalise.
//
// Records: u32 length of what follows | seal(type byte | payload) | 16-byte tag. The length
// header is the AEAD associated data; the nonce is the 64-bit record counter (little-endian,
// zero-padded to 12 bytes), which never resets, so tampered, replayed, reordered and foreign
// records fail their tag (errc::authentication_failed). Type byte: 0 data, 1 close; bit 7
// on a data record means "the sender rotates this direction's key after this record"
// (key = BLAKE2b-256(key = old key, L("key update"))). The sender decides when from its own
// options, so the two peers need not agree on rekey intervals. In plaintext mode the
// record is u32 length | type byte | payload, with no encryption and no tag.
#pragma once

#include "hivemesh/core/binary.hpp"
#include "hivemesh/core/bytes.hpp"
#include "hivemesh/core/error.hpp"
#include "hivemesh/crypto/identity.hpp"
#include "hivemesh/crypto/peer_id.hpp"

#include <sodium.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <stdexcept>
#include <string_view>
#include <system_error>
#include <utility>

namespace hivemesh::crypto {

/// Which end of the connection we are: the dialer opens it and speaks first.
enum class role : std::uint8_t { dialer, listener };

/// How records are protected. The value is the wire code in handshake message 2.
enum class cipher : std::uint8_t { plaintext = 0, chacha20_poly1305 = 1, aes256_gcm = 2 };

constexpr std::string_view to_string(role r) noexcept {
    return r == role::dialer ? "dialer" : "listener";
}

constexpr std::string_view to_string(cipher c) noexcept {
    switch (c) {
    case cipher::plaintext:
        return "plaintext";
    case cipher::chacha20_poly1305:
        return "chacha20-poly1305";
    case cipher::aes256_gcm:
        return "aes-256-gcm";
    }
    return "unknown";
}

/// True if this CPU runs libsodium's AES-256-GCM (AES-NI and PCLMUL).
inline bool aes256_gcm_available() noexcept {
    return detail::sodium_ready() && crypto_aead_aes256gcm_is_available() == 1;
}

/// Settings of one side of a secure session.
struct secure_options {
    /// Authenticate both peers but send records unencrypted and without tags: only for
    /// trusted clusters and benchmarks. Both sides must agree (else handshake_failed).
    bool plaintext = false;
    /// A pre-shared secret mixed into every key: peers without it cannot complete a
    /// handshake. Both sides must have the same one, or none.
    std::optional<std::array<std::byte, 32>> swarm_key;
    /// Largest record body (type byte, payload, tag) accepted or sent; at most 2^32 - 1.
    /// The default carries a 16 MiB frame plus room for the framing of the layers above.
    std::size_t max_record_size = (16u << 20) + 1024;
    /// Our sending key rotates after this many records ...
    std::uint64_t rekey_interval_records = std::uint64_t{1} << 20;
    /// ... or this many payload bytes under one key, whichever comes first. Both are far
    /// below the AES-GCM and ChaCha20-Poly1305 limits (about 2^32 records, 2^38 bytes).
    std::uint64_t rekey_interval_bytes = std::uint64_t{1} << 34;
    /// Offer and accept AES-256-GCM when the CPU has it. False leaves ChaCha20-Poly1305,
    /// as on a CPU without AES-NI (tests use this to cover the fallback).
    bool allow_aes_gcm = true;
    /// Tests and fuzzers only: derive the ephemeral key from this seed so handshake
    /// messages are reproducible. Never set it in production: a reused ephemeral key
    /// removes forward secrecy.
    std::optional<std::array<std::byte, 32>> ephemeral_seed_for_testing;
};

/// What a record carries.
enum class record_type : std::uint8_t { data = 0, close = 1 };

/// A 32-byte symmetric key; wiped when destroyed.
class symmetric_key {
public:
    static constexpr std::size_t size = 32;

    symmetric_key() noexcept = default;
    /// Throws std::invalid_argument unless `bytes` is 32 bytes long.
    explicit symmetric_key(byte_view bytes) {
        if (bytes.size() != size)
            throw std::invalid_argument("hivemesh::crypto::symmetric_key: needs 32 bytes");
        std::memcpy(bytes_.data(), bytes.data(), size);
    }
    symmetric_key(const symmetric_key&) = default;
    symmetric_key& operator=(const symmetric_key&) = default;
    ~symmetric_key() { sodium_memzero(bytes_.data(), bytes_.size()); }

    const unsigned char* data() const noexcept { return bytes_.data(); }
    unsigned char* data() noexcept { return bytes_.data(); }
    byte_view view() const noexcept {
        return {reinterpret_cast<const std::byte*>(bytes_.data()), size};
    }

private:
    std::array<unsigned char, size> bytes_{};
};

namespace detail {

inline constexpr std::size_t record_header_size = 4;
inline constexpr std::size_t record_tag_size = 16;
inline constexpr std::size_t record_nonce_size = 12;
inline constexpr std::uint8_t record_key_update_flag = 0x80;

inline constexpr std::uint32_t handshake_magic = 0x48534D48; // "HMSH" little-endian
inline constexpr std::uint8_t handshake_version = 1;
inline constexpr std::uint8_t mode_secure = 0;
inline constexpr std::uint8_t mode_plaintext = 1;
inline constexpr std::uint8_t cipher_bit_chacha = 0x01;
inline constexpr std::uint8_t cipher_bit_aes = 0x02;
inline constexpr std::size_t ephemeral_key_size = crypto_kx_PUBLICKEYBYTES;
inline constexpr std::size_t hello_size = 4 + 1 + 1 + 1 + ephemeral_key_size;
inline constexpr std::size_t identity_payload_size = public_key::size + signature::size;
inline constexpr std::size_t sealed_identity_size = identity_payload_size + record_tag_size;
inline constexpr std::size_t reply_size = 1 + ephemeral_key_size + sealed_identity_size;
inline constexpr std::size_t finish_size = sealed_identity_size;

// Domain labels: every hash and signature says what it is for.
inline constexpr std::string_view label_transcript = "hivemesh/secure/v1 transcript";
inline constexpr std::string_view label_key_material = "hivemesh/secure/v1 key material";
inline constexpr std::string_view label_listener_handshake =
    "hivemesh/secure/v1 listener handshake";
inline constexpr std::string_view label_dialer_handshake = "hivemesh/secure/v1 dialer handshake";
inline constexpr std::string_view label_dialer_to_listener =
    "hivemesh/secure/v1 dialer to listener";
inline constexpr std::string_view label_listener_to_dialer =
    "hivemesh/secure/v1 listener to dialer";
inline constexpr std::string_view label_listener_signature =
    "hivemesh/secure/v1 listener signature";
inline constexpr std::string_view label_dialer_signature = "hivemesh/secure/v1 dialer signature";
inline constexpr std::string_view label_key_update = "hivemesh/secure/v1 key update";

using transcript_hash = std::array<unsigned char, 32>;

/// Hashes a label with its length in front, so no label is a prefix of another's input.
inline void hash_label(crypto_generichash_state& state, std::string_view label) noexcept {
    const auto length = static_cast<unsigned char>(label.size());
    crypto_generichash_update(&state, &length, 1);
    crypto_generichash_update(&state, reinterpret_cast<const unsigned char*>(label.data()),
                              label.size());
}

inline void hash_bytes(crypto_generichash_state& state, byte_view bytes) noexcept {
    crypto_generichash_update(&state, uchars(bytes.data()), bytes.size());
}

/// key(label, th) = BLAKE2b-256(key = prk, label || th).
inline symmetric_key derive_key(std::span<const unsigned char, 64> prk, std::string_view label,
                                const transcript_hash& th) noexcept {
    crypto_generichash_state state;
    crypto_generichash_init(&state, prk.data(), prk.size(), symmetric_key::size);
    hash_label(state, label);
    crypto_generichash_update(&state, th.data(), th.size());
    symmetric_key key;
    crypto_generichash_final(&state, key.data(), symmetric_key::size);
    sodium_memzero(&state, sizeof state);
    return key;
}

inline void validate(const secure_options& options) {
    if (options.max_record_size < 1 + record_tag_size ||
        options.max_record_size > std::numeric_limits<std::uint32_t>::max())
        throw std::invalid_argument(
            "hivemesh::crypto::secure_options: max_record_size must be in [17, 2^32 - 1]");
    if (options.rekey_interval_records == 0 || options.rekey_interval_bytes == 0)
        throw std::invalid_argument(
            "hivemesh::crypto::secure_options: rekey intervals must be positive");
}

/// One direction's AEAD: cipher, current key and (for AES-GCM) libsodium's precomputed key
/// schedule. Not copyable: two copies sealing under one key would reuse nonces.
class record_cipher {
public:
    record_cipher(cipher suite, const symmetric_key& key)
        : suite_(suite)
        , key_(key) {
        if (suite_ == cipher::aes256_gcm && !aes256_gcm_available())
            throw std::invalid_argument("hivemesh::crypto: AES-256-GCM is not available here");
        if (suite_ != cipher::plaintext && suite_ != cipher::chacha20_poly1305 &&
            suite_ != cipher::aes256_gcm)
            throw std::invalid_argument("hivemesh::crypto: unknown cipher");
        precompute();
    }
    record_cipher(record_cipher&& other) noexcept
        : suite_(other.suite_)
        , key_(other.key_)
        , valid_(std::exchange(other.valid_, false)) {
        precompute();
        other.wipe();
    }
    record_cipher& operator=(record_cipher&& other) noexcept {
        if (this != &other) {
            suite_ = other.suite_;
            key_ = other.key_;
            valid_ = std::exchange(other.valid_, false);
            precompute();
            other.wipe();
        }
        return *this;
    }
    record_cipher(const record_cipher&) = delete;
    record_cipher& operator=(const record_cipher&) = delete;
    ~record_cipher() { wipe(); }

    cipher suite() const noexcept { return suite_; }
    bool valid() const noexcept { return valid_; }

    /// Encrypts `text` in place and writes the tag; `ad` is authenticated too.
    void seal(unsigned char* text, std::size_t size, unsigned char* tag, const unsigned char* ad,
              std::size_t ad_size, std::uint64_t counter) const noexcept {
        const auto nonce = make_nonce(counter);
        if (suite_ == cipher::aes256_gcm)
            crypto_aead_aes256gcm_encrypt_detached_afternm(text, tag, nullptr, text, size, ad,
                                                           ad_size, nullptr, nonce.data(), &aes_);
        else
            crypto_aead_chacha20poly1305_ietf_encrypt_detached(
                text, tag, nullptr, text, size, ad, ad_size, nullptr, nonce.data(), key_.data());
    }

    /// Checks the tag and decrypts `text` in place; false if the tag does not match.
    bool open(unsigned char* text, std::size_t size, const unsigned char* tag,
              const unsigned char* ad, std::size_t ad_size, std::uint64_t counter) const noexcept {
        const auto nonce = make_nonce(counter);
        if (suite_ == cipher::aes256_gcm)
            return crypto_aead_aes256gcm_decrypt_detached_afternm(
                       text, nullptr, text, size, tag, ad, ad_size, nonce.data(), &aes_) == 0;
        return crypto_aead_chacha20poly1305_ietf_decrypt_detached(
                   text, nullptr, text, size, tag, ad, ad_size, nonce.data(), key_.data()) == 0;
    }

    /// key = BLAKE2b-256(key = old key, "key update"): one-way, so a later key leak does
    /// not expose earlier traffic.
    void rotate() noexcept {
        crypto_generichash_state state;
        crypto_generichash_init(&state, key_.data(), symmetric_key::size, symmetric_key::size);
        hash_label(state, label_key_update);
        crypto_generichash_final(&state, key_.data(), symmetric_key::size);
        sodium_memzero(&state, sizeof state);
        precompute();
    }

private:
    static std::array<unsigned char, record_nonce_size> make_nonce(std::uint64_t counter) noexcept {
        std::array<unsigned char, record_nonce_size> nonce{};
        for (int i = 0; i < 8; ++i)
            nonce[static_cast<std::size_t>(i)] = static_cast<unsigned char>(counter >> (8 * i));
        return nonce;
    }
    void precompute() noexcept {
        if (suite_ == cipher::aes256_gcm) crypto_aead_aes256gcm_beforenm(&aes_, key_.data());
    }
    void wipe() noexcept {
        sodium_memzero(&aes_, sizeof aes_);
        sodium_memzero(key_.data(), symmetric_key::size);
    }

    cipher suite_;
    symmetric_key key_;
    bool valid_ = true;
    crypto_aead_aes256gcm_state aes_{};
};

} // namespace detail

/// Seals our outgoing records: one per payload, counter nonces, key rotation on schedule.
/// Not copyable (a copy would reuse nonces); a moved-from sealer throws std::logic_error.
class record_sealer {
public:
    /// The u32 length in front of every record.
    static constexpr std::size_t header_size = detail::record_header_size;
    /// Where the payload starts inside a record; seal() accepts a payload already there.
    static constexpr std::size_t payload_offset = detail::record_header_size + 1;

    /// Throws std::invalid_argument for invalid options or an unavailable cipher.
    record_sealer(cipher suite, const symmetric_key& key, const secure_options& options = {})
        : cipher_((detail::validate(options), suite), key)
        , max_record_size_(options.max_record_size)
        , rekey_records_(options.rekey_interval_records)
        , rekey_bytes_(options.rekey_interval_bytes) {}

    cipher suite() const noexcept { return cipher_.suite(); }
    /// 16 bytes of AEAD tag per record; none in plaintext mode.
    std::size_t tag_size() const noexcept {
        return suite() == cipher::plaintext ? 0 : detail::record_tag_size;
    }
    /// The largest payload one record carries.
    std::size_t max_payload_size() const noexcept { return max_record_size_ - 1 - tag_size(); }
    /// Bytes on the wire for a payload of `payload_size` bytes.
    std::size_t record_size(std::size_t payload_size) const noexcept {
        return payload_offset + payload_size + tag_size();
    }

    /// Seals `payload` into `record`, which must be exactly record_size(payload.size())
    /// bytes (else std::invalid_argument). `payload` may already sit at
    /// record.data() + payload_offset (in-place sealing); otherwise it must not overlap.
    /// Errors: message_too_large (payload over max_payload_size()), connection_closed
    /// (after seal_close). On error nothing is consumed and `record` is unspecified.
    std::error_code seal(byte_view payload, std::span<std::byte> record) {
        return seal_record(record_type::data, {}, payload, record);
    }
    /// As seal(), for the payload `head` followed by `body` (neither may view `record`):
    /// saves the caller from joining them first.
    std::error_code seal(byte_view head, byte_view body, std::span<std::byte> record) {
        return seal_record(record_type::data, head, body, record);
    }
    /// Plaintext mode only (else std::logic_error): writes the first payload_offset bytes
    /// of the record for a payload of `payload_size` bytes into `prefix`, which must be
    /// exactly that long, so the payload can be sent from where it is (a gather write)
    /// instead of being copied behind it. Errors as seal().
    std::error_code seal_plaintext_prefix(std::size_t payload_size, std::span<std::byte> prefix) {
        if (suite() != cipher::plaintext)
            throw std::logic_error("hivemesh::crypto::record_sealer: a prefix alone is only "
                                   "sealed in plaintext mode");
        if (prefix.size() != payload_offset)
            throw std::invalid_argument("hivemesh::crypto::record_sealer: prefix span must be "
                                        "exactly payload_offset bytes");
        if (auto ec = check_record(payload_size)) return ec;
        end_record(record_type::data, payload_size,
                   write_prefix(record_type::data, payload_size, prefix));
        return {};
    }
    /// Seals the close record (record_size(0) bytes). After it, seal() fails.
    std::error_code seal_close(std::span<std::byte> record) {
        return seal_record(record_type::close, {}, {}, record);
    }

    /// Appends the sealed record for `payload` (which must not view `out`) to `out`. Same
    /// errors as seal(); on error `out` is unchanged.
    std::error_code append(byte_view payload, byte_buffer& out) {
        return append_record(record_type::data, payload, out);
    }
    /// Appends the close record to `out`.
    std::error_code append_close(byte_buffer& out) {
        return append_record(record_type::close, {}, out);
    }

    bool closed() const noexcept { return closed_; }
    /// Records sealed so far (the next record's nonce).
    std::uint64_t records_sealed() const noexcept { return counter_; }
    /// How many times the key has rotated.
    std::uint64_t key_generation() const noexcept { return generation_; }

private:
    std::error_code append_record(record_type type, byte_view payload, byte_buffer& out) {
        if (payload.size() > max_payload_size()) return errc::message_too_large;
        const std::size_t start = out.size();
        out.resize(start + record_size(payload.size()));
        const auto ec = seal_record(type, {}, payload, std::span(out).subspan(start));
        if (ec) out.resize(start);
        return ec;
    }

    /// Seals `head` followed by `payload` (`head` empty when the payload is whole).
    std::error_code seal_record(record_type type, byte_view head, byte_view payload,
                                std::span<std::byte> record) {
        const std::size_t payload_size = head.size() + payload.size();
        if (auto ec = check_record(payload_size)) return ec;
        if (record.size() != record_size(payload_size))
            throw std::invalid_argument("hivemesh::crypto::record_sealer: record span must be "
                                        "exactly record_size(payload.size()) bytes");
        const bool rotate = write_prefix(type, payload_size, record.first(payload_offset));
        if (!head.empty()) std::memcpy(record.data() + payload_offset, head.data(), head.size());
        if (!payload.empty())
            std::memmove(record.data() + payload_offset + head.size(), payload.data(),
                         payload.size());
        if (suite() != cipher::plaintext) {
            auto* text = detail::uchars(record.data() + header_size);
            cipher_.seal(text, 1 + payload_size, text + 1 + payload_size,
                         detail::uchars(record.data()), header_size, counter_);
        }
        end_record(type, payload_size, rotate);
        return {};
    }

    /// Whether a record of `payload_size` bytes may be sealed now.
    std::error_code check_record(std::size_t payload_size) const {
        if (!cipher_.valid()) throw std::logic_error("hivemesh: use of a moved-from record_sealer");
        if (closed_) return errc::connection_closed;
        if (payload_size > max_payload_size()) return errc::message_too_large;
        // 2^64 records cannot be sent in practice; refuse rather than reuse a nonce.
        if (counter_ == std::numeric_limits<std::uint64_t>::max())
            return errc::length_limit_exceeded;
        return {};
    }

    /// Writes the record's length and type byte into `prefix` (payload_offset bytes);
    /// returns whether the key rotates after this record.
    bool write_prefix(record_type type, std::size_t payload_size, std::span<std::byte> prefix) {
        const bool rotate = suite() != cipher::plaintext && type == record_type::data &&
                            (records_under_key_ + 1 >= rekey_records_ ||
                             payload_size >= rekey_bytes_ - bytes_under_key_);
        store_le32(prefix.data(), static_cast<std::uint32_t>(1 + payload_size + tag_size()));
        prefix[header_size] = static_cast<std::byte>(static_cast<std::uint8_t>(type) |
                                                     (rotate ? detail::record_key_update_flag : 0));
        return rotate;
    }

    /// Counts a sealed record and rotates the key when it is due.
    void end_record(record_type type, std::size_t payload_size, bool rotate) {
        ++counter_;
        ++records_under_key_;
        bytes_under_key_ += payload_size;
        if (rotate) {
            cipher_.rotate();
            records_under_key_ = 0;
            bytes_under_key_ = 0;
            ++generation_;
        }
        if (type == record_type::close) closed_ = true;
    }

    detail::record_cipher cipher_;
    std::size_t max_record_size_;
    std::uint64_t rekey_records_;
    std::uint64_t rekey_bytes_;
    std::uint64_t counter_ = 0;
    std::uint64_t records_under_key_ = 0;
    std::uint64_t bytes_under_key_ = 0;
    std::uint64_t generation_ = 0;
    bool closed_ = false;
};

/// Opens the peer's records in place, in order. The first error is sticky: after a bad
/// record the stream is out of step and nothing later can be trusted.
/// Not copyable; a moved-from opener throws std::logic_error.
class record_opener {
public:
    static constexpr std::size_t header_size = detail::record_header_size;

    /// Throws std::invalid_argument for invalid options or an unavailable cipher.
    record_opener(cipher suite, const symmetric_key& key, const secure_options& options = {})
        : cipher_((detail::validate(options), suite), key)
        , max_record_size_(options.max_record_size) {}

    cipher suite() const noexcept { return cipher_.suite(); }

    /// Looks at the start of the buffered bytes and sets `record_size` to the size of the
    /// next record (header included), or to 0 if fewer than header_size bytes are there.
    /// Only the 4-byte header is read, so an oversized length is refused before anything
    /// is allocated for it. Errors: message_too_large (length over max_record_size),
    /// protocol_violation (length too short for a record, or bytes after the close record).
    std::error_code peek(byte_view buffered, std::size_t& record_size) {
        record_size = 0;
        if (ec_) return ec_;
        if (buffered.empty()) return {};
        if (closed_) return fail(errc::protocol_violation);
        if (buffered.size() < header_size) return {};
        const auto ec = check_length(load_le32(buffered.data()));
        if (ec) return ec;
        record_size = header_size + load_le32(buffered.data());
        return {};
    }

    /// Authenticates and decrypts one whole record in place; `record` must span exactly
    /// the size peek() gave (else std::invalid_argument). On success `payload` views the
    /// plaintext inside `record`. Errors: authentication_failed (tampered, replayed,
    /// reordered or foreign record), protocol_violation (unknown type, close record with
    /// a payload, record after close), message_too_large.
    std::error_code open(std::span<std::byte> record, record_type& type,
                         std::span<std::byte>& payload) {
        if (!cipher_.valid()) throw std::logic_error("hivemesh: use of a moved-from record_opener");
        payload = {};
        if (ec_) return ec_;
        if (closed_) return fail(errc::protocol_violation);
        if (record.size() < header_size)
            throw std::invalid_argument("hivemesh::crypto::record_opener: incomplete record");
        const std::uint32_t length = load_le32(record.data());
        if (const auto ec = check_length(length)) return ec;
        if (record.size() != header_size + length)
            throw std::invalid_argument("hivemesh::crypto::record_opener: record span must be "
                                        "exactly the size peek() returned");
        const bool secure = suite() != cipher::plaintext;
        const std::size_t text_size = length - tag_size();
        auto* text = detail::uchars(record.data() + header_size);
        if (secure && !cipher_.open(text, text_size, text + text_size,
                                    detail::uchars(record.data()), header_size, counter_))
            return fail(errc::authentication_failed);
        if (const auto ec = accept(record[header_size], text_size, type)) return ec;
        payload = record.subspan(header_size + 1, text_size - 1);
        return {};
    }

    /// Plaintext sessions only (else std::logic_error): opens a record of `record_size`
    /// bytes (as peek() gave) from its first bytes, `prefix` (header, type byte and at most
    /// the whole payload), while the rest of its payload is read elsewhere; nothing in a
    /// plaintext payload needs checking. `payload` views the payload bytes in `prefix`.
    /// Same checks, errors and counting as open().
    std::error_code open_prefix(std::span<std::byte> prefix, std::size_t record_size,
                                record_type& type, std::span<std::byte>& payload) {
        if (!cipher_.valid()) throw std::logic_error("hivemesh: use of a moved-from record_opener");
        if (suite() != cipher::plaintext)
            throw std::logic_error("hivemesh::crypto::record_opener::open_prefix: plaintext only");
        payload = {};
        if (ec_) return ec_;
        if (closed_) return fail(errc::protocol_violation);
        if (prefix.size() <= header_size || prefix.size() > record_size)
            throw std::invalid_argument("hivemesh::crypto::record_opener: prefix span must hold "
                                        "the header, the type byte and at most the record");
        const std::uint32_t length = load_le32(prefix.data());
        if (const auto ec = check_length(length)) return ec;
        if (record_size != header_size + length)
            throw std::invalid_argument("hivemesh::crypto::record_opener: record_size must be "
                                        "the size peek() returned");
        if (const auto ec = accept(prefix[header_size], length, type)) return ec;
        payload = prefix.subspan(header_size + 1);
        return {};
    }

    /// To call when the byte stream ends: success if the close record arrived, else
    /// connection_truncated (or the earlier sticky error).
    std::error_code end_of_stream() const noexcept {
        if (ec_) return ec_;
        return closed_ ? std::error_code{} : make_error_code(errc::connection_truncated);
    }

    bool closed() const noexcept { return closed_; }
    std::uint64_t records_opened() const noexcept { return counter_; }
    std::uint64_t key_generation() const noexcept { return generation_; }
    std::size_t max_record_size() const noexcept { return max_record_size_; }

private:
    std::size_t tag_size() const noexcept {
        return suite() == cipher::plaintext ? 0 : detail::record_tag_size;
    }
    /// Checks an authentic record's type byte (its text is `text_size` bytes, type byte
    /// included), counts the record and rotates the key when the sender said so.
    std::error_code accept(std::byte type_byte, std::size_t text_size, record_type& type) {
        const auto bits = static_cast<std::uint8_t>(type_byte);
        const bool rotate_after = (bits & detail::record_key_update_flag) != 0;
        const auto kind = static_cast<std::uint8_t>(bits & ~detail::record_key_update_flag);
        if (kind == static_cast<std::uint8_t>(record_type::data)) {
            if (rotate_after && suite() == cipher::plaintext) return fail(errc::protocol_violation);
            type = record_type::data;
        } else if (kind == static_cast<std::uint8_t>(record_type::close)) {
            if (rotate_after || text_size != 1) return fail(errc::protocol_violation);
            type = record_type::close;
            closed_ = true;
        } else {
            return fail(errc::protocol_violation);
        }
        ++counter_;
        if (rotate_after) {
            cipher_.rotate();
            ++generation_;
        }
        return {};
    }
    std::error_code check_length(std::uint32_t length) {
        if (length > max_record_size_) return fail(errc::message_too_large);
        if (length < 1 + tag_size()) return fail(errc::protocol_violation);
        return {};
    }
    std::error_code fail(errc e) {
        ec_ = e;
        return ec_;
    }

    detail::record_cipher cipher_;
    std::size_t max_record_size_;
    std::uint64_t counter_ = 0;
    std::uint64_t generation_ = 0;
    bool closed_ = false;
    std::error_code ec_;
};

/// What a completed handshake yields.
struct secure_session {
    cipher suite;
    record_sealer sealer; ///< our direction
    record_opener opener; ///< the peer's direction
    crypto::public_key remote_key;
    peer_id remote_id;
};

/// One side of the handshake as a state machine over whole messages. The caller moves
/// the messages (each at most max_message_size bytes, so a transport can bound them).
///
/// Dialer: start() gives message 1; on_message(message 2) gives message 3 and done().
/// Listener: on_message(message 1) gives message 2; on_message(message 3) gives done().
/// The dialer is done once it has sent message 3; if the listener then refuses it, the
/// dialer learns so from the connection closing.
///
/// Errors: handshake_failed for anything wrong with a message, peer_id_mismatch when an
/// authenticated peer is not the expected one. The first error is sticky and wipes the
/// secrets. Calling a step out of turn throws std::logic_error.
/// `self` must outlive the handshake. Not copyable or movable (it holds secrets).
class handshake {
public:
    /// Handshake messages are far smaller; transports refuse longer frames unread.
    static constexpr std::size_t max_message_size = 4096;

    /// `expected_remote`: the PeerId the peer must prove (a dialer normally knows it; a
    /// listener usually passes none and accepts any authenticated peer).
    /// Throws std::invalid_argument for invalid options.
    handshake(const identity& self, role r, const secure_options& options = {},
              std::optional<peer_id> expected_remote = std::nullopt)
        : self_(self)
        , role_(r)
        , options_(options)
        , expected_(expected_remote) {
        detail::validate(options_);
        ensure_sodium_initialized();
        if (options_.ephemeral_seed_for_testing)
            crypto_kx_seed_keypair(ephemeral_public_.data(), ephemeral_secret_.data(),
                                   detail::uchars(options_.ephemeral_seed_for_testing->data()));
        else
            crypto_kx_keypair(ephemeral_public_.data(), ephemeral_secret_.data());
        crypto_generichash_init(&transcript_, nullptr, 0, sizeof(detail::transcript_hash));
        detail::hash_label(transcript_, detail::label_transcript);
        state_ = role_ == role::dialer ? state::dialer_start : state::listener_awaiting_hello;
    }
    handshake(const handshake&) = delete;
    handshake& operator=(const handshake&) = delete;
    ~handshake() { wipe(); }

    /// Dialer: replaces `out` with message 1. Listener: clears `out` (it speaks second).
    std::error_code start(byte_buffer& out) {
        if (role_ == role::dialer && state_ != state::dialer_start)
            throw std::logic_error("hivemesh::crypto::handshake::start called twice");
        out.clear();
        if (role_ == role::listener) return error_;
        binary_writer writer(out);
        writer.write(detail::handshake_magic);
        writer.write(detail::handshake_version);
        writer.write(options_.plaintext ? detail::mode_plaintext : detail::mode_secure);
        writer.write(offered_ciphers());
        writer.write_bytes(as_view(ephemeral_public_));
        detail::hash_bytes(transcript_, out);
        state_ = state::dialer_awaiting_reply;
        return {};
    }

    /// Processes the peer's next message and replaces `out` with our reply (empty when
    /// there is none); `message` must not view `out`'s storage. See the class comment for
    /// the errors; after one, later calls return it again.
    std::error_code on_message(byte_view message, byte_buffer& out) {
        if (state_ != state::failed && state_ != state::listener_awaiting_hello &&
            state_ != state::dialer_awaiting_reply && state_ != state::listener_awaiting_finish)
            throw std::logic_error("hivemesh::crypto::handshake::on_message called out of turn");
        out.clear();
        std::error_code ec = error_;
        if (state_ == state::listener_awaiting_hello)
            ec = on_hello(message, out);
        else if (state_ == state::dialer_awaiting_reply)
            ec = on_reply(message, out);
        else if (state_ == state::listener_awaiting_finish)
            ec = on_finish(message);
        if (ec) {
            out.clear();
            error_ = ec;
            state_ = state::failed;
            wipe();
        }
        return ec;
    }

    bool done() const noexcept { return state_ == state::done; }
    /// The error that ended the handshake, if any.
    std::error_code error() const noexcept { return error_; }

    /// After done(): the peer's proven key and PeerId, and the negotiated cipher.
    const crypto::public_key& remote_key() const {
        require_done();
        return remote_key_;
    }
    const peer_id& remote_id() const {
        require_done();
        return remote_id_;
    }
    cipher suite() const {
        require_done();
        return suite_;
    }

    /// After done(): the record sealer and opener of the session. Call once.
    secure_session result() {
        require_done();
        if (taken_) throw std::logic_error("hivemesh::crypto::handshake::result called twice");
        taken_ = true;
        const bool dialer = role_ == role::dialer;
        secure_session session{
            suite_,
            record_sealer(suite_, dialer ? dialer_to_listener_ : listener_to_dialer_, options_),
            record_opener(suite_, dialer ? listener_to_dialer_ : dialer_to_listener_, options_),
            remote_key_, remote_id_};
        wipe();
        return session;
    }

private:
    enum class state {
        dialer_start,
        dialer_awaiting_reply,
        listener_awaiting_hello,
        listener_awaiting_finish,
        done,
        failed
    };

    static byte_view as_view(std::span<const unsigned char> bytes) noexcept {
        return {reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()};
    }

    std::uint8_t offered_ciphers() const noexcept {
        std::uint8_t mask = detail::cipher_bit_chacha;
        if (options_.allow_aes_gcm && aes256_gcm_available()) mask |= detail::cipher_bit_aes;
        return mask;
    }

    detail::transcript_hash snapshot() const noexcept {
        auto copy = transcript_;
        detail::transcript_hash th;
        crypto_generichash_final(&copy, th.data(), th.size());
        return th;
    }

    /// prk = BLAKE2b-512(key = swarm key, "key material" || client tx || client rx).
    void derive_prk(const unsigned char* client_tx, const unsigned char* client_rx) noexcept {
        crypto_generichash_state state;
        const auto& swarm = options_.swarm_key;
        crypto_generichash_init(&state, swarm ? detail::uchars(swarm->data()) : nullptr,
                                swarm ? swarm->size() : 0, prk_.size());
        detail::hash_label(state, detail::label_key_material);
        crypto_generichash_update(&state, client_tx, crypto_kx_SESSIONKEYBYTES);
        crypto_generichash_update(&state, client_rx, crypto_kx_SESSIONKEYBYTES);
        crypto_generichash_final(&state, prk_.data(), prk_.size());
        sodium_memzero(&state, sizeof state);
    }

    /// What a signature covers: its role label, the transcript hash and the signer's key.
    static byte_buffer signed_content(std::string_view label, const detail::transcript_hash& th,
                                      const crypto::public_key& signer) {
        byte_buffer content;
        binary_writer writer(content);
        writer.write(static_cast<std::uint8_t>(label.size()));
        writer.write_bytes(as_bytes(label));
        writer.write_bytes(as_view(th));
        writer.write_bytes(signer.view());
        return content;
    }

    /// Appends seal(key, our public key | signature) to `out`.
    void append_sealed_identity(const symmetric_key& key, std::string_view label,
                                const detail::transcript_hash& th, byte_buffer& out) const {
        const auto sig = self_.sign(signed_content(label, th, self_.public_key()));
        std::array<unsigned char, detail::identity_payload_size> text;
        std::memcpy(text.data(), self_.public_key().bytes().data(), public_key::size);
        std::memcpy(text.data() + public_key::size, sig.bytes().data(), signature::size);
        binary_writer writer(out);
        std::byte* sealed = writer.grow(detail::sealed_identity_size);
        const std::array<unsigned char, crypto_aead_chacha20poly1305_ietf_NPUBBYTES> nonce{};
        crypto_aead_chacha20poly1305_ietf_encrypt_detached(
            detail::uchars(sealed), detail::uchars(sealed) + text.size(), nullptr, text.data(),
            text.size(), nullptr, 0, nullptr, nonce.data(), key.data());
    }

    /// Opens a sealed identity and checks its signature; sets remote_key_ and remote_id_.
    std::error_code open_sealed_identity(const symmetric_key& key, byte_view sealed,
                                         std::string_view label,
                                         const detail::transcript_hash& th) {
        std::array<unsigned char, detail::identity_payload_size> text;
        const std::array<unsigned char, crypto_aead_chacha20poly1305_ietf_NPUBBYTES> nonce{};
        if (crypto_aead_chacha20poly1305_ietf_decrypt_detached(
                text.data(), nullptr, detail::uchars(sealed.data()), text.size(),
                detail::uchars(sealed.data()) + text.size(), nullptr, 0, nonce.data(),
                key.data()) != 0)
            return errc::handshake_failed;
        const auto text_view = as_view(text);
        const auto remote = *public_key::from_bytes(text_view.first(public_key::size));
        const auto sig = *signature::from_bytes(text_view.subspan(public_key::size));
        if (!verify(remote, signed_content(label, th, remote), sig)) return errc::handshake_failed;
        remote_key_ = remote;
        remote_id_ = remote.id();
        if (expected_ && *expected_ != remote_id_) return errc::peer_id_mismatch;
        return {};
    }

    void derive_traffic_keys() noexcept {
        const auto th4 = snapshot();
        dialer_to_listener_ = detail::derive_key(prk_, detail::label_dialer_to_listener, th4);
        listener_to_dialer_ = detail::derive_key(prk_, detail::label_listener_to_dialer, th4);
    }

    // Listener: message 1 in, message 2 out.
    std::error_code on_hello(byte_view message, byte_buffer& out) {
        binary_reader reader(message);
        const auto magic = reader.read<std::uint32_t>();
        const auto version = reader.read<std::uint8_t>();
        const auto mode = reader.read<std::uint8_t>();
        const auto ciphers = reader.read<std::uint8_t>();
        const byte_view dialer_ephemeral = reader.read_bytes(detail::ephemeral_key_size);
        if (reader.finish() || magic != detail::handshake_magic ||
            version != detail::handshake_version ||
            mode != (options_.plaintext ? detail::mode_plaintext : detail::mode_secure) ||
            (ciphers & detail::cipher_bit_chacha) == 0)
            return errc::handshake_failed;
        if (options_.plaintext)
            suite_ = cipher::plaintext;
        else if ((ciphers & offered_ciphers() & detail::cipher_bit_aes) != 0)
            suite_ = cipher::aes256_gcm;
        else
            suite_ = cipher::chacha20_poly1305;

        // Server rx = client tx, server tx = client rx.
        std::array<unsigned char, crypto_kx_SESSIONKEYBYTES> rx, tx;
        const int kx = crypto_kx_server_session_keys(rx.data(), tx.data(), ephemeral_public_.data(),
                                                     ephemeral_secret_.data(),
                                                     detail::uchars(dialer_ephemeral.data()));
        if (kx == 0) derive_prk(rx.data(), tx.data());
        sodium_memzero(rx.data(), rx.size());
        sodium_memzero(tx.data(), tx.size());
        if (kx != 0) return errc::handshake_failed; // a low-order ephemeral key

        detail::hash_bytes(transcript_, message);
        binary_writer writer(out);
        writer.write(static_cast<std::uint8_t>(suite_));
        writer.write_bytes(as_view(ephemeral_public_));
        detail::hash_bytes(transcript_, out);
        const auto th2 = snapshot();
        const auto key = detail::derive_key(prk_, detail::label_listener_handshake, th2);
        append_sealed_identity(key, detail::label_listener_signature, th2, out);
        detail::hash_bytes(transcript_, byte_view(out).subspan(1 + detail::ephemeral_key_size));
        state_ = state::listener_awaiting_finish;
        return {};
    }

    // Dialer: message 2 in, message 3 out.
    std::error_code on_reply(byte_view message, byte_buffer& out) {
        binary_reader reader(message);
        const auto chosen = reader.read<std::uint8_t>();
        const byte_view listener_ephemeral = reader.read_bytes(detail::ephemeral_key_size);
        const byte_view sealed = reader.read_bytes(detail::sealed_identity_size);
        if (reader.finish()) return errc::handshake_failed;
        const auto offered = offered_ciphers();
        if (options_.plaintext) {
            if (chosen != static_cast<std::uint8_t>(cipher::plaintext))
                return errc::handshake_failed;
        } else if (!(chosen == static_cast<std::uint8_t>(cipher::chacha20_poly1305) ||
                     (chosen == static_cast<std::uint8_t>(cipher::aes256_gcm) &&
                      (offered & detail::cipher_bit_aes) != 0))) {
            return errc::handshake_failed;
        }
        suite_ = static_cast<cipher>(chosen);

        std::array<unsigned char, crypto_kx_SESSIONKEYBYTES> rx, tx;
        const int kx = crypto_kx_client_session_keys(rx.data(), tx.data(), ephemeral_public_.data(),
                                                     ephemeral_secret_.data(),
                                                     detail::uchars(listener_ephemeral.data()));
        if (kx == 0) derive_prk(tx.data(), rx.data());
        sodium_memzero(rx.data(), rx.size());
        sodium_memzero(tx.data(), tx.size());
        if (kx != 0) return errc::handshake_failed;

        detail::hash_bytes(transcript_, message.first(1 + detail::ephemeral_key_size));
        const auto th2 = snapshot();
        const auto listener_key = detail::derive_key(prk_, detail::label_listener_handshake, th2);
        if (auto ec =
                open_sealed_identity(listener_key, sealed, detail::label_listener_signature, th2))
            return ec;

        detail::hash_bytes(transcript_, sealed);
        const auto th3 = snapshot();
        const auto dialer_key = detail::derive_key(prk_, detail::label_dialer_handshake, th3);
        append_sealed_identity(dialer_key, detail::label_dialer_signature, th3, out);
        detail::hash_bytes(transcript_, out);
        derive_traffic_keys();
        state_ = state::done;
        return {};
    }

    // Listener: message 3 in, nothing out.
    std::error_code on_finish(byte_view message) {
        if (message.size() != detail::finish_size) return errc::handshake_failed;
        const auto th3 = snapshot();
        const auto dialer_key = detail::derive_key(prk_, detail::label_dialer_handshake, th3);
        if (auto ec =
                open_sealed_identity(dialer_key, message, detail::label_dialer_signature, th3))
            return ec;
        detail::hash_bytes(transcript_, message);
        derive_traffic_keys();
        state_ = state::done;
        return {};
    }

    void require_done() const {
        if (state_ != state::done)
            throw std::logic_error("hivemesh::crypto::handshake: the handshake is not done");
    }

    void wipe() noexcept {
        sodium_memzero(ephemeral_secret_.data(), ephemeral_secret_.size());
        sodium_memzero(prk_.data(), prk_.size());
        sodium_memzero(&transcript_, sizeof transcript_);
        sodium_memzero(dialer_to_listener_.data(), symmetric_key::size);
        sodium_memzero(listener_to_dialer_.data(), symmetric_key::size);
        if (options_.swarm_key)
            sodium_memzero(options_.swarm_key->data(), options_.swarm_key->size());
    }

    const identity& self_;
    role role_;
    secure_options options_;
    std::optional<peer_id> expected_;
    state state_;
    std::error_code error_;
    bool taken_ = false;
    std::array<unsigned char, crypto_kx_PUBLICKEYBYTES> ephemeral_public_{};
    std::array<unsigned char, crypto_kx_SECRETKEYBYTES> ephemeral_secret_{};
    std::array<unsigned char, 64> prk_{};
    crypto_generichash_state transcript_{};
    cipher suite_ = cipher::plaintext;
    crypto::public_key remote_key_;
    peer_id remote_id_;
    symmetric_key dialer_to_listener_;
    symmetric_key listener_to_dialer_;
};

} // namespace hivemesh::crypto
