// The non-template functions of crypto/secure_channel.hpp: key derivation, the record
// layer's sealing and opening, and the handshake's steps.
#pragma once

#include "hivemesh/crypto/secure_channel.hpp"

namespace hivemesh::crypto {

namespace detail {

HIVEMESH_DECL symmetric_key derive_key(std::span<const unsigned char, 64> prk,
                                       std::string_view label, const transcript_hash& th) noexcept {
    crypto_generichash_state state;
    crypto_generichash_init(&state, prk.data(), prk.size(), symmetric_key::size);
    hash_label(state, label);
    crypto_generichash_update(&state, th.data(), th.size());
    symmetric_key key;
    crypto_generichash_final(&state, key.data(), symmetric_key::size);
    sodium_memzero(&state, sizeof state);
    return key;
}

HIVEMESH_DECL void validate(const secure_options& options) {
    if (options.max_record_size < 1 + record_tag_size ||
        options.max_record_size > std::numeric_limits<std::uint32_t>::max())
        throw std::invalid_argument(
            "hivemesh::crypto::secure_options: max_record_size must be in [17, 2^32 - 1]");
    if (options.rekey_interval_records == 0 || options.rekey_interval_bytes == 0)
        throw std::invalid_argument(
            "hivemesh::crypto::secure_options: rekey intervals must be positive");
}

HIVEMESH_DECL record_cipher::record_cipher(cipher suite, const symmetric_key& key)
    : suite_(suite)
    , key_(key) {
    if (suite_ == cipher::aes256_gcm && !aes256_gcm_available())
        throw std::invalid_argument("hivemesh::crypto: AES-256-GCM is not available here");
    if (suite_ != cipher::plaintext && suite_ != cipher::chacha20_poly1305 &&
        suite_ != cipher::aes256_gcm)
        throw std::invalid_argument("hivemesh::crypto: unknown cipher");
}

HIVEMESH_DECL record_cipher::record_cipher(record_cipher&& other) noexcept
    : suite_(other.suite_)
    , key_(other.key_)
    , valid_(std::exchange(other.valid_, false)) {
    other.wipe();
}

HIVEMESH_DECL record_cipher& record_cipher::operator=(record_cipher&& other) noexcept {
    if (this != &other) {
        suite_ = other.suite_;
        key_ = other.key_;
        valid_ = std::exchange(other.valid_, false);
        other.wipe();
    }
    return *this;
}

HIVEMESH_DECL void record_cipher::seal(unsigned char* text, std::size_t size, unsigned char* tag,
                                       const unsigned char* ad, std::size_t ad_size,
                                       std::uint64_t counter) const noexcept {
    const auto nonce = make_nonce(counter);
    if (suite_ == cipher::aes256_gcm)
        crypto_aead_aes256gcm_encrypt_detached(text, tag, nullptr, text, size, ad, ad_size, nullptr,
                                               nonce.data(), key_.data());
    else
        crypto_aead_chacha20poly1305_ietf_encrypt_detached(
            text, tag, nullptr, text, size, ad, ad_size, nullptr, nonce.data(), key_.data());
}

HIVEMESH_DECL bool record_cipher::open(unsigned char* text, std::size_t size,
                                       const unsigned char* tag, const unsigned char* ad,
                                       std::size_t ad_size, std::uint64_t counter) const noexcept {
    const auto nonce = make_nonce(counter);
    if (suite_ == cipher::aes256_gcm)
        return crypto_aead_aes256gcm_decrypt_detached(text, nullptr, text, size, tag, ad, ad_size,
                                                      nonce.data(), key_.data()) == 0;
    return crypto_aead_chacha20poly1305_ietf_decrypt_detached(
               text, nullptr, text, size, tag, ad, ad_size, nonce.data(), key_.data()) == 0;
}

HIVEMESH_DECL void record_cipher::rotate() noexcept {
    crypto_generichash_state state;
    crypto_generichash_init(&state, key_.data(), symmetric_key::size, symmetric_key::size);
    hash_label(state, label_key_update);
    crypto_generichash_final(&state, key_.data(), symmetric_key::size);
    sodium_memzero(&state, sizeof state);
}

HIVEMESH_DECL std::array<unsigned char, record_nonce_size>
record_cipher::make_nonce(std::uint64_t counter) noexcept {
    std::array<unsigned char, record_nonce_size> nonce{};
    for (int i = 0; i < 8; ++i)
        nonce[static_cast<std::size_t>(i)] = static_cast<unsigned char>(counter >> (8 * i));
    return nonce;
}

} // namespace detail

HIVEMESH_DECL record_sealer::record_sealer(cipher suite, const symmetric_key& key,
                                           const secure_options& options)
    : cipher_((detail::validate(options), suite), key)
    , max_record_size_(options.max_record_size)
    , rekey_records_(options.rekey_interval_records)
    , rekey_bytes_(options.rekey_interval_bytes) {}

HIVEMESH_DECL std::error_code record_sealer::seal_plaintext_prefix(std::size_t payload_size,
                                                                   std::span<std::byte> prefix) {
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

HIVEMESH_DECL std::error_code record_sealer::append_record(record_type type, byte_view payload,
                                                           byte_buffer& out) {
    if (payload.size() > max_payload_size()) return errc::message_too_large;
    const std::size_t start = out.size();
    out.resize(start + record_size(payload.size()));
    const auto ec = seal_record(type, {}, payload, std::span(out).subspan(start));
    if (ec) out.resize(start);
    return ec;
}

HIVEMESH_DECL std::error_code record_sealer::seal_record(record_type type, byte_view head,
                                                         byte_view payload,
                                                         std::span<std::byte> record) {
    const std::size_t payload_size = head.size() + payload.size();
    if (auto ec = check_record(payload_size)) return ec;
    if (record.size() != record_size(payload_size))
        throw std::invalid_argument("hivemesh::crypto::record_sealer: record span must be "
                                    "exactly record_size(payload.size()) bytes");
    const bool rotate = write_prefix(type, payload_size, record.first(payload_offset));
    if (!head.empty()) std::memcpy(record.data() + payload_offset, head.data(), head.size());
    if (!payload.empty())
        std::memmove(record.data() + payload_offset + head.size(), payload.data(), payload.size());
    if (suite() != cipher::plaintext) {
        auto* text = detail::uchars(record.data() + header_size);
        cipher_.seal(text, 1 + payload_size, text + 1 + payload_size, detail::uchars(record.data()),
                     header_size, counter_);
    }
    end_record(type, payload_size, rotate);
    return {};
}

HIVEMESH_DECL std::error_code record_sealer::check_record(std::size_t payload_size) const {
    if (!cipher_.valid()) throw std::logic_error("hivemesh: use of a moved-from record_sealer");
    if (closed_) return errc::connection_closed;
    if (payload_size > max_payload_size()) return errc::message_too_large;
    // 2^64 records cannot be sent in practice; refuse rather than reuse a nonce.
    if (counter_ == std::numeric_limits<std::uint64_t>::max()) return errc::length_limit_exceeded;
    return {};
}

HIVEMESH_DECL bool record_sealer::write_prefix(record_type type, std::size_t payload_size,
                                               std::span<std::byte> prefix) {
    const bool rotate = suite() != cipher::plaintext && type == record_type::data &&
                        (records_under_key_ + 1 >= rekey_records_ ||
                         payload_size >= rekey_bytes_ - bytes_under_key_);
    store_le32(prefix.data(), static_cast<std::uint32_t>(1 + payload_size + tag_size()));
    prefix[header_size] = static_cast<std::byte>(static_cast<std::uint8_t>(type) |
                                                 (rotate ? detail::record_key_update_flag : 0));
    return rotate;
}

HIVEMESH_DECL void record_sealer::end_record(record_type type, std::size_t payload_size,
                                             bool rotate) {
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

HIVEMESH_DECL record_opener::record_opener(cipher suite, const symmetric_key& key,
                                           const secure_options& options)
    : cipher_((detail::validate(options), suite), key)
    , max_record_size_(options.max_record_size) {}

HIVEMESH_DECL std::error_code record_opener::peek(byte_view buffered, std::size_t& record_size) {
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

HIVEMESH_DECL std::error_code record_opener::open(std::span<std::byte> record, record_type& type,
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
    if (secure && !cipher_.open(text, text_size, text + text_size, detail::uchars(record.data()),
                                header_size, counter_))
        return fail(errc::authentication_failed);
    if (const auto ec = accept(record[header_size], text_size, type)) return ec;
    payload = record.subspan(header_size + 1, text_size - 1);
    return {};
}

HIVEMESH_DECL std::error_code record_opener::open_prefix(std::span<std::byte> prefix,
                                                         std::size_t record_size, record_type& type,
                                                         std::span<std::byte>& payload) {
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

HIVEMESH_DECL std::error_code record_opener::accept(std::byte type_byte, std::size_t text_size,
                                                    record_type& type) {
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

HIVEMESH_DECL std::error_code record_opener::check_length(std::uint32_t length) {
    if (length > max_record_size_) return fail(errc::message_too_large);
    if (length < 1 + tag_size()) return fail(errc::protocol_violation);
    return {};
}

HIVEMESH_DECL handshake::handshake(const identity& self, role r, const secure_options& options,
                                   std::optional<peer_id> expected_remote, resumption resume)
    : self_(self)
    , role_(r)
    , options_(options)
    , expected_(expected_remote)
    , resume_(std::move(resume)) {
    detail::validate(options_);
    if (resume_.offer && r == role::listener)
        throw std::invalid_argument("hivemesh::crypto::handshake: a listener offers no ticket");
    if (resume_.offer && expected_ && resume_.offer->remote_key.id() != *expected_)
        throw std::invalid_argument(
            "hivemesh::crypto::handshake: the ticket offered is for another peer");
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

HIVEMESH_DECL std::error_code handshake::start(byte_buffer& out) {
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
    if (resume_.offer) writer.write_bytes(resume_.offer->id);
    detail::hash_bytes(transcript_, out);
    state_ = state::dialer_awaiting_reply;
    return {};
}

HIVEMESH_DECL std::error_code handshake::on_message(byte_view message, byte_buffer& out) {
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

HIVEMESH_DECL secure_session handshake::result() {
    require_done();
    if (taken_) throw std::logic_error("hivemesh::crypto::handshake::result called twice");
    taken_ = true;
    const bool dialer = role_ == role::dialer;
    secure_session session{
        suite_,
        record_sealer(suite_, dialer ? dialer_to_listener_ : listener_to_dialer_, options_),
        record_opener(suite_, dialer ? listener_to_dialer_ : dialer_to_listener_, options_),
        remote_key_,
        remote_id_,
        resuming_};
    wipe();
    return session;
}

HIVEMESH_DECL std::uint8_t handshake::offered_ciphers() const noexcept {
    std::uint8_t mask = detail::cipher_bit_chacha;
    if (options_.allow_aes_gcm && aes256_gcm_available()) mask |= detail::cipher_bit_aes;
    return mask;
}

HIVEMESH_DECL detail::transcript_hash handshake::snapshot() const noexcept {
    auto copy = transcript_;
    detail::transcript_hash th;
    crypto_generichash_final(&copy, th.data(), th.size());
    return th;
}

HIVEMESH_DECL bool handshake::derive_prk(byte_view remote_ephemeral) noexcept {
    std::array<unsigned char, crypto_kx_SESSIONKEYBYTES> rx, tx;
    const auto* remote = detail::uchars(remote_ephemeral.data());
    const int kx =
        role_ == role::dialer
            ? crypto_kx_client_session_keys(rx.data(), tx.data(), ephemeral_public_.data(),
                                            ephemeral_secret_.data(), remote)
            : crypto_kx_server_session_keys(rx.data(), tx.data(), ephemeral_public_.data(),
                                            ephemeral_secret_.data(), remote);
    if (kx == 0) {
        // The client's tx is the server's rx.
        const auto& client_tx = role_ == role::dialer ? tx : rx;
        const auto& client_rx = role_ == role::dialer ? rx : tx;
        crypto_generichash_state state;
        const auto& swarm = options_.swarm_key;
        crypto_generichash_init(&state, swarm ? detail::uchars(swarm->data()) : nullptr,
                                swarm ? swarm->size() : 0, prk_.size());
        if (resuming_) {
            detail::hash_label(state, detail::label_resumed_key_material);
            crypto_generichash_update(&state, ticket_.secret.data(), symmetric_key::size);
        } else {
            detail::hash_label(state, detail::label_key_material);
        }
        crypto_generichash_update(&state, client_tx.data(), client_tx.size());
        crypto_generichash_update(&state, client_rx.data(), client_rx.size());
        crypto_generichash_final(&state, prk_.data(), prk_.size());
        sodium_memzero(&state, sizeof state);
    }
    sodium_memzero(rx.data(), rx.size());
    sodium_memzero(tx.data(), tx.size());
    return kx == 0; // else a low-order ephemeral key
}

HIVEMESH_DECL byte_buffer handshake::signed_content(std::string_view label,
                                                    const detail::transcript_hash& th,
                                                    const crypto::public_key& signer) {
    byte_buffer content;
    binary_writer writer(content);
    writer.write(static_cast<std::uint8_t>(label.size()));
    writer.write_bytes(as_bytes(label));
    writer.write_bytes(as_view(th));
    writer.write_bytes(signer.view());
    return content;
}

HIVEMESH_DECL void handshake::append_sealed_identity(const symmetric_key& key,
                                                     std::string_view label,
                                                     const detail::transcript_hash& th,
                                                     byte_buffer& out) const {
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

HIVEMESH_DECL std::error_code handshake::open_sealed_identity(const symmetric_key& key,
                                                              byte_view sealed,
                                                              std::string_view label,
                                                              const detail::transcript_hash& th) {
    std::array<unsigned char, detail::identity_payload_size> text;
    const std::array<unsigned char, crypto_aead_chacha20poly1305_ietf_NPUBBYTES> nonce{};
    if (crypto_aead_chacha20poly1305_ietf_decrypt_detached(
            text.data(), nullptr, detail::uchars(sealed.data()), text.size(),
            detail::uchars(sealed.data()) + text.size(), nullptr, 0, nonce.data(), key.data()) != 0)
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

HIVEMESH_DECL void handshake::derive_traffic_keys() {
    const auto th4 = snapshot();
    dialer_to_listener_ = detail::derive_key(prk_, detail::label_dialer_to_listener, th4);
    listener_to_dialer_ = detail::derive_key(prk_, detail::label_listener_to_dialer, th4);
    if (resuming_ || !resume_.keep) return;
    resumption_ticket ticket;
    const auto id = detail::derive_key(prk_, detail::label_resumption_ticket, th4);
    std::memcpy(ticket.id.data(), id.data(), ticket.id.size());
    ticket.secret = detail::derive_key(prk_, detail::label_resumption_secret, th4);
    ticket.remote_key = remote_key_;
    resume_.keep(ticket);
}

HIVEMESH_DECL void handshake::append_confirmation(const symmetric_key& key, byte_buffer& out) {
    binary_writer writer(out);
    std::byte* tag = writer.grow(detail::record_tag_size);
    const std::array<unsigned char, crypto_aead_chacha20poly1305_ietf_NPUBBYTES> nonce{};
    unsigned char none = 0; // libsodium wants pointers even for empty texts
    crypto_aead_chacha20poly1305_ietf_encrypt_detached(&none, detail::uchars(tag), nullptr, &none,
                                                       0, nullptr, 0, nullptr, nonce.data(),
                                                       key.data());
}

HIVEMESH_DECL bool handshake::open_confirmation(const symmetric_key& key, byte_view tag) noexcept {
    const std::array<unsigned char, crypto_aead_chacha20poly1305_ietf_NPUBBYTES> nonce{};
    unsigned char none = 0;
    return tag.size() == detail::record_tag_size &&
           crypto_aead_chacha20poly1305_ietf_decrypt_detached(&none, nullptr, &none, 0,
                                                              detail::uchars(tag.data()), nullptr,
                                                              0, nonce.data(), key.data()) == 0;
}

HIVEMESH_DECL std::error_code handshake::adopt_ticket_identity() {
    remote_key_ = ticket_.remote_key;
    remote_id_ = remote_key_.id();
    if (expected_ && *expected_ != remote_id_) return errc::peer_id_mismatch;
    return {};
}

HIVEMESH_DECL std::error_code handshake::on_hello(byte_view message, byte_buffer& out) {
    binary_reader reader(message);
    const auto magic = reader.read<std::uint32_t>();
    const auto version = reader.read<std::uint8_t>();
    const auto mode = reader.read<std::uint8_t>();
    const auto ciphers = reader.read<std::uint8_t>();
    const byte_view dialer_ephemeral = reader.read_bytes(detail::ephemeral_key_size);
    const bool offers_ticket = message.size() == detail::resuming_hello_size;
    const byte_view offered = reader.read_bytes(offers_ticket ? detail::ticket_id_size : 0);
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

    if (offers_ticket && resume_.find) {
        ticket_id id;
        std::memcpy(id.data(), offered.data(), id.size());
        if (auto found = resume_.find(id)) {
            ticket_ = std::move(*found);
            resuming_ = true;
        }
    }
    if (!derive_prk(dialer_ephemeral)) return errc::handshake_failed;

    detail::hash_bytes(transcript_, message);
    binary_writer writer(out);
    writer.write(static_cast<std::uint8_t>(static_cast<std::uint8_t>(suite_) |
                                           (resuming_ ? detail::reply_resumed_flag : 0)));
    writer.write_bytes(as_view(ephemeral_public_));
    detail::hash_bytes(transcript_, out);
    const auto th2 = snapshot();
    if (resuming_) {
        append_confirmation(detail::derive_key(prk_, detail::label_resumed_listener_handshake, th2),
                            out);
        detail::hash_bytes(transcript_, byte_view(out).subspan(1 + detail::ephemeral_key_size));
        state_ = state::listener_awaiting_finish;
        return {};
    }
    const auto key = detail::derive_key(prk_, detail::label_listener_handshake, th2);
    append_sealed_identity(key, detail::label_listener_signature, th2, out);
    detail::hash_bytes(transcript_, byte_view(out).subspan(1 + detail::ephemeral_key_size));
    state_ = state::listener_awaiting_finish;
    return {};
}

HIVEMESH_DECL std::error_code handshake::on_reply(byte_view message, byte_buffer& out) {
    binary_reader reader(message);
    const auto first = reader.read<std::uint8_t>();
    resuming_ = (first & detail::reply_resumed_flag) != 0;
    const auto chosen = static_cast<std::uint8_t>(first & ~detail::reply_resumed_flag);
    const byte_view listener_ephemeral = reader.read_bytes(detail::ephemeral_key_size);
    const byte_view sealed =
        reader.read_bytes(resuming_ ? detail::record_tag_size : detail::sealed_identity_size);
    if (reader.finish() || (resuming_ && !resume_.offer)) return errc::handshake_failed;
    const auto offered = offered_ciphers();
    if (options_.plaintext) {
        if (chosen != static_cast<std::uint8_t>(cipher::plaintext)) return errc::handshake_failed;
    } else if (!(chosen == static_cast<std::uint8_t>(cipher::chacha20_poly1305) ||
                 (chosen == static_cast<std::uint8_t>(cipher::aes256_gcm) &&
                  (offered & detail::cipher_bit_aes) != 0))) {
        return errc::handshake_failed;
    }
    suite_ = static_cast<cipher>(chosen);
    if (resuming_) ticket_ = *resume_.offer;
    if (!derive_prk(listener_ephemeral)) return errc::handshake_failed;

    detail::hash_bytes(transcript_, message.first(1 + detail::ephemeral_key_size));
    const auto th2 = snapshot();
    if (resuming_) {
        if (!open_confirmation(
                detail::derive_key(prk_, detail::label_resumed_listener_handshake, th2), sealed))
            return errc::handshake_failed;
        if (auto ec = adopt_ticket_identity()) return ec;
        detail::hash_bytes(transcript_, sealed);
        append_confirmation(
            detail::derive_key(prk_, detail::label_resumed_dialer_handshake, snapshot()), out);
        detail::hash_bytes(transcript_, out);
        derive_traffic_keys();
        state_ = state::done;
        return {};
    }
    const auto listener_key = detail::derive_key(prk_, detail::label_listener_handshake, th2);
    if (auto ec = open_sealed_identity(listener_key, sealed, detail::label_listener_signature, th2))
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

HIVEMESH_DECL std::error_code handshake::on_finish(byte_view message) {
    const auto th3 = snapshot();
    if (resuming_) {
        if (!open_confirmation(
                detail::derive_key(prk_, detail::label_resumed_dialer_handshake, th3), message))
            return errc::handshake_failed;
        if (auto ec = adopt_ticket_identity()) return ec;
        detail::hash_bytes(transcript_, message);
        derive_traffic_keys();
        state_ = state::done;
        return {};
    }
    if (message.size() != detail::finish_size) return errc::handshake_failed;
    const auto dialer_key = detail::derive_key(prk_, detail::label_dialer_handshake, th3);
    if (auto ec = open_sealed_identity(dialer_key, message, detail::label_dialer_signature, th3))
        return ec;
    detail::hash_bytes(transcript_, message);
    derive_traffic_keys();
    state_ = state::done;
    return {};
}

HIVEMESH_DECL void handshake::wipe() noexcept {
    sodium_memzero(ephemeral_secret_.data(), ephemeral_secret_.size());
    sodium_memzero(prk_.data(), prk_.size());
    sodium_memzero(&transcript_, sizeof transcript_);
    sodium_memzero(dialer_to_listener_.data(), symmetric_key::size);
    sodium_memzero(listener_to_dialer_.data(), symmetric_key::size);
    if (options_.swarm_key) sodium_memzero(options_.swarm_key->data(), options_.swarm_key->size());
    sodium_memzero(ticket_.secret.data(), symmetric_key::size);
    resume_.offer.reset();
}

} // namespace hivemesh::crypto
