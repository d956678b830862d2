// dht::node, lookups: the iterative parallel search for several keys at once, batching
// keys per peer (included by dht/node.hpp).
#pragma once

#include "hivemesh/dht/node.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <system_error>
#include <utility>
#include <vector>

namespace hivemesh::dht {

template <net::transport Transport>
struct node<Transport>::candidate {
    contact_type contact;
    candidate_state status = candidate_state::fresh;
    std::size_t hop = 1;
    /// Its answers to the search's carried records, when its request carried them.
    std::vector<store_status> stored;
};

template <net::transport Transport>
struct node<Transport>::search {
    dht::id target;
    bool want_value = false;
    bool latest = false;
    /// How many of the nearest live candidates must answer before the search ends.
    std::size_t width = 0;
    /// Records handed to each node asked while it is among the `width` nearest live
    /// candidates (indices into the lookup's records).
    std::vector<std::size_t> carried;
    std::map<dht::id, candidate> candidates; // by distance to target
    std::size_t in_flight = 0;
    std::size_t rounds = 0;
    bool done = false;
    std::optional<key_entry> found;
    /// Nearest node that answered without the value (where a get caches it).
    std::optional<contact_type> nearest_without_value;
};

template <net::transport Transport>
struct node<Transport>::reply {
    contact_type from;
    std::vector<std::size_t> searches;
    std::vector<bool> carried; // per search: whether the request carried its records
    std::error_code ec;
    find_response response;
};

template <net::transport Transport>
struct node<Transport>::lookup {
    explicit lookup(const asio::any_io_executor& ex)
        : wake(ex) {}
    std::vector<search> searches;
    const std::vector<record>* records = nullptr; // what the searches carry
    std::deque<reply> replies;
    std::size_t in_flight = 0;
    wakeup wake;
};

template <net::transport Transport>
void node<Transport>::add_candidate(const state_ptr& st, search& s, const contact_type& c,
                                    std::size_t hop) {
    if (c.id == st->self) return;
    s.candidates.try_emplace(c.id ^ s.target, candidate{c, candidate_state::fresh, hop, {}});
}

template <net::transport Transport>
bool node<Transport>::finished(const state_ptr& st, search& s) {
    if (s.done) return true;
    if (s.want_value && !s.latest && s.found) return s.done = true;
    std::size_t answered_count = 0;
    for (auto& [distance, c] : s.candidates) {
        if (answered_count == s.width) break;
        if (c.status == candidate_state::answered) {
            ++answered_count;
            continue;
        }
        if (c.status == candidate_state::failed ||
            (c.status == candidate_state::fresh && blacklisted(st, c.contact.id)))
            continue;
        return false; // a near candidate is not asked yet, or its answer is pending
    }
    return s.done = true;
}

template <net::transport Transport>
auto node<Transport>::next_candidate(const state_ptr& st, search& s) -> candidate* {
    std::size_t live = 0;
    for (auto& [distance, c] : s.candidates) {
        if (c.status == candidate_state::failed) continue;
        if (live++ == s.width) break;
        if (c.status != candidate_state::fresh) continue;
        if (blacklisted(st, c.contact.id)) {
            c.status = candidate_state::failed;
            --live;
            continue;
        }
        return &c;
    }
    return nullptr;
}

template <net::transport Transport>
bool node<Transport>::among_nearest(const state_ptr& st, const search& s, const dht::id& node) {
    const auto distance = node ^ s.target;
    std::size_t nearer = st->announce && closer(s.target, st->self, node) ? 1 : 0;
    for (const auto& [d, c] : s.candidates) {
        if (!(d < distance) || nearer >= s.width) break;
        if (c.status != candidate_state::failed) ++nearer;
    }
    return nearer < s.width;
}

template <net::transport Transport>
void node<Transport>::launch(const state_ptr& st, const std::shared_ptr<lookup>& l) {
    for (std::size_t i = 0; i < l->searches.size(); ++i) {
        auto& s = l->searches[i];
        while (!finished(st, s) && s.in_flight < st->options.alpha) {
            candidate* chosen = next_candidate(st, s);
            if (!chosen) break;
            const contact_type target = chosen->contact;
            // Every other live search with this peer among its next candidates rides
            // along in the same request.
            std::vector<std::size_t> batch{i};
            chosen->status = candidate_state::asked;
            s.rounds = std::max(s.rounds, chosen->hop);
            ++s.in_flight;
            for (std::size_t j = 0;
                 j < l->searches.size() && batch.size() < st->options.max_keys_per_request; ++j) {
                auto& other = l->searches[j];
                if (j == i || other.done) continue;
                const auto it = other.candidates.find(target.id ^ other.target);
                if (it == other.candidates.end() || it->second.status != candidate_state::fresh)
                    continue;
                it->second.status = candidate_state::asked;
                other.rounds = std::max(other.rounds, it->second.hop);
                ++other.in_flight;
                batch.push_back(j);
            }
            find_request request{sender(st),
                                 {},
                                 static_cast<std::uint32_t>(st->options.routing.k),
                                 {},
                                 s.want_value}; // the same in every search
            std::vector<bool> carried(batch.size());
            for (std::size_t n = 0; n < batch.size(); ++n) {
                const auto& searched = l->searches[batch[n]];
                request.keys.push_back(searched.target);
                if (searched.carried.empty() ||
                    request.items.size() + searched.carried.size() >
                        st->options.messages.max_items ||
                    !among_nearest(st, searched, target.id))
                    continue; // a store request follows if this node is among the nearest
                carried[n] = true;
                for (const auto index : searched.carried)
                    request.items.push_back({(*l->records)[index], false});
            }
            ++l->in_flight;
            const auto items = request.items.size();
            st->stats.store_records_carried += items;
            asio::co_spawn(
                st->executor,
                ask(st, l, target, std::move(batch), std::move(carried), items, encode(request)),
                asio::detached);
        }
    }
}

template <net::transport Transport>
asio::awaitable<void> node<Transport>::ask(state_ptr st, std::shared_ptr<lookup> l,
                                           contact_type target, std::vector<std::size_t> batch,
                                           std::vector<bool> carried, std::size_t items,
                                           byte_buffer request) {
    auto [ec, raw] = co_await call(st, target, "dht.find", std::move(request));
    reply r{std::move(target), std::move(batch), std::move(carried), ec, {}};
    if (!r.ec) {
        r.ec = decode(raw, r.response, st->options.messages);
        if (!r.ec &&
            (r.response.results.size() != r.searches.size() || r.response.statuses.size() != items))
            r.ec = errc::protocol_violation;
        if (r.ec) note_failure(st, r.from);
    }
    l->replies.push_back(std::move(r));
    --l->in_flight;
    l->wake.notify();
}

template <net::transport Transport>
void node<Transport>::absorb(const state_ptr& st, lookup& l, reply& r) {
    const time_point now = st->now();
    auto statuses = r.response.statuses.begin();
    for (std::size_t n = 0; n < r.searches.size(); ++n) {
        auto& s = l.searches[r.searches[n]];
        --s.in_flight;
        auto it = s.candidates.find(r.from.id ^ s.target);
        if (it == s.candidates.end()) continue;
        auto& c = it->second;
        if (r.ec) {
            c.status = candidate_state::failed;
            continue;
        }
        c.status = candidate_state::answered;
        if (r.carried[n]) {
            const auto end = statuses + static_cast<std::ptrdiff_t>(s.carried.size());
            c.stored.assign(statuses, end);
            statuses = end;
        }
        auto& result = r.response.results[n];
        bool had_value = false;
        if (result.entry && dht::id::of_key(result.entry->key) == s.target) {
            // Keep only what our validators accept, and no expiration our storage would
            // refuse as too far ahead: a bad record from one node must not hide good ones
            // from others.
            const auto acceptable = [&](const std::optional<byte_buffer>& subkey,
                                        const stored_value& value) {
                return !too_far_ahead(value.expiration, now, st->options.storage.max_lifetime) &&
                       !st->validators.validate(result.entry->to_record(subkey, value));
            };
            key_entry valid{result.entry->key, {}, {}};
            if (result.entry->plain && acceptable(std::nullopt, *result.entry->plain))
                valid.plain = result.entry->plain;
            for (auto& [subkey, value] : result.entry->dictionary)
                if (acceptable(subkey, value)) valid.dictionary.emplace(subkey, value);
            had_value = !valid.empty();
            detail::merge_entry(s.found, valid);
        }
        if (!had_value &&
            (!s.nearest_without_value || closer(s.target, r.from.id, s.nearest_without_value->id)))
            s.nearest_without_value = r.from;
        for (const auto& info : result.nearest) {
            const auto endpoint = Transport::to_endpoint(info.address);
            if (!endpoint) continue;
            add_candidate(st, s,
                          contact_type{dht::id::of_peer(info.peer), info.peer, *endpoint, info.key},
                          c.hop + 1);
        }
    }
}

template <net::transport Transport>
auto node<Transport>::run_lookup(state_ptr st, std::vector<dht::id> targets, bool want_value,
                                 bool latest, std::size_t width,
                                 std::optional<std::vector<contact_type>> start,
                                 carried_records carry) -> asio::awaitable<std::vector<search>> {
    auto l = std::make_shared<lookup>(st->executor);
    l->searches.resize(targets.size());
    l->records = carry.records;
    const auto now = st->now();
    for (std::size_t i = 0; i < targets.size(); ++i) {
        auto& s = l->searches[i];
        s.target = targets[i];
        s.want_value = want_value;
        s.latest = latest;
        s.width = width;
        if (i < carry.of_target.size()) s.carried = std::move(carry.of_target[i]);
        for (const auto& c : start ? *start : st->table.nearest(s.target, st->options.routing.k))
            add_candidate(st, s, c, 1);
        st->table.mark_refreshed(s.target, now);
    }
    while (!st->closed) {
        launch(st, l);
        const bool all_done = std::all_of(l->searches.begin(), l->searches.end(),
                                          [](const search& s) { return s.done; });
        if (all_done || l->in_flight == 0) break;
        const auto cancelled = co_await l->wake.wait();
        if (cancelled) break;
        while (!l->replies.empty()) {
            absorb(st, *l, l->replies.front());
            l->replies.pop_front();
        }
    }
    for (auto& s : l->searches) {
        ++st->stats.lookups;
        st->stats.lookup_rounds += s.rounds;
    }
    co_return std::move(l->searches);
}

template <net::transport Transport>
auto node<Transport>::answered(const search& s, std::size_t count) -> std::vector<contact_type> {
    std::vector<contact_type> out;
    for (const auto& [distance, c] : s.candidates) {
        if (out.size() == count) break;
        if (c.status == candidate_state::answered) out.push_back(c.contact);
    }
    return out;
}

} // namespace hivemesh::dht
