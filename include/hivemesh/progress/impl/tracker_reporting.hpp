// progress::tracker, this peer's side: options, construction, reports, publishing the record
// and withdrawing it (included by progress/tracker.hpp).
#pragma once

#include "hivemesh/progress/tracker.hpp"

#include <asio/co_spawn.hpp>
#include <asio/post.hpp>

#include <algorithm>
#include <cmath>
#include <exception>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>

namespace hivemesh::progress {

template <net::transport Transport>
tracker_options tracker<Transport>::checked(tracker_options o) {
    const auto refuse = [](const std::string& what) {
        throw std::invalid_argument("hivemesh::progress::tracker: " + what);
    };
    if (!is_valid_run_id(o.run_id))
        refuse("run_id \"" + o.run_id + "\" must be 1.." + std::to_string(max_run_id_length) +
               " characters of [A-Za-z0-9_.:/-]");
    if (o.target_batch_size == 0) refuse("target_batch_size must be > 0");
    if (o.min_refresh <= duration::zero()) refuse("min_refresh must be > 0");
    if (o.max_refresh < o.min_refresh) refuse("max_refresh must be >= min_refresh");
    if (o.record_expiration < 2 * o.min_refresh)
        refuse("record_expiration must be at least 2 * min_refresh");
    if (!(o.samples_per_second_alpha > 0 && o.samples_per_second_alpha <= 1))
        refuse("samples_per_second_alpha must be in (0, 1]");
    if (!(std::isfinite(o.expected_drift_peers) && o.expected_drift_peers >= 0))
        refuse("expected_drift_peers must be finite and >= 0");
    if (!(std::isfinite(o.expected_drift_rate) && o.expected_drift_rate >= 0))
        refuse("expected_drift_rate must be finite and >= 0");
    return o;
}

template <net::transport Transport>
tracker<Transport>::tracker(peer_type& peer, tracker_options options) {
    options = checked(std::move(options));
    const bool client = options.client.value_or(peer.client_mode());
    state_ = std::make_shared<shared>(peer, std::move(options), client);
    // Before the first store: our own node checks what we publish as any replica will.
    peer.add_validator(make_progress_validator(state_->options.run_id));
    {
        auto& st = *state_;
        const time_point now = st.now();
        std::lock_guard lock(st.mutex);
        st.local.epoch = st.options.initial_epoch;
        st.local.report_time = now;
        st.epoch_started = now;
        st.ema_since = now;
        st.snapshot.next_fetch = now; // read at once
        reestimate(st, now, false);
    }
    if (state_->options.reports_samples)
        spawn(state_, publish_loop(state_), "progress::tracker publishing");
    spawn(state_, fetch_loop(state_), "progress::tracker reading");
}

template <net::transport Transport>
tracker<Transport>::~tracker() {
    close();
}

template <net::transport Transport>
void tracker<Transport>::spawn(const shared_ptr& st, asio::awaitable<void> loop, const char* name) {
    asio::co_spawn(st->executor, std::move(loop), [name](std::exception_ptr failure) {
        if (failure) escaped_exception_code(failure, name); // logs it
    });
}

template <net::transport Transport>
void tracker<Transport>::apply_report(shared& st, std::uint64_t epoch, std::uint64_t samples,
                                      bool force_publish, time_point now) {
    auto& local = st.local;
    if (!st.measuring || epoch != local.epoch || samples < local.samples_accumulated) {
        // The first report (how long its samples took is unknown: the peer may have loaded
        // data or waited for others first), another epoch, or the count went back: nothing to
        // measure across; start again.
        st.measuring = true;
        st.ema_since = now;
        st.unmeasured_samples = 0;
        if (epoch != local.epoch) {
            force_publish = true;
            st.epoch_started = now;
        }
    } else {
        st.unmeasured_samples += samples - local.samples_accumulated;
        if (now > st.ema_since) {
            st.ema.update(st.unmeasured_samples, now - st.ema_since);
            st.ema_since = now;
            st.unmeasured_samples = 0;
        }
    }
    local.epoch = epoch;
    local.samples_accumulated = samples;
    local.samples_per_second = st.ema.samples_per_second();
    local.report_time = now;
    st.publish_pending = true;
    if (force_publish) st.publish_now = true;
    reestimate(st, now, false);
}

template <net::transport Transport>
void tracker<Transport>::report_local_progress(std::uint64_t epoch,
                                               std::uint64_t samples_accumulated) {
    auto& st = *state_;
    const time_point now = st.now();
    {
        std::lock_guard lock(st.mutex);
        if (st.closed) return;
        apply_report(st, epoch, samples_accumulated, false, now);
    }
    wake(state_);
}

template <net::transport Transport>
void tracker<Transport>::update_epoch(std::uint64_t new_epoch) {
    auto& st = *state_;
    const time_point now = st.now();
    {
        std::lock_guard lock(st.mutex);
        if (st.closed) return;
        // Whatever the count was, the new epoch starts from zero and a fresh interval.
        st.local.samples_accumulated = 0;
        st.ema_since = now;
        st.unmeasured_samples = 0;
        apply_report(st, new_epoch, 0, true, now);
        // The others are moving to the new epoch too: until their new records are read, their
        // samples in it count for nothing and the ETA comes too late.
        st.snapshot.next_fetch = std::min(st.snapshot.next_fetch, now + st.options.min_refresh);
    }
    wake(state_);
}

template <net::transport Transport>
local_training_progress tracker<Transport>::local_progress() const {
    std::lock_guard lock(state_->mutex);
    return state_->local;
}

template <net::transport Transport>
tracker_statistics tracker<Transport>::statistics() const {
    std::lock_guard lock(state_->mutex);
    return state_->stats;
}

template <net::transport Transport>
void tracker<Transport>::wake(const shared_ptr& st) {
    if (st->wake_posted.exchange(true)) return;
    asio::post(st->executor, [st] {
        st->wake_posted = false; // before looking: a later report posts again
        st->publish_timer.cancel();
        st->fetch_timer.cancel();
        notify_waiters(*st);
    });
}

template <net::transport Transport>
asio::awaitable<void> tracker<Transport>::publish_loop(shared_ptr st) {
    const duration republish_period = st->options.record_expiration / 2;
    const duration throttle = st->options.min_refresh;
    while (true) {
        const time_point now = st->now();
        std::optional<progress_record> due;
        time_point wake_at{};
        bool closed = false;
        {
            std::lock_guard lock(st->mutex);
            closed = st->closed;
            const auto last = st->last_publish;
            if (closed) {
                // nothing more to publish
            } else if (!last || st->publish_now ||
                       (st->publish_pending && now >= *last + throttle) ||
                       now >= *last + republish_period) {
                const auto& l = st->local;
                due = progress_record{l.epoch, l.samples_accumulated, l.samples_per_second,
                                      l.report_time, st->client};
                st->publish_now = st->publish_pending = false;
            } else {
                wake_at = *last + republish_period;
                if (st->publish_pending) wake_at = std::min(wake_at, *last + throttle);
            }
        }
        if (closed) break;
        if (due) {
            publish(st, *due, now);
            continue;
        }
        st->publish_timer.expires_after(wake_at - now);
        co_await st->publish_timer.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
    }
}

template <net::transport Transport>
void tracker<Transport>::publish(const shared_ptr& st, const progress_record& record,
                                 time_point now) {
    byte_buffer value = encode(record);
    time_point expiration;
    {
        std::lock_guard lock(st->mutex);
        // Strictly later than our previous record, or the replicas would refuse it.
        expiration = std::max(now + st->options.record_expiration, st->last_expiration + 1ns);
        st->last_expiration = expiration;
        st->last_publish = now;
    }
    dht::record r{st->key_bytes, st->own_subkey, std::move(value), expiration, {}};
    std::lock_guard lock(st->dht_mutex);
    if (!st->dht) return;
    // Not awaited: a store that waits on a dead replica must not hold up the next one (an
    // earlier store that lands later is refused as outdated, which is fine).
    st->dht->async_store(std::move(r), [st](std::error_code ec, dht::store_outcome outcome) {
        const bool superseded =
            ec == errc::store_refused && outcome.refusal == dht::store_status::outdated;
        std::lock_guard lock(st->mutex);
        if (!ec || superseded) {
            ++st->stats.publications;
        } else {
            ++st->stats.publication_failures;
            log::debug("progress", "publishing our progress record failed: ", ec.message());
        }
    });
}

} // namespace hivemesh::progress
