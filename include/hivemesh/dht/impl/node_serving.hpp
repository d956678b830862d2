// dht::node, serving: the dht.ping, dht.store and dht.find handlers, with admission, rate
// limiting and penalties for malformed requests (included by dht/node.hpp).
#pragma once

#include "hivemesh/dht/node.hpp"

#include <algorithm>
#include <cstddef>
#include <memory>
#include <optional>
#include <system_error>
#include <utility>

namespace hivemesh::dht {

template <net::transport Transport>
void node<Transport>::register_handlers(const state_ptr& st) {
    // Handlers hold the state weakly: the RPC node may outlive this node.
    const auto add = [&](const char* method, serve_function serve) {
        // Each may come by datagram: a request repeated or replayed does no harm (a store
        // of a record already held is answered `stored` again).
        st->rpc->add_handler(method,
                             [weak = std::weak_ptr<state>(st),
                              serve](const net::call_context& context, byte_view request,
                                     byte_buffer& response) -> asio::awaitable<std::error_code> {
                                 co_return serve(weak.lock(), context, request, response);
                             },
                             {.datagrams = true});
    };
    add("dht.ping", &serve_ping);
    add("dht.store", &serve_store);
    add("dht.find", &serve_find);
}

template <net::transport Transport>
std::error_code node<Transport>::admit(const state_ptr& st, const net::call_context& context,
                                       double cost) {
    if (!st || st->closed) return errc::refused;
    const auto now = st->now();
    const auto it = st->penalised.find(context.remote);
    if ((it != st->penalised.end() && it->second > now) ||
        !st->limiter.allow(context.remote, now, cost)) {
        ++st->stats.requests_refused;
        ++st->stats.requests_rate_limited;
        return errc::rate_limited;
    }
    return {};
}

template <net::transport Transport>
std::error_code node<Transport>::penalise(const state_ptr& st, const net::call_context& context,
                                          std::error_code ec) {
    ++st->stats.requests_refused;
    ++st->stats.requests_malformed;
    st->penalised[context.remote] = st->now() + st->options.penalty;
    st->table.remove(dht::id::of_peer(context.remote));
    log::warning("dht", "refused a request from ", context.remote.short_string(), ": ",
                 ec.message());
    return ec;
}

template <net::transport Transport>
template <class Request>
std::error_code node<Transport>::take_request(const state_ptr& st, const net::call_context& context,
                                              byte_view request, Request& out) {
    if (auto ec = admit(st, context, 1)) return ec;
    if (auto ec = decode(request, out, st->options.messages)) return penalise(st, context, ec);
    // Items to store cost one more each; the request counts as served once they are allowed.
    if constexpr (requires { out.items; })
        if (auto ec = admit(st, context, static_cast<double>(out.items.size()))) return ec;
    ++st->stats.requests_served;
    return {};
}

template <net::transport Transport>
void node<Transport>::note_sender(const state_ptr& st, const net::call_context& context,
                                  const sender_info& from) {
    if (!from.listen) return;
    const auto endpoint = Transport::to_endpoint(*from.listen);
    if (!endpoint) return;
    note_alive(st, contact_type{dht::id::of_peer(context.remote), context.remote, *endpoint,
                                context.remote_key});
}

template <net::transport Transport>
std::error_code node<Transport>::serve_ping(const state_ptr& st, const net::call_context& context,
                                            byte_view request, byte_buffer& response) {
    ping_request ping;
    if (auto ec = take_request(st, context, request, ping)) return ec;
    note_sender(st, context, ping.from);
    response = encode(ping_response{});
    return {};
}

template <net::transport Transport>
std::error_code node<Transport>::serve_store(const state_ptr& st, const net::call_context& context,
                                             byte_view request, byte_buffer& response) {
    store_request store;
    if (auto ec = take_request(st, context, request, store)) return ec;
    note_sender(st, context, store.from);
    response = encode(store_response{store_items(st, store.items)});
    return {};
}

template <net::transport Transport>
std::vector<store_status> node<Transport>::store_items(const state_ptr& st,
                                                       const std::vector<store_item>& items) {
    std::vector<store_status> statuses;
    statuses.reserve(items.size());
    const auto now = st->now();
    for (const auto& item : items) {
        if (st->validators.validate(item.item)) {
            statuses.push_back(store_status::invalid);
            continue;
        }
        auto& target = item.in_cache ? st->cache : st->storage;
        statuses.push_back(target.store(item.item, now));
    }
    return statuses;
}

template <net::transport Transport>
std::error_code node<Transport>::serve_find(const state_ptr& st, const net::call_context& context,
                                            byte_view request, byte_buffer& response) {
    find_request find;
    if (auto ec = take_request(st, context, request, find)) return ec;
    note_sender(st, context, find.from);
    const auto requester = dht::id::of_peer(context.remote);
    const auto count = std::min<std::size_t>(
        {find.max_peers, st->options.routing.k, st->options.messages.max_peers});
    find_response reply;
    reply.results.reserve(find.keys.size());
    const auto now = st->now();
    // The entries are read before the items are stored, so a carried record does not
    // travel back to its sender.
    for (const auto& key : find.keys) {
        find_result result;
        if (find.want_values) result.entry = local_entry(st, key, now);
        for (const auto& c : st->table.nearest(key, count, &requester))
            result.nearest.push_back({c.peer, Transport::to_address(c.endpoint), c.key});
        reply.results.push_back(std::move(result));
    }
    reply.statuses = store_items(st, find.items);
    response = encode(reply);
    return {};
}

template <net::transport Transport>
std::optional<key_entry> node<Transport>::local_entry(const state_ptr& st, const dht::id& key,
                                                      time_point now) {
    auto entry = st->storage.get(key, now);
    if (auto cached = st->cache.get(key, now)) detail::merge_entry(entry, *cached);
    return entry;
}

} // namespace hivemesh::dht
