// What the DHT stores: values with absolute expiration times, either one plain value per
// key or a dictionary of subkeys, each subkey with its own expiration.
#pragma once

#include "hivemesh/core/bytes.hpp"
#include "hivemesh/core/clock.hpp"
#include "hivemesh/dht/id.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <string_view>

namespace hivemesh::dht {

/// One value with its expiration and, for a protected key or subkey, the owner's
/// Ed25519 signature (empty otherwise).
struct stored_value {
    byte_buffer value;
    time_point expiration{};
    byte_buffer signature;

    friend bool operator==(const stored_value&, const stored_value&) = default;
};

/// One item of a store request: a plain value (no subkey) or one subkey of a dictionary.
/// Keys, subkeys and values are arbitrary bytes; empty ones are valid.
struct record {
    byte_buffer key;
    std::optional<byte_buffer> subkey;
    byte_buffer value;
    time_point expiration{};
    byte_buffer signature;

    /// The id the record is stored under.
    dht::id key_id() const { return id::of_key(key); }

    friend bool operator==(const record&, const record&) = default;
};

/// The order of subkeys: std::less<byte_buffer>'s (bytes as unsigned, a prefix first),
/// written out because g++ 12 at -O2 warns falsely (-Wstringop-overread) on the standard one
/// where a map of byte_buffer is inlined.
struct subkey_less {
    bool operator()(byte_view a, byte_view b) const noexcept {
        const std::size_t common = std::min(a.size(), b.size());
        if (common != 0)
            if (const int order = std::memcmp(a.data(), b.data(), common); order != 0)
                return order < 0;
        return a.size() < b.size();
    }
};

/// Everything a node holds under one key: a plain value, or a dictionary (never both).
struct key_entry {
    byte_buffer key;
    std::optional<stored_value> plain;
    std::map<byte_buffer, stored_value, subkey_less> dictionary;

    bool empty() const noexcept { return !plain && dictionary.empty(); }
    bool is_dictionary() const noexcept { return !dictionary.empty(); }

    /// The plain value's expiration, or the latest subkey expiration; time_point{} if empty.
    time_point expiration() const noexcept {
        if (plain) return plain->expiration;
        time_point latest{};
        for (const auto& [subkey, value] : dictionary)
            latest = std::max(latest, value.expiration);
        return latest;
    }

    /// The record that stores `value` under this key (and `subkey`, for a dictionary item).
    record to_record(const std::optional<byte_buffer>& subkey, const stored_value& value) const {
        return {key, subkey, value.value, value.expiration, value.signature};
    }

    friend bool operator==(const key_entry&, const key_entry&) = default;
};

/// The outcome of storing one record on one node; the values are part of the wire format.
enum class store_status : std::uint8_t {
    stored = 0,           ///< accepted: new, a strictly later expiration, or the one held
    outdated = 1,         ///< an equal or later expiration is already stored
    expired = 2,          ///< the expiration has already passed
    invalid = 3,          ///< refused by a validator (missing or bad signature, schema)
    too_large = 4,        ///< key, subkey or value over its size limit
    too_many_subkeys = 5, ///< the dictionary already holds the maximum number of subkeys
    storage_full = 6,     ///< the node's total storage limit would be exceeded
    rate_limited = 7,     ///< the sender exceeded its store allowance
    too_far_ahead = 8,    ///< expires later than storage_limits::max_lifetime from now
};

inline constexpr std::uint8_t max_store_status = 8;

inline std::string_view to_string(store_status s) noexcept {
    switch (s) {
    case store_status::stored:
        return "stored";
    case store_status::outdated:
        return "outdated";
    case store_status::expired:
        return "expired";
    case store_status::invalid:
        return "invalid";
    case store_status::too_large:
        return "too large";
    case store_status::too_many_subkeys:
        return "too many subkeys";
    case store_status::storage_full:
        return "storage full";
    case store_status::rate_limited:
        return "rate limited";
    case store_status::too_far_ahead:
        return "expiration too far ahead";
    }
    return "unknown";
}

} // namespace hivemesh::dht
