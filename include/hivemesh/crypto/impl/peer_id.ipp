// The non-template functions of crypto/peer_id.hpp: base58 and parsing PeerIds.
#pragma once

#include "hivemesh/crypto/peer_id.hpp"

namespace hivemesh::crypto {

HIVEMESH_DECL std::string base58_encode(byte_view bytes) {
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

HIVEMESH_DECL bool base58_decode(std::string_view text, std::span<std::byte> out) {
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

HIVEMESH_DECL peer_id peer_id::from_public_key(byte_view public_key) {
    ensure_sodium_initialized();
    bytes_type hash{};
    crypto_generichash(reinterpret_cast<unsigned char*>(hash.data()), hash.size(),
                       reinterpret_cast<const unsigned char*>(public_key.data()), public_key.size(),
                       nullptr, 0);
    return peer_id(hash);
}

HIVEMESH_DECL std::optional<peer_id> peer_id::parse(std::string_view text) noexcept {
    bytes_type bytes{};
    try {
        if (!base58_decode(text, bytes)) return std::nullopt;
    } catch (const std::bad_alloc&) {
        return std::nullopt;
    }
    return peer_id(bytes);
}

HIVEMESH_DECL peer_id peer_id::from_string(std::string_view text) {
    auto id = parse(text);
    if (!id)
        throw std::system_error(errc::invalid_argument,
                                "hivemesh: not a PeerId: " + std::string(text));
    return *id;
}

} // namespace hivemesh::crypto
