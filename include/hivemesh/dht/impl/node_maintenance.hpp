// dht::node, maintenance: the periodic loop (expiry, refresh, re-bootstrap, republish) and
// the hand-off of keys to newly seen nodes (included by dht/node.hpp).
#pragma once

#include "hivemesh/dht/node.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/use_awaitable.hpp>

#include <cstddef>
#include <map>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

namespace hivemesh::dht {

template <net::transport Transport>
bool node<Transport>::among_replicas(const state_ptr& st, const dht::id& key,
                                     const dht::id& candidate) {
    const auto nearest = st->table.nearest(key, st->options.num_replicas);
    std::size_t closer_count = 0;
    for (const auto& c : nearest)
        if (c.id != candidate && closer(key, c.id, candidate)) ++closer_count;
    if (candidate != st->self && closer(key, st->self, candidate)) ++closer_count;
    return closer_count < st->options.num_replicas;
}

template <net::transport Transport>
void node<Transport>::hand_off(const state_ptr& st, const contact_type& newcomer) {
    if (!st->announce || st->storage.key_count() == 0) return;
    std::vector<record> records;
    st->storage.for_each(st->now(), [&](const dht::id& key, const key_entry& entry) {
        if (!among_replicas(st, key, newcomer.id)) return;
        for (const auto& c : st->table.nearest(key, 1, &newcomer.id))
            if (closer(key, c.id, st->self)) return; // someone else is nearer: theirs to do
        for (auto& r : detail::records_of(entry))
            records.push_back(std::move(r));
        ++st->stats.handoffs;
    });
    if (records.empty()) return;
    std::map<crypto::peer_id, outgoing_store> out;
    out[newcomer.peer].target = newcomer;
    for (std::size_t i = 0; i < records.size(); ++i)
        out[newcomer.peer].records.push_back(i);
    asio::co_spawn(st->executor, send_and_forget(st, std::move(out), std::move(records), false),
                   asio::detached);
}

template <net::transport Transport>
asio::awaitable<std::error_code> node<Transport>::republish(state_ptr st) {
    st->last_republish = st->now();
    std::vector<record> records;
    st->storage.for_each(st->now(), [&](const dht::id& key, const key_entry& entry) {
        if (!among_replicas(st, key, st->self)) return;
        ++st->stats.republished;
        for (auto& r : detail::records_of(entry))
            records.push_back(std::move(r));
    });
    if (!records.empty()) co_await store_records(st, std::move(records));
    co_return std::error_code{};
}

template <net::transport Transport>
asio::awaitable<void> node<Transport>::maintain(state_ptr st) {
    while (!st->closed) {
        st->maintenance_timer.expires_after(st->options.maintenance_period);
        // A cancelled wait means close(): the flag says so.
        co_await st->maintenance_timer.async_wait(
            asio::experimental::as_tuple(asio::use_awaitable));
        if (st->closed) co_return;
        const auto now = st->now();
        st->storage.remove_expired(now);
        st->cache.remove_expired(now);
        std::erase_if(st->blacklist, [&](const auto& entry) {
            return entry.second.until + st->options.blacklist_max < now;
        });
        std::erase_if(st->penalised, [&](const auto& entry) { return entry.second <= now; });
        ping_lost(st);
        if (!st->initial_peers.empty() &&
            (st->table.size() == 0 ||
             now - st->last_bootstrap >= st->options.rebootstrap_interval)) {
            co_await rebootstrap(st, st->table.size() == 0);
            continue;
        }
        co_await refresh(st, false);
        if (st->announce && now - st->last_republish >= st->options.republish_interval)
            co_await republish(st);
    }
}

} // namespace hivemesh::dht
