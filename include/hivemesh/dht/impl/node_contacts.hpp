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
    return peer{c.peer, c.endpoint};
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
    const auto outcome = st->table.on_seen(c, st->now());
    if (outcome.ping_candidate && !st->pinging.contains(outcome.ping_candidate->id)) {
        st->pinging.insert(outcome.ping_candidate->id);
        asio::co_spawn(st->executor, check_alive(st, *outcome.ping_candidate), asio::detached);
    }
    if (outcome.result == routing_table<endpoint_type>::seen_result::added) hand_off(st, c);
}

template <net::transport Transport>
void node<Transport>::note_failure(const state_ptr& st, const dht::id& node) {
    st->table.on_failure(node);
    auto& entry = st->blacklist[node];
    entry.failures = std::min(entry.failures + 1, 30u);
    auto backoff = st->options.blacklist_base * (std::int64_t{1} << (entry.failures - 1));
    entry.until = st->now() + std::min(backoff, st->options.blacklist_max);
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
        note_failure(st, c.id);
    } else {
        note_alive(st, c);
    }
    co_return net::call_result{ec, std::move(response)};
}

} // namespace hivemesh::dht
