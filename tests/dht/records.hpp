// DHT records made from text, shared by the storage and validator tests.
#pragma once

#include "support/bytes.hpp"

#include <hivemesh/core/clock.hpp>
#include <hivemesh/dht/record.hpp>

#include <string_view>

namespace hivemesh::test {

/// A plain record: `value` under `key`, no subkey, unsigned.
inline dht::record plain(std::string_view key, std::string_view value, time_point expiration) {
    return {.key = bytes_of(key),
            .subkey = std::nullopt,
            .value = bytes_of(value),
            .expiration = expiration,
            .signature = {}};
}

/// A dictionary item: `value` under `subkey` of `key`, unsigned.
inline dht::record item(std::string_view key, std::string_view subkey, std::string_view value,
                        time_point expiration) {
    return {.key = bytes_of(key),
            .subkey = bytes_of(subkey),
            .value = bytes_of(value),
            .expiration = expiration,
            .signature = {}};
}

} // namespace hivemesh::test
