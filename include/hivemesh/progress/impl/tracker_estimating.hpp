// progress::tracker, the swarm's side: reading the run's records, estimating the global
// progress, and the waits on it (included by progress/tracker.hpp).
#pragma once

#include "hivemesh/progress/tracker.hpp"

#include <asio/experimental/as_tuple.hpp>
#include <asio/use_awaitable.hpp>

#include <algorithm>
#include <memory>
#include <mutex>
#include <optional>
#include <system_error>
#include <utility>
#include <vector>

namespace hivemesh::progress {

template <net::transport Transport>
global_training_progress tracker<Transport>::global_progress() const {
    std::lock_guard lock(state_->mutex);
    return state_->snapshot;
}

template <net::transport Transport>
bool tracker<Transport>::ready_to_update_epoch() const {
    const time_point now = state_->now();
    std::lock_guard lock(state_->mutex);
    return state_->snapshot.ready(state_->local.epoch, now);
}

template <net::transport Transport>
std::vector<progress_record> tracker<Transport>::live_records(const shared& st, time_point now) {
    const duration lifetime = st.options.record_expiration;
    std::vector<progress_record> out;
    out.reserve(st.others.size() + 1);
    for (const auto& seen : st.others)
        if (seen.expiration > now && now - seen.record.report_time < lifetime)
            out.push_back(seen.record);
    const auto& l = st.local;
    if (st.options.reports_samples && now - l.report_time < lifetime)
        out.push_back(progress_record{l.epoch, l.samples_accumulated, l.samples_per_second,
                                      l.report_time, st.client});
    return out;
}

template <net::transport Transport>
void tracker<Transport>::reestimate(shared& st, time_point now, bool fetched) {
    const auto records = live_records(st, now);
    auto g = estimate_global_progress(records, st.local.epoch, now, st.estimate, st.epoch_started,
                                      st.others_read_at);
    if (!fetched) g.next_fetch = std::min(g.next_fetch, st.snapshot.next_fetch);
    g.version = st.snapshot.version + 1;
    st.snapshot = g;
}

template <net::transport Transport>
void tracker<Transport>::notify_waiters(shared& st) {
    for (const auto& w : st.waiters)
        w->notify();
}

template <net::transport Transport>
asio::awaitable<void> tracker<Transport>::fetch_loop(shared_ptr st) {
    while (true) {
        const time_point now = st->now();
        time_point next_fetch{}, eta{};
        bool closed = false;
        {
            std::lock_guard lock(st->mutex);
            closed = st->closed;
            next_fetch = st->snapshot.next_fetch;
            eta = st->snapshot.eta;
        }
        if (closed) break;
        if (now >= next_fetch) {
            co_await fetch(st);
            continue;
        }
        // Sleep until the next read, or until the ETA if that comes first: the waiters for
        // readiness must hear of it. A local change cancels the sleep to look again.
        const bool eta_first = eta > now && eta < next_fetch;
        st->fetch_timer.expires_after((eta_first ? eta : next_fetch) - now);
        co_await st->fetch_timer.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
        if (eta_first && st->now() >= eta) notify_waiters(*st);
    }
}

template <net::transport Transport>
asio::awaitable<void> tracker<Transport>::fetch(shared_ptr st) {
    using result_type = std::pair<std::error_code, dht::key_entry>;
    auto result = std::make_shared<result_type>();
    auto done = std::make_shared<wakeup>(st->executor);
    const time_point started = st->now();
    {
        std::lock_guard lock(st->dht_mutex);
        if (!st->dht) co_return; // closed
        st->dht->async_get(st->key_bytes, dht::get_options{.latest = true},
                           [result, done](std::error_code ec, dht::key_entry entry) {
                               *result = result_type{ec, std::move(entry)};
                               done->notify();
                           });
    }
    co_await done->wait();
    const time_point now = st->now();
    const std::error_code ec = result->first;
    const dht::key_entry& entry = result->second;
    const bool found = !ec || ec == errc::not_found;
    const duration lifetime = st->options.record_expiration;
    std::vector<seen_record> others;
    std::uint64_t skipped = 0;
    if (!ec) {
        for (const auto& [subkey, stored] : entry.dictionary) {
            if (subkey == st->own_subkey || stored.value.empty()) continue; // ours, tombstones
            progress_record r;
            if (stored.expiration <= now || !is_owner_marker(subkey) || decode(stored.value, r) ||
                now - r.report_time >= lifetime) {
                ++skipped;
                continue;
            }
            others.push_back({r, stored.expiration});
        }
    }
    {
        std::lock_guard lock(st->mutex);
        if (st->closed) co_return;
        st->stats.records_skipped += skipped;
        if (found) {
            ++st->stats.fetches;
            st->others = std::move(others);
            st->others_read_at = started;
        } else {
            ++st->stats.fetch_failures;
            log::debug("progress", "reading ", st->key, " failed: ", ec.message());
        }
        reestimate(*st, now, true);
    }
    notify_waiters(*st);
}

template <net::transport Transport>
asio::awaitable<std::pair<std::error_code, global_training_progress>>
tracker<Transport>::wait(shared_ptr st, bool until_ready, std::uint64_t seen_version) {
    using result_type = std::pair<std::error_code, global_training_progress>;
    auto w = std::make_shared<wakeup>(st->executor);
    st->waiters.push_back(w);
    struct registration {
        shared* st;
        wakeup* w;
        ~registration() {
            std::erase_if(st->waiters, [this](const auto& p) { return p.get() == w; });
        }
    };
    const registration registered{st.get(), w.get()};
    while (true) {
        const time_point now = st->now();
        std::optional<result_type> outcome;
        {
            std::lock_guard lock(st->mutex);
            const auto& g = st->snapshot;
            if (st->closed)
                outcome = result_type{make_error_code(errc::cancelled), g};
            else if (until_ready ? g.ready(st->local.epoch, now) : g.version > seen_version)
                outcome = result_type{std::error_code{}, g};
        }
        if (outcome) co_return std::move(*outcome);
        if (auto ec = co_await w->wait())
            co_return result_type{make_error_code(errc::cancelled), {}};
    }
}

} // namespace hivemesh::progress
