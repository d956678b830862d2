// A node's local DHT storage (sans-I/O): the values it holds for other peers, with
// hivemind's rules. Every value carries an absolute expiration; a store wins only with a
// strictly later expiration than what the slot holds, and expired items never block one.
//
// A key holds either one plain value or a dictionary of subkeys, each subkey with its own
// expiration. Switching kinds follows the same rule: a plain value replaces a dictionary
// only if it expires strictly later than the dictionary's latest live subkey, and a subkey
// replaces a plain value only if it expires strictly later than the plain value.
//
// No item may expire more than storage_limits::max_lifetime after the store that brings it.
//
// Accounting: each item (a plain value or one subkey) counts
//   key + subkey + value + signature + storage::item_overhead
// bytes. The key is counted once per item, so dictionaries are slightly overestimated.
// Validation (signatures, schemas) is the caller's job, before store().
#pragma once

#include "hivemesh/core/bytes.hpp"
#include "hivemesh/core/clock.hpp"
#include "hivemesh/dht/id.hpp"
#include "hivemesh/dht/record.hpp"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <unordered_map>
#include <utility>

namespace hivemesh::dht {

/// Limits of a storage. A record over a size limit is refused as too_large.
struct storage_limits {
    std::size_t max_key_size = 1024;
    std::size_t max_subkey_size = 1024;
    std::size_t max_value_size = 64 * 1024;
    std::size_t max_subkeys_per_key = 1024;
    std::size_t max_total_bytes = 256u << 20;
    /// How far ahead of now a stored record may expire; later is refused (too_far_ahead).
    /// A store wins only with a later expiration, so a far one would hold its slot and bytes
    /// that long: an unsigned one against every writer, a signed one (only its owner can
    /// write it) with nobody able to free it. The cap is a storage limit for every
    /// record, not a validator: it bounds what a node keeps, and validators neither know the
    /// time nor only see fresh stores. The swarm's records live 60 s at most by default
    /// (progress, state donors; a matchmaking window is 15 s): 5 min leaves room for longer
    /// settings and clock skew.
    duration max_lifetime = std::chrono::minutes(5);
};

/// True if `expiration` is more than `max_lifetime` after `now` (exact for any values: no
/// overflow; a negative max_lifetime counts as zero).
inline bool too_far_ahead(time_point expiration, time_point now, duration max_lifetime) noexcept {
    if (expiration <= now) return false;
    // The true difference is in (0, 2^64), so the unsigned one is exact.
    const auto ahead = static_cast<std::uint64_t>(expiration.time_since_epoch().count()) -
                       static_cast<std::uint64_t>(now.time_since_epoch().count());
    return ahead > static_cast<std::uint64_t>(std::max(max_lifetime, duration::zero()).count());
}

/// Longest signature a record may carry (an Ed25519 signature is 64 bytes).
inline constexpr std::size_t max_signature_size = 128;

/// Values stored by this node, indexed by key id. Not thread-safe.
class storage {
public:
    /// Bookkeeping charged per item on top of its bytes: an estimate of the map node,
    /// expiration and buffer headers, so that many tiny items cannot exhaust memory while
    /// the byte count stays low.
    static constexpr std::size_t item_overhead = 128;

    explicit storage(storage_limits limits = {})
        : limits_(limits) {}

    /// The bytes `r` is charged while stored (see the file comment).
    static std::size_t accounted_size(const record& r) noexcept {
        return item_size(r.key, r.subkey ? r.subkey->size() : 0, r.value.size(),
                         r.signature.size());
    }

    /// Stores `r` as of `now`. Checks, in this order: too_large (key, subkey, value or
    /// signature over its limit), expired (`r.expiration <= now`), too_far_ahead
    /// (`r.expiration` more than max_lifetime after `now`), outdated (the slot
    /// holds an equal or later live expiration; for a kind switch, see the file comment),
    /// too_many_subkeys (a new subkey in a full dictionary), storage_full (the total would
    /// exceed max_total_bytes even after purging expired items). Returns stored otherwise,
    /// and also, changing nothing, when the slot holds this very record (value, expiration
    /// and signature): a store sent again, say after its answer was lost, succeeds again.
    /// Refusals leave live items untouched (expired ones may be purged).
    store_status store(const record& r, time_point now) {
        if (r.key.size() > limits_.max_key_size || r.value.size() > limits_.max_value_size ||
            r.signature.size() > max_signature_size ||
            (r.subkey && r.subkey->size() > limits_.max_subkey_size))
            return store_status::too_large;
        if (r.expiration <= now) return store_status::expired;
        if (too_far_ahead(r.expiration, now, limits_.max_lifetime))
            return store_status::too_far_ahead;

        const dht::id key_id = r.key_id();
        auto it = entries_.find(key_id);
        if (it != entries_.end()) {
            purge(it->second, now);
            if (it->second.empty()) {
                entries_.erase(it);
                it = entries_.end();
            }
        }

        const auto holds_this = [&](const stored_value& v) {
            return v.expiration == r.expiration && v.value == r.value && v.signature == r.signature;
        };
        // Bytes the store releases: the whole entry for a plain value, else the one slot.
        std::size_t freed = 0;
        if (!r.subkey) {
            if (it != entries_.end()) {
                if (it->second.plain && holds_this(*it->second.plain)) return store_status::stored;
                if (r.expiration <= it->second.expiration()) return store_status::outdated;
                freed = entry_size(it->second);
            }
        } else {
            // Subkeys the dictionary keeps besides this one (none if a plain value goes).
            std::size_t others = 0;
            if (it != entries_.end()) {
                const key_entry& entry = it->second;
                if (entry.plain) {
                    if (r.expiration <= entry.plain->expiration) return store_status::outdated;
                    freed = stored_size(entry.key, 0, *entry.plain);
                } else if (auto slot = entry.dictionary.find(*r.subkey);
                           slot != entry.dictionary.end()) {
                    if (holds_this(slot->second)) return store_status::stored;
                    if (r.expiration <= slot->second.expiration) return store_status::outdated;
                    freed = stored_size(entry.key, slot->first.size(), slot->second);
                    others = entry.dictionary.size() - 1;
                } else {
                    others = entry.dictionary.size();
                }
            }
            if (others >= limits_.max_subkeys_per_key) return store_status::too_many_subkeys;
        }

        const std::size_t added = accounted_size(r);
        if (!fits(added, freed)) {
            // Our entry holds only live items now, so this purge cannot erase it (and
            // erasing other elements does not invalidate `it`).
            remove_expired(now);
            if (!fits(added, freed)) return store_status::storage_full;
        }

        // Copy first: if an allocation throws, nothing has changed.
        stored_value value{r.value, r.expiration, r.signature};
        if (it == entries_.end()) {
            key_entry entry;
            entry.key = r.key;
            if (r.subkey)
                entry.dictionary.emplace(*r.subkey, std::move(value));
            else
                entry.plain = std::move(value);
            entries_.emplace(key_id, std::move(entry));
        } else if (!r.subkey) {
            it->second.dictionary.clear();
            it->second.plain = std::move(value);
        } else {
            auto slot = it->second.dictionary.try_emplace(*r.subkey).first;
            it->second.plain.reset();
            slot->second = std::move(value);
        }
        bytes_used_ = bytes_used_ - freed + added;
        earliest_expiration_ = std::min(earliest_expiration_, r.expiration);
        return store_status::stored;
    }

    /// A copy of what is stored under `key` without expired items; nullopt if nothing live.
    std::optional<key_entry> get(const dht::id& key, time_point now) const {
        const auto it = entries_.find(key);
        if (it == entries_.end()) return std::nullopt;
        key_entry live = live_copy(it->second, now);
        if (live.empty()) return std::nullopt;
        return live;
    }

    /// True if a live item is stored under `key`.
    bool contains(const dht::id& key, time_point now) const {
        const auto it = entries_.find(key);
        return it != entries_.end() && has_live(it->second, now);
    }

    /// Removes every item with `expiration <= now` and keys left empty; returns the number
    /// of items removed. O(items), but O(1) while no stored expiration can have passed.
    std::size_t remove_expired(time_point now) {
        if (earliest_expiration_ > now) return 0;
        std::size_t removed = 0;
        time_point earliest = time_point::max();
        for (auto it = entries_.begin(); it != entries_.end();) {
            removed += purge(it->second, now);
            if (it->second.empty()) {
                it = entries_.erase(it);
                continue;
            }
            if (it->second.plain) earliest = std::min(earliest, it->second.plain->expiration);
            for (const auto& [subkey, value] : it->second.dictionary)
                earliest = std::min(earliest, value.expiration);
            ++it;
        }
        earliest_expiration_ = earliest;
        return removed;
    }

    /// Removes everything stored under `key`; false if nothing was.
    bool erase(const dht::id& key) {
        const auto it = entries_.find(key);
        if (it == entries_.end()) return false;
        bytes_used_ -= entry_size(it->second);
        entries_.erase(it);
        return true;
    }

    /// Calls `f(const dht::id&, const key_entry&)` for every key with a live item, passing
    /// only its live items, in unspecified order. `f` must not modify this storage.
    template <class F>
    void for_each(time_point now, F&& f) const {
        for (const auto& [key, entry] : entries_) {
            if (!has_expired(entry, now)) {
                f(key, entry);
            } else if (key_entry live = live_copy(entry, now); !live.empty()) {
                f(key, std::as_const(live));
            }
        }
    }

    /// Keys held, including keys whose items expired but were not purged yet.
    std::size_t key_count() const noexcept { return entries_.size(); }
    /// Bytes charged for every held item (see the file comment); O(1).
    std::size_t bytes_used() const noexcept { return bytes_used_; }
    const storage_limits& limits() const noexcept { return limits_; }

private:
    static std::size_t item_size(const byte_buffer& key, std::size_t subkey_size,
                                 std::size_t value_size, std::size_t signature_size) noexcept {
        return key.size() + subkey_size + value_size + signature_size + item_overhead;
    }
    static std::size_t stored_size(const byte_buffer& key, std::size_t subkey_size,
                                   const stored_value& v) noexcept {
        return item_size(key, subkey_size, v.value.size(), v.signature.size());
    }
    static std::size_t entry_size(const key_entry& entry) noexcept {
        std::size_t total = entry.plain ? stored_size(entry.key, 0, *entry.plain) : 0;
        for (const auto& [subkey, value] : entry.dictionary)
            total += stored_size(entry.key, subkey.size(), value);
        return total;
    }

    static bool live(const stored_value& v, time_point now) noexcept { return v.expiration > now; }
    static bool has_live(const key_entry& entry, time_point now) noexcept {
        if (entry.plain) return live(*entry.plain, now);
        return std::any_of(entry.dictionary.begin(), entry.dictionary.end(),
                           [&](const auto& item) { return live(item.second, now); });
    }
    static bool has_expired(const key_entry& entry, time_point now) noexcept {
        if (entry.plain) return !live(*entry.plain, now);
        return std::any_of(entry.dictionary.begin(), entry.dictionary.end(),
                           [&](const auto& item) { return !live(item.second, now); });
    }
    static key_entry live_copy(const key_entry& entry, time_point now) {
        key_entry out;
        out.key = entry.key;
        if (entry.plain && live(*entry.plain, now)) out.plain = entry.plain;
        for (const auto& [subkey, value] : entry.dictionary)
            if (live(value, now)) out.dictionary.emplace_hint(out.dictionary.end(), subkey, value);
        return out;
    }

    // Removes the expired items of one entry (which may be left empty); returns how many.
    std::size_t purge(key_entry& entry, time_point now) noexcept {
        std::size_t removed = 0;
        if (entry.plain && !live(*entry.plain, now)) {
            bytes_used_ -= stored_size(entry.key, 0, *entry.plain);
            entry.plain.reset();
            ++removed;
        }
        for (auto it = entry.dictionary.begin(); it != entry.dictionary.end();) {
            if (live(it->second, now)) {
                ++it;
                continue;
            }
            bytes_used_ -= stored_size(entry.key, it->first.size(), it->second);
            it = entry.dictionary.erase(it);
            ++removed;
        }
        return removed;
    }

    // True if replacing `freed` bytes with `added` stays within max_total_bytes.
    bool fits(std::size_t added, std::size_t freed) const noexcept {
        return added <= limits_.max_total_bytes &&
               bytes_used_ - freed <= limits_.max_total_bytes - added;
    }

    storage_limits limits_;
    std::unordered_map<dht::id, key_entry> entries_;
    std::size_t bytes_used_ = 0;
    // A lower bound on every stored expiration: remove_expired() skips its scan before it.
    time_point earliest_expiration_ = time_point::max();
};

} // namespace hivemesh::dht
