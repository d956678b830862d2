// Per-peer rate limiting (sans-I/O): a token bucket for each peer, with bounded memory.
//
// Each peer's bucket holds up to `burst` tokens and refills at `per_second` tokens per
// second; an unknown peer starts full. When max_tracked_peers peers are tracked, a new peer
// makes the limiter forget the least recently active one. That peer has had the longest
// time to refill, so it is the one most likely to be full already, and forgetting a full
// bucket changes nothing (it comes back full). An attacker could push its own bucket out
// only by being active under max_tracked_peers other identities, each of which gets a full
// burst anyway, so eviction grants no allowance that identities do not already grant.
#pragma once

#include "hivemesh/core/clock.hpp"
#include "hivemesh/core/error.hpp"
#include "hivemesh/crypto/peer_id.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <list>
#include <system_error>
#include <unordered_map>

namespace hivemesh::dht {

/// A token bucket per peer. Not thread-safe.
class rate_limiter {
public:
    /// Throws std::system_error(invalid_argument) unless `per_second` and `burst` are
    /// finite and non-negative and `max_tracked_peers` is at least 1.
    rate_limiter(double per_second, double burst, std::size_t max_tracked_peers = 4096)
        : per_second_(per_second)
        , burst_(burst)
        , max_tracked_peers_(max_tracked_peers) {
        if (!std::isfinite(per_second) || per_second < 0 || !std::isfinite(burst) || burst < 0 ||
            max_tracked_peers == 0)
            throw std::system_error(errc::invalid_argument,
                                    "hivemesh::dht::rate_limiter: bad rate, burst or capacity");
    }

    /// Takes `cost` tokens from `peer`'s bucket as of `now` and returns true, or returns
    /// false and takes nothing if the bucket holds fewer. A negative or non-finite cost
    /// is refused. A `now` earlier than the peer's last activity refills nothing (time
    /// is not assumed to be monotonic, but running back never grants tokens).
    bool allow(const crypto::peer_id& peer, time_point now, double cost = 1.0) {
        if (!std::isfinite(cost) || cost < 0) return false;
        auto it = buckets_.find(peer);
        if (it == buckets_.end()) {
            if (buckets_.size() >= max_tracked_peers_) {
                buckets_.erase(recency_.back());
                recency_.pop_back();
            }
            recency_.push_front(peer);
            try {
                it = buckets_.emplace(peer, bucket{burst_, now, recency_.begin()}).first;
            } catch (...) {
                recency_.pop_front();
                throw;
            }
        } else {
            refill(it->second, now);
            recency_.splice(recency_.begin(), recency_, it->second.position);
        }
        bucket& b = it->second;
        if (b.tokens < cost) return false;
        b.tokens -= cost;
        return true;
    }

    /// The tokens `peer` would have at `now` (burst for an untracked peer); changes nothing.
    double available(const crypto::peer_id& peer, time_point now) const {
        const auto it = buckets_.find(peer);
        if (it == buckets_.end()) return burst_;
        bucket b = it->second;
        refill(b, now);
        return b.tokens;
    }

    /// Peers currently tracked (at most max_tracked_peers()).
    std::size_t tracked_peers() const noexcept { return buckets_.size(); }
    std::size_t max_tracked_peers() const noexcept { return max_tracked_peers_; }
    double per_second() const noexcept { return per_second_; }
    double burst() const noexcept { return burst_; }

private:
    struct bucket {
        double tokens;
        time_point last; // latest time seen for this peer
        std::list<crypto::peer_id>::iterator position;
    };

    void refill(bucket& b, time_point now) const noexcept {
        if (now <= b.last) return;
        // Unsigned difference: exact for any now > last, where a signed one could overflow.
        const auto elapsed_ns = static_cast<std::uint64_t>(now.time_since_epoch().count()) -
                                static_cast<std::uint64_t>(b.last.time_since_epoch().count());
        const double gained = static_cast<double>(elapsed_ns) / 1e9 * per_second_;
        b.tokens = std::min(burst_, b.tokens + gained);
        b.last = now;
    }

    double per_second_;
    double burst_;
    std::size_t max_tracked_peers_;
    std::list<crypto::peer_id> recency_; // most recently active first
    std::unordered_map<crypto::peer_id, bucket> buckets_;
};

} // namespace hivemesh::dht
