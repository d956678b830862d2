// The non-template functions of dht/validator.hpp that are compiled once in the compiled mode.
#pragma once

#include "hivemesh/dht/validator.hpp"

namespace hivemesh::dht {

HIVEMESH_DECL std::optional<crypto::public_key> parse_owner_marker(byte_view text) {
    static constexpr std::string_view prefix = "[owner:";
    const std::string_view marker = as_string_view(text);
    if (marker.size() <= prefix.size() || !marker.starts_with(prefix) || !marker.ends_with(']'))
        return std::nullopt;
    // base58 has no brackets, so a second marker or trailing text fails to decode.
    crypto::public_key::bytes_type bytes{};
    if (!crypto::base58_decode(marker.substr(prefix.size(), marker.size() - prefix.size() - 1),
                               bytes))
        return std::nullopt;
    return crypto::public_key(bytes);
}

} // namespace hivemesh::dht
