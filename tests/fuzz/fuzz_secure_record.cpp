// libFuzzer target: crypto::record_opener on an arbitrary incoming byte stream, in plaintext,
// ChaCha20-Poly1305 and AES-256-GCM mode (the first input byte picks the mode). Every input
// must be opened record by record or refused with an error code; sanitizers catch the rest.
// Plaintext records that open must re-seal to the same bytes, and open from a prefix with
// the same verdict (record_opener::open_prefix). make_corpus.cpp seeds valid
// streams sealed with the same key and limit (crypto_seeds.hpp).
#include "crypto_seeds.hpp"

#include <hivemesh/crypto/secure_channel.hpp>

#include <cstdint>
#include <cstdlib>
#include <cstring>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using namespace hivemesh::crypto;
    using hivemesh::fuzz::max_record_size;
    if (size == 0) return 0;
    cipher suite = static_cast<cipher>(data[0] % 3);
    if (suite == cipher::aes256_gcm && !aes256_gcm_available()) suite = cipher::chacha20_poly1305;
    const symmetric_key key = hivemesh::fuzz::record_key();
    secure_options options;
    options.max_record_size = max_record_size;
    record_opener opener(suite, key, options);
    record_sealer resealer(cipher::plaintext, key, options);
    // Plaintext records are also opened from a prefix, as a placed read does: same verdicts.
    record_opener by_prefix(suite, key, options);

    // Opened in place, so the stream is a mutable copy.
    hivemesh::byte_buffer stream(size - 1);
    if (!stream.empty()) std::memcpy(stream.data(), data + 1, size - 1);
    std::size_t offset = 0;
    std::error_code ec;
    for (;;) {
        std::size_t record_size = 0;
        ec = opener.peek(hivemesh::byte_view(stream).subspan(offset), record_size);
        if (ec || record_size == 0 || record_size > stream.size() - offset) break;
        if (record_size < record_opener::header_size + 1 || record_size > 4 + max_record_size)
            std::abort(); // peek must enforce the limits
        const auto record = std::span(stream).subspan(offset, record_size);
        hivemesh::byte_buffer original(record.begin(), record.end());
        record_type type{};
        std::span<std::byte> payload;
        record_type prefix_type{};
        std::span<std::byte> head;
        std::error_code prefix_ec;
        if (suite == cipher::plaintext) {
            const std::size_t header = record_opener::header_size;
            const std::size_t prefix_size = header + 1 + offset % (record_size - header);
            prefix_ec =
                by_prefix.open_prefix(record.first(prefix_size), record_size, prefix_type, head);
        }
        ec = opener.open(record, type, payload);
        if (suite == cipher::plaintext &&
            (prefix_ec != ec || (!ec && (prefix_type != type || head.data() != payload.data() ||
                                         head.size() > payload.size()))))
            std::abort();
        if (ec) break;
        if (payload.data() < record.data() || payload.size() > record.size()) std::abort();
        if (suite == cipher::plaintext) {
            hivemesh::byte_buffer resealed;
            const auto seal_ec = type == record_type::data ? resealer.append(payload, resealed)
                                                           : resealer.append_close(resealed);
            if (seal_ec || resealed != original) std::abort();
        }
        offset += record_size;
    }
    // A stream is complete only with its close record; anything else is truncated or an error.
    const auto end = opener.end_of_stream();
    if (!ec && opener.closed() && end) std::abort();
    if (!ec && !opener.closed() && end != hivemesh::errc::connection_truncated) std::abort();
    if (ec && end != ec) std::abort(); // errors are sticky
    return 0;
}
