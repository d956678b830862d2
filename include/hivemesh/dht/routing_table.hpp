// The Kademlia routing table: k-buckets over the 160-bit id space, sans I/O.
//
// Buckets are prefixes of the id space kept in a vector sorted by prefix, so they partition
// the space in order and the bucket of an id is found by binary search. A full bucket splits
// when it covers our own id or its depth is not a multiple of `b` (hivemind's variant, which
// keeps more contacts far from us than plain Kademlia); otherwise newcomers wait in a
// replacement cache while the node pings the bucket's least-recently-seen contact.
#pragma once

#include "hivemesh/core/clock.hpp"
#include "hivemesh/core/random.hpp"
#include "hivemesh/crypto/identity.hpp"
#include "hivemesh/crypto/peer_id.hpp"
#include "hivemesh/dht/id.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <utility>
#include <vector>

namespace hivemesh::dht {

/// A node we can call. `id` is always id::of_peer(peer); the table only ever reads `id`.
template <class Endpoint>
struct contact {
    dht::id id;
    crypto::peer_id peer;
    Endpoint endpoint;
    /// The peer's public key (it proves `peer`), when known: requests to it may then go by
    /// datagram (net::datagram_options).
    std::optional<crypto::public_key> key = std::nullopt;

    /// Deleted (by the language) when Endpoint has no ==.
    friend bool operator==(const contact&, const contact&) = default;
};

/// Parameters of a routing table.
struct routing_options {
    std::size_t k = 20;                      ///< contacts per bucket
    std::size_t b = 5;                       ///< buckets off our path split down to depth % b == 0
    std::size_t replacement_cache_size = 20; ///< waiting contacts per bucket (newest kept)
    std::size_t max_failures = 3;            ///< failed requests before removal (0 acts as 1)
};

/// Kademlia k-buckets with replacement caches. Not thread-safe; pointers returned by find()
/// are invalidated by any non-const call.
template <class Endpoint>
class routing_table {
public:
    using contact_type = contact<Endpoint>;

    enum class seen_result {
        added,   ///< new contact stored in its bucket
        updated, ///< known contact refreshed (endpoint, recency, failures reset)
        cached,  ///< bucket full: kept in the replacement cache (unless its size is 0)
        self,    ///< our own id: nothing stored
    };
    struct seen_outcome {
        seen_result result;
        /// With `cached`: the bucket's least-recently-seen contact. Ping it and call
        /// on_failure() if it does not answer, so a live newcomer can take its place.
        std::optional<contact_type> ping_candidate;
    };

    /// A read-only summary of one bucket, for refresh logic, metrics and tests.
    struct bucket_info {
        dht::id prefix;           ///< first `depth` bits are the bucket's prefix, the rest 0
        std::size_t depth;        ///< prefix length in bits
        std::size_t size;         ///< contacts in the bucket
        std::size_t replacements; ///< contacts in its replacement cache
        time_point last_activity; ///< last contact seen in it or lookup of it (mark_refreshed)
    };

    /// An empty table (one bucket covering everything) for the node `self`.
    /// Throws std::invalid_argument if k == 0, b == 0 or b > 160.
    explicit routing_table(dht::id self, routing_options options = {})
        : self_(self)
        , options_(options) {
        if (options_.k == 0) throw std::invalid_argument("routing_table: k must be positive");
        if (options_.b == 0 || options_.b > dht::id::bits)
            throw std::invalid_argument("routing_table: b must be in [1, 160]");
        if (options_.max_failures == 0) options_.max_failures = 1;
        buckets_.emplace_back();
    }

    const dht::id& self() const noexcept { return self_; }
    const routing_options& options() const noexcept { return options_; }

    /// Records that `c` answered or sent us something at `now` (see seen_result).
    seen_outcome on_seen(const contact_type& c, time_point now) {
        if (c.id == self_) return {seen_result::self, std::nullopt};
        for (;;) {
            const std::size_t index = bucket_index(c.id);
            bucket& target = buckets_[index];
            if (auto it = find_entry(target.contacts, c.id); it != target.contacts.end()) {
                const auto known_key = it->contact.key;
                it->contact = c;
                if (!c.key) it->contact.key = known_key; // news without a key forget none
                it->failures = 0;
                std::rotate(it, it + 1, target.contacts.end()); // most recent last
                target.last_activity = now;
                return {seen_result::updated, std::nullopt};
            }
            if (target.contacts.size() < options_.k) {
                erase_replacement(target, c.id); // a waiting contact moves up
                target.contacts.push_back(entry{c, 0});
                ++size_;
                target.last_activity = now;
                return {seen_result::added, std::nullopt};
            }
            if (can_split(target)) {
                split(index); // then retry: the half holding c may be full again
                continue;
            }
            target.last_activity = now;
            erase_replacement(target, c.id);
            if (options_.replacement_cache_size > 0) {
                if (target.replacements.size() >= options_.replacement_cache_size)
                    target.replacements.erase(target.replacements.begin()); // oldest goes
                target.replacements.push_back(c);
            }
            return {seen_result::cached, target.contacts.front().contact};
        }
    }

    /// A request to `node` failed. A bucket contact is removed (and replaced by the newest
    /// cached contact) once its consecutive failures reach max_failures; a cached contact is
    /// dropped at once. Returns true if `node` was removed; false if it stays or is unknown.
    bool on_failure(const dht::id& node) {
        bucket& target = buckets_[bucket_index(node)];
        if (auto it = find_entry(target.contacts, node); it != target.contacts.end()) {
            if (++it->failures < options_.max_failures) return false;
            erase_contact(target, it);
            return true;
        }
        return erase_replacement(target, node);
    }

    /// Removes `node` at once from its bucket (promoting the newest cached contact) or from
    /// a replacement cache. Returns false if it was unknown.
    bool remove(const dht::id& node) {
        bucket& target = buckets_[bucket_index(node)];
        if (auto it = find_entry(target.contacts, node); it != target.contacts.end()) {
            erase_contact(target, it);
            return true;
        }
        return erase_replacement(target, node);
    }

    /// The bucket contact with id `node`, or nullptr (replacement caches are not searched).
    const contact_type* find(const dht::id& node) const {
        const bucket& target = buckets_[bucket_index(node)];
        const auto it = find_entry(target.contacts, node);
        return it == target.contacts.end() ? nullptr : &it->contact;
    }

    /// Up to `count` bucket contacts nearest to `target` by XOR distance, nearest first,
    /// skipping `*exclude` if given. Exact: equal to sorting all contacts by distance.
    std::vector<contact_type> nearest(const dht::id& target, std::size_t count,
                                      const dht::id* exclude = nullptr) const {
        std::vector<contact_type> out;
        if (count == 0 || size_ == 0) return out;
        // The last bucket visited may overshoot `count` by less than k before trimming.
        out.reserve(std::min(size_, std::min(count, size_) + options_.k));
        collect_nearest(target, count, exclude, 0, buckets_.size(), 0, out);
        return out;
    }

    /// Contacts in buckets (replacement caches not counted).
    std::size_t size() const noexcept { return size_; }
    std::size_t bucket_count() const noexcept { return buckets_.size(); }

    /// One random id inside each bucket with no activity (contact seen, mark_refreshed) for
    /// at least `interval` before `now`, in bucket order. Look each up, then mark_refreshed.
    std::vector<dht::id> refresh_targets(time_point now, duration interval,
                                         random_generator& rng) const {
        std::vector<dht::id> out;
        for (const bucket& b : buckets_)
            if (now - b.last_activity >= interval)
                out.push_back(dht::id::random_with_prefix(b.prefix, b.depth, rng));
        return out;
    }

    /// The bucket covering `target` was just looked up.
    void mark_refreshed(const dht::id& target, time_point now) {
        buckets_[bucket_index(target)].last_activity = now;
    }

    /// Calls f(const contact_type&) for every bucket contact, buckets in id order,
    /// least-recently-seen first within a bucket.
    template <class F>
    void for_each(F&& f) const {
        for (const bucket& b : buckets_)
            for (const entry& e : b.contacts)
                f(e.contact);
    }

    /// A summary of every bucket, in id order.
    std::vector<bucket_info> buckets() const {
        std::vector<bucket_info> out;
        out.reserve(buckets_.size());
        for (const bucket& b : buckets_)
            out.push_back(
                {b.prefix, b.depth, b.contacts.size(), b.replacements.size(), b.last_activity});
        return out;
    }

private:
    struct entry {
        contact_type contact;
        std::uint32_t failures; // consecutive, reset when seen
    };
    struct bucket {
        dht::id prefix; // bits past `depth` are 0, so buckets sort by prefix
        std::size_t depth = 0;
        time_point last_activity{};
        std::vector<entry> contacts;            // least-recently-seen first
        std::vector<contact_type> replacements; // oldest first
    };

    static auto find_entry(const std::vector<entry>& contacts, const dht::id& node) {
        return std::find_if(contacts.begin(), contacts.end(),
                            [&](const entry& e) { return e.contact.id == node; });
    }
    static auto find_entry(std::vector<entry>& contacts, const dht::id& node) {
        return std::find_if(contacts.begin(), contacts.end(),
                            [&](const entry& e) { return e.contact.id == node; });
    }

    // The last bucket whose prefix is <= node; never fails since the first prefix is 0.
    std::size_t bucket_index(const dht::id& node) const noexcept {
        const auto it = std::upper_bound(
            buckets_.begin(), buckets_.end(), node,
            [](const dht::id& value, const bucket& b) { return value < b.prefix; });
        return static_cast<std::size_t>(it - buckets_.begin()) - 1;
    }

    bool covers(const bucket& b, const dht::id& node) const noexcept {
        return common_prefix_length(b.prefix, node) >= b.depth;
    }

    bool can_split(const bucket& b) const noexcept {
        return b.depth < dht::id::bits && (covers(b, self_) || b.depth % options_.b != 0);
    }

    bool erase_replacement(bucket& b, const dht::id& node) {
        const auto it = std::find_if(b.replacements.begin(), b.replacements.end(),
                                     [&](const contact_type& c) { return c.id == node; });
        if (it == b.replacements.end()) return false;
        b.replacements.erase(it);
        return true;
    }

    void erase_contact(bucket& b, typename std::vector<entry>::iterator it) {
        b.contacts.erase(it);
        --size_;
        promote(b);
    }

    // Moves the newest cached contacts into free slots: they are the likeliest to be alive.
    void promote(bucket& b) {
        while (b.contacts.size() < options_.k && !b.replacements.empty()) {
            b.contacts.push_back(entry{std::move(b.replacements.back()), 0});
            b.replacements.pop_back();
            ++size_;
        }
    }

    // Replaces buckets_[index] by its two halves, keeping each list's order.
    void split(std::size_t index) {
        bucket& parent = buckets_[index];
        const std::size_t depth = parent.depth;
        bucket low, high;
        low.prefix = high.prefix = parent.prefix;
        high.prefix.set_bit(depth, true);
        low.depth = high.depth = depth + 1;
        low.last_activity = high.last_activity = parent.last_activity;
        for (entry& e : parent.contacts)
            (e.contact.id.bit(depth) ? high : low).contacts.push_back(std::move(e));
        for (contact_type& c : parent.replacements)
            (c.id.bit(depth) ? high : low).replacements.push_back(std::move(c));
        size_ -= parent.contacts.size();
        size_ += low.contacts.size() + high.contacts.size();
        promote(low);
        promote(high);
        buckets_[index] = std::move(low);
        buckets_.insert(buckets_.begin() + static_cast<std::ptrdiff_t>(index) + 1, std::move(high));
    }

    // Visits buckets [lo, hi), which share their first `depth` bits, in XOR order from
    // `target`: disjoint prefixes are wholly ordered by distance, so once `count` contacts
    // are collected every later bucket is farther and the walk stops.
    void collect_nearest(const dht::id& target, std::size_t count, const dht::id* exclude,
                         std::size_t lo, std::size_t hi, std::size_t depth,
                         std::vector<contact_type>& out) const {
        if (out.size() >= count) return;
        if (hi - lo == 1) {
            const auto first = static_cast<std::ptrdiff_t>(out.size());
            for (const entry& e : buckets_[lo].contacts)
                if (exclude == nullptr || e.contact.id != *exclude) out.push_back(e.contact);
            const auto by_distance = [&](const contact_type& a, const contact_type& b) {
                return closer(target, a.id, b.id);
            };
            if (out.size() > count) {
                const auto last = out.begin() + static_cast<std::ptrdiff_t>(count);
                std::partial_sort(out.begin() + first, last, out.end(), by_distance);
                out.erase(last, out.end());
            } else {
                std::sort(out.begin() + first, out.end(), by_distance);
            }
            return;
        }
        // More than one bucket: they split at bit `depth`; zeros sort first.
        const auto begin = buckets_.begin();
        const auto mid = static_cast<std::size_t>(
            std::partition_point(begin + static_cast<std::ptrdiff_t>(lo),
                                 begin + static_cast<std::ptrdiff_t>(hi),
                                 [depth](const bucket& b) { return !b.prefix.bit(depth); }) -
            begin);
        if (target.bit(depth)) {
            collect_nearest(target, count, exclude, mid, hi, depth + 1, out);
            collect_nearest(target, count, exclude, lo, mid, depth + 1, out);
        } else {
            collect_nearest(target, count, exclude, lo, mid, depth + 1, out);
            collect_nearest(target, count, exclude, mid, hi, depth + 1, out);
        }
    }

    dht::id self_;
    routing_options options_;
    std::vector<bucket> buckets_; // sorted by prefix; together they cover the whole space
    std::size_t size_ = 0;
};

} // namespace hivemesh::dht
