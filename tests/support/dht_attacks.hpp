// An attacker's tools against the DHT of a swarm fixture: records signed by any key, and
// stores sent straight to a node as "dht.store" requests, past the sender's own DHT node
// (which would sign, check and route them), as a modified program would send them. Shared
// by the DHT and averaging tests; asserts with Catch2, as swarm_checks.hpp does.
#pragma once

#include "support/swarm_checks.hpp"

#include <hivemesh/crypto/identity.hpp>
#include <hivemesh/dht/messages.hpp>
#include <hivemesh/dht/validator.hpp>

#include <catch2/catch.hpp>

#include <cstddef>
#include <optional>
#include <set>
#include <system_error>
#include <utility>
#include <vector>

namespace hivemesh::test {

/// `r` carrying `signer`'s signature, whoever its markers name.
inline dht::record signed_by(dht::record r, const crypto::identity& signer) {
    const auto signature = signer.sign(dht::signing_payload(r));
    r.signature.assign(signature.view().begin(), signature.view().end());
    return r;
}

/// The owner marker of `who`, as a key or subkey.
inline byte_buffer marker_of(const crypto::identity& who) {
    return to_buffer(as_bytes(dht::owner_marker(who.public_key())));
}

/// How raw_store() hands records over: in a dht.store request, or carried by a dht.find
/// (as a store's lookup does).
enum class carrier { store, find };

/// Sends `records` from member `from` to member `to` in one request; returns the status `to`
/// answered for each.
template <class World>
std::vector<dht::store_status> raw_store(swarm<World>& s, std::size_t from, std::size_t to,
                                         const std::vector<dht::record>& records,
                                         carrier by = carrier::store) {
    std::vector<dht::store_item> items;
    for (const auto& r : records)
        items.push_back({.item = r, .in_cache = false});
    const bool find = by == carrier::find;
    const auto request =
        find ? dht::encode(dht::find_request{{}, {dht::id{}}, 1, std::move(items), false})
             : dht::encode(dht::store_request{{}, std::move(items)});
    auto [ec, raw] = wait_for<std::error_code, byte_buffer>(s.world, [&](auto handler) {
        s.members[from].rpc->async_call(s.members[to].address(), find ? "dht.find" : "dht.store",
                                        request, std::chrono::seconds(10), handler);
    });
    REQUIRE_FALSE(ec);
    std::vector<dht::store_status> statuses;
    if (find) {
        dht::find_response response;
        REQUIRE_FALSE(dht::decode(raw, response));
        statuses = std::move(response.statuses);
    } else {
        dht::store_response response;
        REQUIRE_FALSE(dht::decode(raw, response));
        statuses = std::move(response.statuses);
    }
    REQUIRE(statuses.size() == records.size());
    return statuses;
}

/// raw_store() to every serving member but `from` and those in `except` (e.g. stopped ones):
/// the statuses, indexed by member (empty for those not sent to).
template <class World>
std::vector<std::vector<dht::store_status>>
raw_store_everywhere(swarm<World>& s, std::size_t from, const std::vector<dht::record>& records,
                     const std::set<std::size_t>& except = {}, carrier by = carrier::store) {
    std::vector<std::vector<dht::store_status>> out(s.members.size());
    for (std::size_t i = 0; i < s.members.size(); ++i)
        if (i != from && !s.members[i].client && !except.contains(i))
            out[i] = raw_store(s, from, i, records, by);
    return out;
}

/// What member `i` stores (its cache aside) under `key` and `subkey`, if it is live.
template <class World>
std::optional<dht::stored_value> held(swarm<World>& s, std::size_t i, const byte_buffer& key,
                                      const byte_buffer& subkey) {
    const auto entry = s.members[i].dht->local_storage().get(dht::id::of_key(key), s.world.now());
    if (!entry) return std::nullopt;
    const auto it = entry->dictionary.find(subkey);
    if (it == entry->dictionary.end()) return std::nullopt;
    return it->second;
}

} // namespace hivemesh::test
