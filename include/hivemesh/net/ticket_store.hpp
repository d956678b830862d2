// The resumption tickets of a node (crypto/secure_channel.hpp): one per peer, each kept until
// it expires, found by peer when dialing and by id when accepting.
#pragma once

#include "hivemesh/core/clock.hpp"
#include "hivemesh/crypto/peer_id.hpp"
#include "hivemesh/crypto/secure_channel.hpp"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <optional>
#include <unordered_map>

namespace hivemesh::net::detail {

/// At most `capacity` tickets. Past it, a new ticket first drops the expired ones, then the
/// one that expires first. Not thread-safe (the node's executor owns it).
class ticket_store {
public:
    explicit ticket_store(std::size_t capacity)
        : capacity_(capacity) {}
    // A copy's index would point into the original; moving keeps the nodes.
    ticket_store(const ticket_store&) = delete;
    ticket_store& operator=(const ticket_store&) = delete;
    ticket_store(ticket_store&&) = default;
    ticket_store& operator=(ticket_store&&) = default;

    /// Keeps `ticket` for its remote peer from `now` for `lifetime`, in place of the peer's
    /// earlier one.
    void insert(const crypto::resumption_ticket& ticket, time_point now, duration lifetime) {
        if (capacity_ == 0) return;
        const crypto::peer_id peer = ticket.remote_key.id();
        erase(peer);
        if (by_peer_.size() >= capacity_) make_room(now);
        const auto placed = by_peer_.emplace(peer, entry{ticket, now + lifetime}).first;
        by_id_.emplace(ticket.id, &placed->first);
    }

    /// The ticket to offer when dialing `peer`, unless it has none that is valid at `now`.
    std::optional<crypto::resumption_ticket> for_peer(const crypto::peer_id& peer, time_point now) {
        const auto it = by_peer_.find(peer);
        if (it == by_peer_.end()) return std::nullopt;
        if (it->second.expires <= now) {
            erase(peer);
            return std::nullopt;
        }
        return it->second.ticket;
    }

    /// The ticket a dialer offered by `id`, unless none of that id is valid at `now`.
    std::optional<crypto::resumption_ticket> with_id(const crypto::ticket_id& id, time_point now) {
        const auto it = by_id_.find(id);
        if (it == by_id_.end()) return std::nullopt;
        const crypto::peer_id peer = *it->second; // for_peer may erase what it points to
        return for_peer(peer, now);
    }

    /// Forgets `peer`'s ticket, if any.
    void erase(const crypto::peer_id& peer) {
        const auto it = by_peer_.find(peer);
        if (it == by_peer_.end()) return;
        by_id_.erase(it->second.ticket.id);
        by_peer_.erase(it);
    }

    std::size_t size() const noexcept { return by_peer_.size(); }

private:
    struct entry {
        crypto::resumption_ticket ticket;
        time_point expires;
    };
    /// Ids are hash outputs, so any eight of their bytes are a good hash.
    struct id_hash {
        std::size_t operator()(const crypto::ticket_id& id) const noexcept {
            std::size_t h;
            std::memcpy(&h, id.data(), sizeof h);
            return h;
        }
    };

    /// Frees one place: a scan, but only when the store is full.
    void make_room(time_point now) {
        std::erase_if(by_peer_, [&](const auto& item) {
            if (item.second.expires > now) return false;
            by_id_.erase(item.second.ticket.id);
            return true;
        });
        if (by_peer_.size() < capacity_) return;
        const auto first =
            std::min_element(by_peer_.begin(), by_peer_.end(), [](const auto& a, const auto& b) {
                return a.second.expires < b.second.expires;
            });
        by_id_.erase(first->second.ticket.id);
        by_peer_.erase(first);
    }

    std::size_t capacity_;
    std::unordered_map<crypto::peer_id, entry> by_peer_;
    /// To the keys of by_peer_, whose nodes stay put until erased (with their index entry).
    std::unordered_map<crypto::ticket_id, const crypto::peer_id*, id_hash> by_id_;
};

} // namespace hivemesh::net::detail
