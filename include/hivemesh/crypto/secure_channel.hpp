// The secure session protocol without I/O: the three-message handshake that authenticates
// both peers and agrees on keys, and the record layer that seals and opens traffic. Callers
// (net/secure_stream.hpp, tests, fuzzers) move the bytes; nothing here touches a socket.
//
// Handshake (dialer D, listener L; integers little-endian; fixed sizes, parsed exactly):
//   1. D->L hello  (39 bytes): u32 magic "HMSH" | u8 version 1 | u8 mode (0 secure,
//      1 plaintext) | u8 cipher mask (bit 0 ChaCha20-Poly1305, mandatory; bit 1 AES-256-GCM;
//      unknown bits ignored) | D's ephemeral X25519 key (32) [| ticket id (32), see below]
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
// Resumption. A full handshake leaves both peers a ticket: id = key("resumption ticket",
// th4) and secret = key("resumption secret", th4), bound to both identities. A dialer that
// holds one for the peer appends its id to message 1 (71 bytes; the id travels in the clear,
// so it links the connections of one pair of peers, as their addresses do). A listener that
// has that ticket answers with 2' and 3' below, which skip the signatures (sign and verify
// are over half of a full handshake's CPU); one that has not answers message 2, and the
// handshake is full (the id stays in the transcript):
//   2'. L->D reply (49 bytes): u8 (chosen cipher | 0x80) | L's ephemeral key | seal(k_L, "")
//   3'. D->L finish (16 bytes): seal(k_D, "")
// with prk = BLAKE2b-512(key = swarm key if any, L("resumed key material") | ticket secret
// | client tx | client rx), k_L = key("resumed listener handshake", th2) and k_D =
// key("resumed dialer handshake", th3), th3 = th2 + the reply's tag. A tag proves that its
// sender holds the secret, so the peer is who the ticket says. The ephemeral keys are fresh,
// so a resumed session keeps forward secrecy; its traffic keys are derived as above, and it
// keeps the old ticket.
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
#include "hivemesh/core/config.hpp"
#include "hivemesh/core/error.hpp"
#include "hivemesh/crypto/identity.hpp"
#include "hivemesh/crypto/peer_id.hpp"

#include <sodium.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
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
inline constexpr std::size_t ticket_id_size = 32;
inline constexpr std::size_t resuming_hello_size = hello_size + ticket_id_size;
inline constexpr std::uint8_t reply_resumed_flag = 0x80;

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
inline constexpr std::string_view label_resumption_ticket = "hivemesh/secure/v1 resumption ticket";
inline constexpr std::string_view label_resumption_secret = "hivemesh/secure/v1 resumption secret";
inline constexpr std::string_view label_resumed_key_material =
    "hivemesh/secure/v1 resumed key material";
inline constexpr std::string_view label_resumed_listener_handshake =
    "hivemesh/secure/v1 resumed listener handshake";
inline constexpr std::string_view label_resumed_dialer_handshake =
    "hivemesh/secure/v1 resumed dialer handshake";

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
HIVEMESH_DECL symmetric_key derive_key(std::span<const unsigned char, 64> prk,
                                       std::string_view label, const transcript_hash& th) noexcept;

HIVEMESH_DECL void validate(const secure_options& options);

/// One direction's AEAD: cipher and current key. AES-GCM expands the key for each record
/// (about 40 ns) rather than keeping libsodium's 512-byte schedule, which would double the
/// size of an idle connection. Not copyable: two copies sealing under one key would reuse
/// nonces.
class record_cipher {
public:
    HIVEMESH_DECL record_cipher(cipher suite, const symmetric_key& key);
    HIVEMESH_DECL record_cipher(record_cipher&& other) noexcept;
    HIVEMESH_DECL record_cipher& operator=(record_cipher&& other) noexcept;
    record_cipher(const record_cipher&) = delete;
    record_cipher& operator=(const record_cipher&) = delete;
    ~record_cipher() { wipe(); }

    cipher suite() const noexcept { return suite_; }
    bool valid() const noexcept { return valid_; }

    /// Encrypts `text` in place and writes the tag; `ad` is authenticated too.
    HIVEMESH_DECL void seal(unsigned char* text, std::size_t size, unsigned char* tag,
                            const unsigned char* ad, std::size_t ad_size,
                            std::uint64_t counter) const noexcept;

    /// Checks the tag and decrypts `text` in place; false if the tag does not match.
    HIVEMESH_DECL bool open(unsigned char* text, std::size_t size, const unsigned char* tag,
                            const unsigned char* ad, std::size_t ad_size,
                            std::uint64_t counter) const noexcept;

    /// key = BLAKE2b-256(key = old key, "key update"): one-way, so a later key leak does
    /// not expose earlier traffic.
    HIVEMESH_DECL void rotate() noexcept;

private:
    HIVEMESH_DECL static std::array<unsigned char, record_nonce_size>
    make_nonce(std::uint64_t counter) noexcept;
    void wipe() noexcept { sodium_memzero(key_.data(), symmetric_key::size); }

    cipher suite_;
    symmetric_key key_;
    bool valid_ = true;
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
    HIVEMESH_DECL record_sealer(cipher suite, const symmetric_key& key,
                                const secure_options& options = {});

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
    HIVEMESH_DECL std::error_code seal_plaintext_prefix(std::size_t payload_size,
                                                        std::span<std::byte> prefix);
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
    HIVEMESH_DECL std::error_code append_record(record_type type, byte_view payload,
                                                byte_buffer& out);

    /// Seals `head` followed by `payload` (`head` empty when the payload is whole).
    HIVEMESH_DECL std::error_code seal_record(record_type type, byte_view head, byte_view payload,
                                              std::span<std::byte> record);

    /// Whether a record of `payload_size` bytes may be sealed now.
    HIVEMESH_DECL std::error_code check_record(std::size_t payload_size) const;

    /// Writes the record's length and type byte into `prefix` (payload_offset bytes);
    /// returns whether the key rotates after this record.
    HIVEMESH_DECL bool write_prefix(record_type type, std::size_t payload_size,
                                    std::span<std::byte> prefix);

    /// Counts a sealed record and rotates the key when it is due.
    HIVEMESH_DECL void end_record(record_type type, std::size_t payload_size, bool rotate);

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
    HIVEMESH_DECL record_opener(cipher suite, const symmetric_key& key,
                                const secure_options& options = {});

    cipher suite() const noexcept { return cipher_.suite(); }

    /// Looks at the start of the buffered bytes and sets `record_size` to the size of the
    /// next record (header included), or to 0 if fewer than header_size bytes are there.
    /// Only the 4-byte header is read, so an oversized length is refused before anything
    /// is allocated for it. Errors: message_too_large (length over max_record_size),
    /// protocol_violation (length too short for a record, or bytes after the close record).
    HIVEMESH_DECL std::error_code peek(byte_view buffered, std::size_t& record_size);

    /// Authenticates and decrypts one whole record in place; `record` must span exactly
    /// the size peek() gave (else std::invalid_argument). On success `payload` views the
    /// plaintext inside `record`. Errors: authentication_failed (tampered, replayed,
    /// reordered or foreign record), protocol_violation (unknown type, close record with
    /// a payload, record after close), message_too_large.
    HIVEMESH_DECL std::error_code open(std::span<std::byte> record, record_type& type,
                                       std::span<std::byte>& payload);

    /// Plaintext sessions only (else std::logic_error): opens a record of `record_size`
    /// bytes (as peek() gave) from its first bytes, `prefix` (header, type byte and at most
    /// the whole payload), while the rest of its payload is read elsewhere; nothing in a
    /// plaintext payload needs checking. `payload` views the payload bytes in `prefix`.
    /// Same checks, errors and counting as open().
    HIVEMESH_DECL std::error_code open_prefix(std::span<std::byte> prefix, std::size_t record_size,
                                              record_type& type, std::span<std::byte>& payload);

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
    HIVEMESH_DECL std::error_code accept(std::byte type_byte, std::size_t text_size,
                                         record_type& type);
    HIVEMESH_DECL std::error_code check_length(std::uint32_t length);
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

/// The id of a resumption ticket, sent in the clear when the ticket is offered.
using ticket_id = std::array<std::byte, detail::ticket_id_size>;

/// What a full handshake leaves both peers so that a later handshake between them can
/// resume: skip the signatures and prove the shared secret instead (see the file comment).
/// Either peer may offer it when it dials the other.
struct resumption_ticket {
    ticket_id id{};
    symmetric_key secret;
    crypto::public_key remote_key; ///< the other peer's proven key
};

/// How a handshake may resume. A dialer sets `offer` to the ticket it holds for the peer it
/// expects; a listener sets `find`, which returns the ticket of an offered id if it has it.
/// Either side's `keep` receives the new ticket when a full handshake completes. Each is
/// called at most once, from on_message, and what one throws leaves on_message. None set:
/// every handshake is full.
struct resumption {
    std::optional<resumption_ticket> offer = {};
    std::function<std::optional<resumption_ticket>(const ticket_id&)> find = {};
    std::function<void(const resumption_ticket&)> keep = {};
};

/// What a completed handshake yields.
struct secure_session {
    cipher suite;
    record_sealer sealer; ///< our direction
    record_opener opener; ///< the peer's direction
    crypto::public_key remote_key;
    peer_id remote_id;
    bool resumed = false; ///< whether the handshake resumed a ticket
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
/// With `resume` (see resumption), messages 2 and 3 may be the shorter 2' and 3'.
class handshake {
public:
    /// Handshake messages are far smaller; transports refuse longer frames unread.
    static constexpr std::size_t max_message_size = 4096;

    /// `expected_remote`: the PeerId the peer must prove (a dialer normally knows it; a
    /// listener usually passes none and accepts any authenticated peer).
    /// Throws std::invalid_argument for invalid options, or for a ticket offered by a
    /// listener or for another peer than `expected_remote`.
    HIVEMESH_DECL handshake(const identity& self, role r, const secure_options& options = {},
                            std::optional<peer_id> expected_remote = std::nullopt,
                            resumption resume = {});
    handshake(const handshake&) = delete;
    handshake& operator=(const handshake&) = delete;
    ~handshake() { wipe(); }

    /// Dialer: replaces `out` with message 1. Listener: clears `out` (it speaks second).
    HIVEMESH_DECL std::error_code start(byte_buffer& out);

    /// Processes the peer's next message and replaces `out` with our reply (empty when
    /// there is none); `message` must not view `out`'s storage. See the class comment for
    /// the errors; after one, later calls return it again.
    HIVEMESH_DECL std::error_code on_message(byte_view message, byte_buffer& out);

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
    /// After done(): whether the handshake resumed with a ticket.
    bool resumed() const {
        require_done();
        return resuming_;
    }

    /// After done(): the record sealer and opener of the session. Call once.
    HIVEMESH_DECL secure_session result();

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

    HIVEMESH_DECL std::uint8_t offered_ciphers() const noexcept;

    HIVEMESH_DECL detail::transcript_hash snapshot() const noexcept;

    /// Runs crypto_kx with the peer's ephemeral key (false for a low-order one) and sets
    /// prk = BLAKE2b-512(key = swarm key, "key material" | client tx | client rx), or when
    /// resuming, "resumed key material" | ticket secret | client tx | client rx.
    HIVEMESH_DECL bool derive_prk(byte_view remote_ephemeral) noexcept;

    /// What a signature covers: its role label, the transcript hash and the signer's key.
    HIVEMESH_DECL static byte_buffer signed_content(std::string_view label,
                                                    const detail::transcript_hash& th,
                                                    const crypto::public_key& signer);

    /// Appends seal(key, our public key | signature) to `out`.
    HIVEMESH_DECL void append_sealed_identity(const symmetric_key& key, std::string_view label,
                                              const detail::transcript_hash& th,
                                              byte_buffer& out) const;

    /// Opens a sealed identity and checks its signature; sets remote_key_ and remote_id_.
    HIVEMESH_DECL std::error_code open_sealed_identity(const symmetric_key& key, byte_view sealed,
                                                       std::string_view label,
                                                       const detail::transcript_hash& th);

    /// The traffic keys; after a full handshake, the new ticket for resumption::keep (what
    /// keep throws leaves on_message).
    HIVEMESH_DECL void derive_traffic_keys();

    /// Appends seal(key, "") to `out`: a resumed handshake's proof of the secret.
    HIVEMESH_DECL static void append_confirmation(const symmetric_key& key, byte_buffer& out);
    HIVEMESH_DECL static bool open_confirmation(const symmetric_key& key, byte_view tag) noexcept;

    /// The resumed handshake's identity step: the peer is the ticket's (or peer_id_mismatch).
    HIVEMESH_DECL std::error_code adopt_ticket_identity();

    // Listener: message 1 in, message 2 out.
    HIVEMESH_DECL std::error_code on_hello(byte_view message, byte_buffer& out);

    // Dialer: message 2 in, message 3 out.
    HIVEMESH_DECL std::error_code on_reply(byte_view message, byte_buffer& out);

    // Listener: message 3 in, nothing out.
    HIVEMESH_DECL std::error_code on_finish(byte_view message);

    void require_done() const {
        if (state_ != state::done)
            throw std::logic_error("hivemesh::crypto::handshake: the handshake is not done");
    }

    HIVEMESH_DECL void wipe() noexcept;

    const identity& self_;
    role role_;
    secure_options options_;
    std::optional<peer_id> expected_;
    resumption resume_;
    bool resuming_ = false;
    resumption_ticket ticket_; ///< the one resuming
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

#if !defined(HIVEMESH_SEPARATE_COMPILATION)
#include "hivemesh/crypto/impl/secure_channel.ipp"
#endif
