// dht::node, peer bookkeeping: one request to one peer, and what its outcome does to the
// routing table and the blacklist (included by dht/node.hpp).
#pragma once

#include "hivemesh/dht/node.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

namespace hivemesh::dht {

template <net::transport Transport>
auto node<Transport>::to_peer(const contact_type& c) -> peer {
    return peer{c.peer, c.endpoint, c.key};
}

template <net::transport Transport>
sender_info node<Transport>::sender(const state_ptr& st) {
    if (!st->announce) return {};
    return {Transport::to_address(*st->announce)};
}

template <net::transport Transport>
bool node<Transport>::blacklisted(const state_ptr& st, const dht::id& node) {
    const auto it = st->blacklist.find(node);
    return it != st->blacklist.end() && it->second.until > st->now();
}

template <net::transport Transport>
void node<Transport>::note_alive(const state_ptr& st, const contact_type& c) {
    st->blacklist.erase(c.id);
    if (!st->lost.empty())
        std::erase_if(st->lost, [&](const auto& entry) { return entry.first.id == c.id; });
    const auto outcome = st->table.on_seen(c, st->now());
    if (outcome.ping_candidate && !st->pinging.contains(outcome.ping_candidate->id)) {
        st->pinging.insert(outcome.ping_candidate->id);
        asio::co_spawn(st->executor, check_alive(st, *outcome.ping_candidate), asio::detached);
    }
    if (outcome.result == routing_table<endpoint_type>::seen_result::added) hand_off(st, c);
}

template <net::transport Transport>
void node<Transport>::note_failure(const state_ptr& st, const contact_type& c) {
    if (st->table.on_failure(c.id) && st->options.max_lost_contacts > 0) {
        if (st->lost.size() >= st->options.max_lost_contacts) st->lost.pop_front();
        st->lost.emplace_back(c, st->now());
    }
    auto& entry = st->blacklist[c.id];
    entry.failures = std::min(entry.failures + 1, 30u);
    auto backoff = st->options.blacklist_base * (std::int64_t{1} << (entry.failures - 1));
    entry.until = st->now() + std::min(backoff, st->options.blacklist_max);
}

template <net::transport Transport>
void node<Transport>::ping_lost(const state_ptr& st) {
    const auto now = st->now();
    std::erase_if(st->lost, [&](const auto& entry) {
        return entry.second + st->options.lost_contact_memory <= now;
    });
    for (std::size_t n = 0; n < st->options.lost_contact_pings && n < st->lost.size(); ++n) {
        // In turn: the pinged contact goes to the back until it answers (note_alive).
        auto entry = st->lost.front();
        st->lost.pop_front();
        st->lost.push_back(entry);
        asio::co_spawn(st->executor,
                       call(st, entry.first, "dht.ping", encode(ping_request{sender(st)})),
                       asio::detached);
    }
}

template <net::transport Transport>
asio::awaitable<void> node<Transport>::check_alive(state_ptr st, contact_type c) {
    // A named body: g++ 12 destroys temporaries inside a co_await expression twice.
    auto body = encode(ping_request{sender(st)});
    co_await call(st, c, "dht.ping", std::move(body));
    st->pinging.erase(c.id);
}

template <net::transport Transport>
asio::awaitable<net::call_result> node<Transport>::call(state_ptr st, contact_type c,
                                                        std::string method, byte_buffer body) {
    if (st->closed) co_return net::call_result{errc::cancelled, {}};
    ++st->stats.requests_sent;
    auto [ec, response] = co_await st->rpc->async_call(
        to_peer(c), std::move(method), std::move(body), st->options.request_timeout);
    if (st->closed) co_return net::call_result{errc::cancelled, {}};
    if (ec) {
        ++st->stats.requests_failed;
        // Out of descriptors, we could not even try: the peer is not to blame.
        if (!net::out_of_descriptors(ec)) note_failure(st, c);
    } else {
        if (!c.key) c.key = st->rpc->key_of(c.peer); // proven by the connection it took
        note_alive(st, c);
    }
    co_return net::call_result{ec, std::move(response)};
}

} // namespace hivemesh::dht
