// dht::node, operations: closing, the blocking forms, and bootstrap, refresh, find_nearest,
// store and get as coroutines over lookups, behind the public async_ forms (included by
// dht/node.hpp).
#pragma once

#include "hivemesh/dht/node.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>

#include <algorithm>
#include <cstddef>
#include <map>
#include <memory>
#include <optional>
#include <system_error>
#include <utility>
#include <vector>

namespace hivemesh::dht {

template <net::transport Transport>
node<Transport>::~node() {
    close();
}

template <net::transport Transport>
void node<Transport>::close() {
    auto st = state_;
    if (!st || st->closed) return;
    st->closed = true;
    asio::post(st->executor, [st] { st->maintenance_timer.cancel(); });
}

template <net::transport Transport>
void node<Transport>::add_validator(std::shared_ptr<const record_validator> validator) {
    state_->validators.add(std::move(validator));
}

// ---- blocking forms ----------------------------------------------------------------------

template <net::transport Transport>
void node<Transport>::bootstrap(std::vector<peer> initial) {
    block(async_bootstrap(std::move(initial), asio::use_future));
}

template <net::transport Transport>
std::vector<store_outcome> node<Transport>::store_many(std::vector<record> records) {
    return block(async_store_many(std::move(records), asio::use_future));
}

template <net::transport Transport>
store_outcome node<Transport>::store(byte_view key, byte_view value, time_point expiration) {
    return block(async_store(key, value, expiration, asio::use_future));
}

template <net::transport Transport>
store_outcome node<Transport>::store(byte_view key, byte_view subkey, byte_view value,
                                     time_point expiration) {
    return block(async_store(key, subkey, value, expiration, asio::use_future));
}

template <net::transport Transport>
std::optional<key_entry> node<Transport>::get(byte_view key, get_options options) {
    auto entries = block(async_get_many({to_buffer(key)}, options, asio::use_future));
    return std::move(entries.front());
}

template <net::transport Transport>
std::vector<std::optional<key_entry>> node<Transport>::get_many(std::vector<byte_buffer> keys,
                                                                get_options options) {
    return block(async_get_many(std::move(keys), options, asio::use_future));
}

template <net::transport Transport>
std::vector<typename node<Transport>::contact_type>
node<Transport>::find_nearest(const dht::id& target, std::size_t count) {
    return block(async_find_nearest(target, count, asio::use_future));
}

template <net::transport Transport>
asio::awaitable<std::error_code> node<Transport>::bootstrap(state_ptr st,
                                                            std::vector<peer> initial) {
    for (auto& p : initial)
        if (std::find_if(st->initial_peers.begin(), st->initial_peers.end(),
                         [&](const peer& known) { return known.id == p.id; }) ==
            st->initial_peers.end())
            st->initial_peers.push_back(p);
    co_return co_await rebootstrap(st, true);
}

template <net::transport Transport>
asio::awaitable<std::error_code> node<Transport>::rebootstrap(state_ptr st, bool all_buckets) {
    st->last_bootstrap = st->now();
    std::vector<contact_type> answered_peers;
    const auto ping = encode(ping_request{sender(st)});
    for (const auto& p : st->initial_peers) {
        if (p.id == st->rpc->id()) continue;
        // A key that does not prove the PeerId is no use (and must not be passed on).
        const auto key = p.key && p.key->id() == p.id ? p.key : std::nullopt;
        const contact_type c{dht::id::of_peer(p.id), p.id, p.endpoint, key};
        const bool known = st->table.find(c.id) != nullptr;
        auto [ec, unused] = co_await call(st, c, "dht.ping", ping);
        if (ec) continue;
        // The table's copy: it has the key the answer proved.
        const contact_type* seen = st->table.find(c.id);
        answered_peers.push_back(seen ? *seen : c);
        if (!known) all_buckets = true;
    }
    if (st->closed) co_return errc::cancelled;
    if (answered_peers.empty() && st->table.size() == 0) co_return errc::no_peers;
    std::vector<dht::id> own{st->self};
    std::optional<std::vector<contact_type>> start;
    if (!answered_peers.empty()) start = std::move(answered_peers);
    co_await run_lookup(st, std::move(own), false, false, st->options.routing.k, std::move(start));
    if (all_buckets) co_await refresh(st, true);
    co_return std::error_code{};
}

template <net::transport Transport>
asio::awaitable<void> node<Transport>::refresh(state_ptr st, bool all) {
    const auto targets = st->table.refresh_targets(
        st->now(), all ? duration::zero() : st->options.refresh_interval, st->rng);
    if (!targets.empty()) co_await run_lookup(st, targets, false, false, st->options.routing.k);
}

template <net::transport Transport>
auto node<Transport>::find_nearest(state_ptr st, dht::id target, std::size_t count)
    -> asio::awaitable<std::pair<std::error_code, std::vector<contact_type>>> {
    using result = std::pair<std::error_code, std::vector<contact_type>>;
    std::vector<dht::id> targets{target};
    auto searches =
        co_await run_lookup(st, std::move(targets), false, false, st->options.routing.k);
    if (st->closed) co_return result{errc::cancelled, {}};
    auto nearest = answered(searches.front(), count);
    if (st->announce) {
        nearest.push_back(
            contact_type{st->self, st->rpc->id(), *st->announce, st->rpc->identity().public_key()});
        std::sort(nearest.begin(), nearest.end(),
                  [&](const contact_type& a, const contact_type& b) {
                      return closer(target, a.id, b.id);
                  });
        if (nearest.size() > count) nearest.resize(count);
    }
    if (nearest.empty()) co_return result{errc::no_peers, {}};
    co_return result{std::error_code{}, std::move(nearest)};
}

template <net::transport Transport>
asio::awaitable<std::pair<std::error_code, store_outcome>> node<Transport>::store_one(state_ptr st,
                                                                                      record r) {
    using result = std::pair<std::error_code, store_outcome>;
    std::vector<record> records;
    records.push_back(std::move(r));
    auto [ec, outcomes] = co_await store_records(st, std::move(records));
    if (ec) co_return result{ec, {}};
    const auto outcome = outcomes.front();
    std::error_code status;
    if (outcome.replicas == 0) status = outcome.refusal ? errc::store_refused : errc::unreachable;
    co_return result{status, outcome};
}

template <net::transport Transport>
void node<Transport>::count(store_outcome& outcome, store_status status) {
    if (status == store_status::stored)
        ++outcome.replicas;
    else if (!outcome.refusal || status < *outcome.refusal)
        outcome.refusal = status;
}

template <net::transport Transport>
bool node<Transport>::fits(const state_ptr& st, const record& r) {
    const auto& limits = st->options.messages;
    return r.key.size() <= limits.max_key_size && r.value.size() <= limits.max_value_size &&
           r.signature.size() <= limits.max_signature_size &&
           (!r.subkey || r.subkey->size() <= limits.max_subkey_size);
}

template <net::transport Transport>
std::size_t node<Transport>::record_bytes(const record& r) {
    return r.key.size() + r.value.size() + (r.subkey ? r.subkey->size() : 0) + r.signature.size();
}

template <net::transport Transport>
asio::awaitable<std::pair<std::error_code, std::vector<store_outcome>>>
node<Transport>::store_records(state_ptr st, std::vector<record> records) {
    using result = std::pair<std::error_code, std::vector<store_outcome>>;
    std::vector<store_outcome> outcomes(records.size());
    if (!st->announce && st->table.size() == 0 && st->initial_peers.empty())
        co_return result{errc::no_peers, std::move(outcomes)};
    // Sign, then check, as every receiver will.
    std::vector<bool> valid(records.size());
    std::vector<dht::id> targets;
    std::vector<std::size_t> search_of(records.size());
    std::map<dht::id, std::size_t> index;
    for (std::size_t i = 0; i < records.size(); ++i) {
        st->validators.sign(records[i]);
        if (!fits(st, records[i])) {
            outcomes[i].refusal = store_status::too_large;
            continue;
        }
        if (st->validators.validate(records[i])) {
            outcomes[i].refusal = store_status::invalid;
            continue;
        }
        valid[i] = true;
        const auto key = records[i].key_id();
        auto [it, added] = index.try_emplace(key, targets.size());
        if (added) targets.push_back(key);
        search_of[i] = it->second;
    }
    // Small records ride along with the lookup's requests (carried_record_bytes).
    carried_records carry{&records, std::vector<std::vector<std::size_t>>(targets.size())};
    std::vector<std::size_t> carried_bytes(targets.size());
    for (std::size_t i = 0; i < records.size(); ++i) {
        if (!valid[i]) continue;
        carried_bytes[search_of[i]] += record_bytes(records[i]);
        carry.of_target[search_of[i]].push_back(i);
    }
    for (std::size_t t = 0; t < targets.size(); ++t)
        if (carried_bytes[t] > st->options.carried_record_bytes ||
            carry.of_target[t].size() > st->options.messages.max_items)
            carry.of_target[t].clear();
    // The search ends when the num_replicas nearest have answered, not the k nearest: the
    // stores go to those alone, and waiting for k answers costs about 20 finds a store,
    // most of them to peers it never stores on.
    auto searches = co_await run_lookup(st, targets, false, false, st->options.num_replicas,
                                        std::nullopt, std::move(carry));
    if (st->closed) co_return result{errc::cancelled, std::move(outcomes)};
    // Per record: the num_replicas nearest of the nodes that answered, and this node. A
    // node that took the record with its find has answered for it already.
    std::map<crypto::peer_id, outgoing_store> outgoing;
    const auto now = st->now();
    for (std::size_t i = 0; i < records.size(); ++i) {
        if (!valid[i]) continue;
        const auto& s = searches[search_of[i]];
        auto nearest = answered(s, st->options.num_replicas);
        bool self_included = false;
        if (st->announce) {
            self_included = nearest.size() < st->options.num_replicas ||
                            closer(s.target, st->self, nearest.back().id);
            if (self_included && nearest.size() == st->options.num_replicas) nearest.pop_back();
        }
        if (self_included) count(outcomes[i], st->storage.store(records[i], now));
        for (const auto& c : nearest) {
            const auto& stored = s.candidates.at(c.id ^ s.target).stored;
            if (!stored.empty()) {
                const auto position = std::find(s.carried.begin(), s.carried.end(), i);
                count(outcomes[i], stored[static_cast<std::size_t>(position - s.carried.begin())]);
                continue;
            }
            auto& out = outgoing[c.peer];
            out.target = c;
            out.records.push_back(i);
            ++st->stats.store_records_sent;
        }
    }
    auto answers = co_await send_stores(st, std::move(outgoing), records, false);
    for (auto& [indices, statuses] : answers)
        for (std::size_t n = 0; n < indices.size(); ++n)
            count(outcomes[indices[n]], statuses[n]);
    co_return result{std::error_code{}, std::move(outcomes)};
}

template <net::transport Transport>
auto node<Transport>::send_stores(state_ptr st, std::map<crypto::peer_id, outgoing_store> outgoing,
                                  const std::vector<record>& records, bool in_cache)
    -> asio::awaitable<std::vector<store_answer>> {
    struct shared {
        explicit shared(const asio::any_io_executor& ex)
            : wake(ex) {}
        std::size_t pending = 0;
        std::vector<store_answer> answers;
        wakeup wake;
    };
    auto collected = std::make_shared<shared>(st->executor);
    constexpr std::size_t max_request_bytes = 4u << 20;
    for (auto& [peer_id, out] : outgoing) {
        for (std::size_t first = 0; first < out.records.size();) {
            store_request request{sender(st), {}};
            std::vector<std::size_t> indices;
            std::size_t bytes = 0;
            for (; first < out.records.size() &&
                   request.items.size() < st->options.messages.max_items;
                 ++first) {
                const auto& r = records[out.records[first]];
                const auto size = record_bytes(r);
                if (!indices.empty() && bytes + size > max_request_bytes) break;
                bytes += size;
                request.items.push_back({r, in_cache});
                indices.push_back(out.records[first]);
            }
            ++collected->pending;
            asio::co_spawn(st->executor,
                           store_at(st, out.target, encode(request), std::move(indices), collected),
                           asio::detached);
        }
    }
    if (collected->pending > 0) co_await collected->wake.wait();
    co_return std::move(collected->answers);
}

template <net::transport Transport>
template <class Shared>
asio::awaitable<void> node<Transport>::store_at(state_ptr st, contact_type target, byte_buffer body,
                                                std::vector<std::size_t> indices,
                                                std::shared_ptr<Shared> collected) {
    auto [ec, raw] = co_await call(st, target, "dht.store", std::move(body));
    store_response response;
    if (!ec && !decode(raw, response, st->options.messages) &&
        response.statuses.size() == indices.size())
        collected->answers.emplace_back(std::move(indices), std::move(response.statuses));
    if (--collected->pending == 0) collected->wake.notify();
}

template <net::transport Transport>
asio::awaitable<std::pair<std::error_code, key_entry>>
node<Transport>::get_one(state_ptr st, byte_buffer key, get_options options) {
    using result = std::pair<std::error_code, key_entry>;
    std::vector<byte_buffer> keys;
    keys.push_back(std::move(key));
    auto [ec, entries] = co_await get_keys(st, std::move(keys), options);
    if (ec) co_return result{ec, {}};
    if (!entries.front()) co_return result{errc::not_found, {}};
    co_return result{std::error_code{}, std::move(*entries.front())};
}

template <net::transport Transport>
asio::awaitable<std::pair<std::error_code, std::vector<std::optional<key_entry>>>>
node<Transport>::get_keys(state_ptr st, std::vector<byte_buffer> keys, get_options options) {
    using result = std::pair<std::error_code, std::vector<std::optional<key_entry>>>;
    std::vector<std::optional<key_entry>> entries(keys.size());
    std::vector<dht::id> targets;
    std::vector<std::size_t> wanted; // indices of keys searched on the network
    const auto now = st->now();
    for (std::size_t i = 0; i < keys.size(); ++i) {
        const auto key = dht::id::of_key(keys[i]);
        entries[i] = local_entry(st, key, now);
        if (entries[i] && !options.latest) continue;
        targets.push_back(key);
        wanted.push_back(i);
    }
    if (targets.empty()) co_return result{std::error_code{}, std::move(entries)};
    if (st->table.size() == 0 && st->initial_peers.empty() && !st->announce)
        co_return result{errc::no_peers, std::move(entries)};
    auto searches = co_await run_lookup(st, targets, true, options.latest, st->options.routing.k);
    if (st->closed) co_return result{errc::cancelled, std::move(entries)};
    std::map<crypto::peer_id, outgoing_store> caching;
    std::vector<record> cached;
    for (std::size_t n = 0; n < wanted.size(); ++n) {
        auto& s = searches[n];
        if (!s.found) continue;
        detail::merge_entry(entries[wanted[n]], *s.found);
        if (!st->options.cache_on_get) continue;
        for (auto& r : detail::records_of(*s.found)) {
            st->cache.store(r, now);
            if (!s.nearest_without_value) continue;
            auto& out = caching[s.nearest_without_value->peer];
            out.target = *s.nearest_without_value;
            out.records.push_back(cached.size());
            cached.push_back(std::move(r));
        }
    }
    if (!caching.empty())
        asio::co_spawn(st->executor,
                       send_and_forget(st, std::move(caching), std::move(cached), true),
                       asio::detached);
    co_return result{std::error_code{}, std::move(entries)};
}

template <net::transport Transport>
asio::awaitable<void>
node<Transport>::send_and_forget(state_ptr st, std::map<crypto::peer_id, outgoing_store> out,
                                 std::vector<record> records, bool in_cache) {
    co_await send_stores(st, std::move(out), records, in_cache);
}

} // namespace hivemesh::dht
