// optim::collaborative_optimizer: one step, from the caller's gradient to the end of an epoch
// (included by optim/collaborative.hpp).
#pragma once

#include "hivemesh/optim/collaborative.hpp"

#include <algorithm>
#include <atomic>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>

namespace hivemesh::optim {

namespace detail {

/// sum = weight · g over `n` elements (a block of for_each_block).
template <class Count>
void scale_block(float* __restrict sum, const float* __restrict g, float weight, Count n) {
    for (std::size_t j = 0; j < n; ++j)
        sum[j] = weight * g[j];
}

/// sum += weight · g over `n` elements (a block of for_each_block).
template <class Count>
void add_scaled_block(float* __restrict sum, const float* __restrict g, float weight, Count n) {
    for (std::size_t j = 0; j < n; ++j)
        sum[j] += weight * g[j];
}

} // namespace detail

template <net::transport Transport>
step_report collaborative_optimizer<Transport>::step(std::uint64_t batch_size) {
    if (running_in_this_thread(state_->executor))
        throw std::system_error(errc::wrong_thread,
                                "hivemesh::optim::collaborative_optimizer::step on an io "
                                "thread: use async_step");
    return async_step(batch_size, asio::use_future).get();
}

template <net::transport Transport>
std::uint64_t collaborative_optimizer<Transport>::begin_step(shared& st, std::uint64_t batch_size) {
    const bool aux = st.role == averaging::member_role::aux;
    const std::uint64_t batch = batch_size != 0 ? batch_size : st.options.batch_size_per_step;
    if (!aux && batch == 0)
        detail::throw_invalid(detail::collaborative_who,
                              "step() needs a batch size: pass one or set batch_size_per_step");
    if (st.stepping.exchange(true))
        detail::throw_invalid(detail::collaborative_who, "a step is already running");
    if (aux || st.closed) return batch;
    try {
        const time_point started = st.now();
        if (st.options.use_local_updates)
            st.local.step(st.params);
        else
            accumulate(st, batch);
        const duration spent = st.now() - started;
        std::lock_guard lock(st.mutex);
        (st.options.use_local_updates ? st.stats.optimizer_step : st.stats.accumulating) += spent;
    } catch (...) {
        st.stepping = false;
        throw;
    }
    return batch;
}

template <net::transport Transport>
void collaborative_optimizer<Transport>::accumulate(shared& st, std::uint64_t batch) {
    for (std::size_t i = 0; i < st.params.size(); ++i) {
        const std::size_t n = st.params[i].grad.size();
        if (n != st.accumulators[i].size())
            throw std::system_error(make_error_code(errc::size_mismatch),
                                    std::string(detail::collaborative_who) +
                                        ": the grad of "
                                        "parameter " +
                                        std::to_string(i) + " has " + std::to_string(n) +
                                        " elements, not " +
                                        std::to_string(st.accumulators[i].size()));
    }
    const auto weight = static_cast<float>(batch);
    const bool first = st.accumulated_steps == 0;
    for (std::size_t i = 0; i < st.params.size(); ++i) {
        const tensor::const_host_view<tensor::tensor_ref> grad(st.params[i].grad);
        const float* g = grad.span().data();
        float* sum = st.accumulators[i].data();
        // The accumulator is the optimizer's own buffer, so it never aliases the grad: with
        // that said (restrict) and blocks of a constant trip count, g++ -O2 vectorises both.
        detail::for_each_block(grad.size(), [&](std::size_t at, auto n) {
            if (first)
                detail::scale_block(sum + at, g + at, weight, n);
            else
                detail::add_scaled_block(sum + at, g + at, weight, n);
        });
    }
    ++st.accumulated_steps;
}

template <net::transport Transport>
asio::awaitable<std::pair<std::error_code, step_report>>
collaborative_optimizer<Transport>::run_step(shared_ptr st, std::uint64_t batch) {
    const detail::flag_release release{st->stepping};
    step_report report;
    const auto finish = [&] {
        report.epoch = st->epoch.load();
        report.samples = st->samples;
        return std::pair{std::error_code{}, report};
    };
    if (st->closed) co_return std::pair{make_error_code(errc::cancelled), report};
    if (st->delayed_round) co_await apply_delayed(st, false, report);
    const bool aux = st->role == averaging::member_role::aux;
    {
        std::lock_guard lock(st->mutex);
        ++st->stats.steps;
        st->stats.samples += aux ? 0 : batch;
    }
    if (aux) {
        // An aux peer trains nothing: it follows the swarm's epoch.
        const std::uint64_t global = st->tracker.global_progress().epoch;
        if (global > st->epoch.load()) enter_epoch(*st, global);
    } else {
        st->samples += batch;
        if (!st->first_read) {
            // Whether this peer is behind is known only once the tracker has read the others'
            // records: a newcomer's first step waits for that read (a few round trips).
            co_await wait_for_first_read(st);
            st->first_read = true;
        }
        if (should_load_state(*st)) {
            // This batch was computed from parameters the swarm has left behind.
            report.state_loaded = true;
            report.state_error = co_await load_state(st);
            co_return finish();
        }
        st->tracker.report_local_progress(st->epoch.load(), st->samples);
    }
    maybe_schedule(st);
    if (st->tracker.ready_to_update_epoch()) co_await end_epoch(st, report);
    co_return finish();
}

template <net::transport Transport>
asio::awaitable<void> collaborative_optimizer<Transport>::wait_for_first_read(shared_ptr st) {
    const auto reads = [&] {
        const auto s = st->tracker.statistics();
        return s.fetches + s.fetch_failures;
    };
    while (reads() == 0 && !st->closed) {
        const std::uint64_t seen = st->tracker.global_progress().version;
        auto [ec, progress] = co_await st->tracker.async_wait_for_update(seen);
        if (ec) break;
    }
}

template <net::transport Transport>
void collaborative_optimizer<Transport>::maybe_schedule(const shared_ptr& st) {
    if (st->closed || !st->options.schedule_ahead) return;
    const auto global = st->tracker.global_progress();
    if (global.num_keeping_up() <= 1 || global.eta == time_point::max() ||
        st->now() + st->options.matchmaking_time < global.eta)
        return;
    // The averager of a round still running in the background is busy.
    if (st->delayed_round && !st->delayed_round->done) return;
    const std::uint64_t epoch = st->epoch.load();
    const rounds_due due = rounds_at(*st, std::max(epoch + 1, global.epoch));
    if (due.round && (!st->scheduled_round || st->scheduled_round->done))
        st->scheduled_round = schedule(*st, *st->rounds, epoch);
    // With the delayed modes the state round comes later, when the update is applied.
    if (due.state && !st->delayed() && (!st->scheduled_state || st->scheduled_state->done))
        st->scheduled_state = schedule(*st, *st->state, epoch);
}

template <net::transport Transport>
auto collaborative_optimizer<Transport>::rounds_at(const shared& st, std::uint64_t next)
    -> rounds_due {
    const std::uint64_t every = st.options.average_state_every;
    const bool state = every != 0 && next % every == 0;
    if (!st.buffers.empty()) return {true, state}; // gradients, or DiLoCo's pseudo-gradients
    return {!state, state};                        // parameters, or with them the state
}

template <net::transport Transport>
template <class Work>
asio::awaitable<void>
collaborative_optimizer<Transport>::timed(shared_ptr st, duration optimizer_statistics::*phase,
                                          Work& work) {
    const time_point started = st->now();
    co_await offload(st->compute, work);
    std::lock_guard lock(st->mutex);
    st->stats.*phase += st->now() - started;
}

template <net::transport Transport>
asio::awaitable<round_report>
collaborative_optimizer<Transport>::round_or_alone(shared_ptr st, averager_type& averager,
                                                   pending_ptr& scheduled, std::uint64_t epoch,
                                                   double weight, bool alone) {
    round_report out{.outcome = round_outcome::alone,
                     .error = {},
                     .group_size = 1,
                     .fraction_averaged = 0.0,
                     .members_excluded = 0,
                     .parts_refused = 0};
    if (alone)
        co_await abandon(scheduled);
    else {
        pending_ptr pending = std::exchange(scheduled, nullptr);
        out = co_await run_round(st, averager, std::move(pending), epoch, weight);
    }
    count(*st, out);
    co_return out;
}

template <net::transport Transport>
asio::awaitable<void> collaborative_optimizer<Transport>::fill_buffers(shared_ptr st) {
    if (st->buffers.empty()) co_return;
    auto fill = [&self = *st] {
        if (!self.outer) { // the epoch's mean gradient
            const float scale = 1.0f / static_cast<float>(self.samples);
            for (std::size_t i = 0; i < self.buffers.size(); ++i)
                std::transform(self.accumulators[i].begin(), self.accumulators[i].end(),
                               self.buffers[i].begin(), [scale](float x) { return x * scale; });
            return;
        }
        for (std::size_t i = 0; i < self.buffers.size(); ++i) { // θ_start − θ
            const tensor::const_host_view<tensor::tensor_ref> values(self.params[i].value);
            std::transform(self.start_values[i].begin(), self.start_values[i].end(),
                           values.span().begin(), self.buffers[i].begin(), std::minus<float>{});
        }
    };
    co_await timed(st, &optimizer_statistics::accumulating, fill);
}

template <net::transport Transport>
asio::awaitable<void> collaborative_optimizer<Transport>::apply_buffers(shared_ptr st) {
    if (st->buffers.empty()) co_return;
    auto apply = [&self = *st] {
        if (!self.outer) {
            self.local.step(self.buffered);
            return;
        }
        self.outer->step(self.outer_params);
        for (std::size_t i = 0; i < self.params.size(); ++i)
            self.params[i].value.copy_from(self.start_values[i]);
    };
    co_await timed(st, &optimizer_statistics::optimizer_step, apply);
}

template <net::transport Transport>
asio::awaitable<void>
collaborative_optimizer<Transport>::average_state(shared_ptr st, std::uint64_t epoch, bool alone,
                                                  step_report& report) {
    report.state_averaging =
        co_await round_or_alone(st, *st->state, st->scheduled_state, epoch, 1.0, alone);
    if (!st->outer || report.state_averaging.outcome == round_outcome::alone) co_return;
    auto restart = [&self = *st] { // DiLoCo's next epoch starts from the averaged values
        for (std::size_t i = 0; i < self.params.size(); ++i)
            self.params[i].value.copy_to(self.start_values[i]);
    };
    co_await offload(st->compute, restart);
}

template <net::transport Transport>
asio::awaitable<void> collaborative_optimizer<Transport>::end_epoch(shared_ptr st,
                                                                    step_report& report) {
    const auto global = st->tracker.global_progress();
    const std::uint64_t epoch = st->epoch.load();
    const std::uint64_t next = std::max(epoch + 1, global.epoch);
    const bool alone = global.num_keeping_up() <= 1;
    const bool aux = st->role == averaging::member_role::aux;
    const rounds_due due = rounds_at(*st, next);
    report.epoch_ended = true;
    report.samples_contributed = st->samples;
    // Gradients and pseudo-gradients weigh by their samples; parameters count equally.
    const double weight = !st->buffers.empty() && !aux ? static_cast<double>(st->samples) : 1.0;
    if (st->delayed()) {
        co_await apply_delayed(st, true, report); // the previous epoch's update comes first
        if (!aux) co_await fill_buffers(st);
        start_delayed(st, epoch, weight, alone, due.state);
    } else {
        if (!aux) co_await fill_buffers(st);
        if (due.round)
            report.averaging =
                co_await round_or_alone(st, *st->rounds, st->scheduled_round, epoch, weight, alone);
        if (!aux) co_await apply_buffers(st);
        report.update_applied = true;
        if (due.state) co_await average_state(st, epoch, alone, report);
    }
    enter_epoch(*st, next);
    {
        std::lock_guard lock(st->mutex);
        ++st->stats.epochs;
    }
    if (!st->delayed()) co_await publish_served_state(st);
}

} // namespace hivemesh::optim
