// The non-template functions of dht/validator.hpp that are compiled once in the compiled mode.
#pragma once

#include "hivemesh/dht/validator.hpp"

#include <sodium.h>

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

namespace detail {

HIVEMESH_DECL bool verified_signatures::verify(const crypto::public_key& key, byte_view message,
                                               const crypto::signature& sig) {
    crypto::ensure_sodium_initialized();
    digest d{};
    crypto_generichash_state state;
    crypto_generichash_init(&state, nullptr, 0, d.size());
    const auto feed = [&](byte_view bytes) {
        crypto_generichash_update(&state, reinterpret_cast<const unsigned char*>(bytes.data()),
                                  bytes.size());
    };
    // Fixed sizes first, so the message needs no length prefix.
    feed(key.bytes());
    feed(sig.bytes());
    feed(message);
    crypto_generichash_final(&state, reinterpret_cast<unsigned char*>(d.data()), d.size());
    {
        const std::lock_guard lock(mutex_);
        if (known_.contains(d)) {
            ++counters_.hits;
            return true;
        }
        ++counters_.verified;
    }
    if (!crypto::verify(key, message, sig)) return false; // failures are not remembered
    const std::lock_guard lock(mutex_);
    if (capacity_ == 0 || !known_.insert(d).second) return true;
    order_.push_back(d);
    if (order_.size() > capacity_) {
        known_.erase(order_.front());
        order_.pop_front();
    }
    return true;
}

HIVEMESH_DECL verified_signatures::counters verified_signatures::statistics() const {
    const std::lock_guard lock(mutex_);
    return counters_;
}

} // namespace detail

} // namespace hivemesh::dht
