// optim::collaborative_optimizer: the delayed modes, where an epoch's gradient round (and the
// optimizer step) run in the background while the next epoch's batches compute (included by
// optim/collaborative.hpp).
#pragma once

#include "hivemesh/optim/collaborative.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>

#include <exception>
#include <memory>
#include <mutex>
#include <utility>

namespace hivemesh::optim {

template <net::transport Transport>
void collaborative_optimizer<Transport>::start_delayed(const shared_ptr& st, std::uint64_t epoch,
                                                       double weight, bool alone, bool state_due) {
    auto d = std::make_shared<delayed_update>(st->executor);
    d->epoch = epoch;
    d->state_due = state_due;
    st->delayed_round = d;
    // run_delayed catches what it throws: it must always finish `d`.
    asio::co_spawn(st->executor, run_delayed(st, std::move(d), weight, alone), asio::detached);
}

template <net::transport Transport>
asio::awaitable<void>
collaborative_optimizer<Transport>::run_delayed(shared_ptr st, std::shared_ptr<delayed_update> d,
                                                double weight, bool alone) {
    try {
        if (!d->dropped) {
            if (alone) {
                co_await abandon(st->scheduled_round);
                d->report = {round_outcome::alone, {}, 1, 0.0};
            } else if (st->closed && (!st->scheduled_round || st->scheduled_round->done)) {
                // Closed before it began: no new search, which close would not wait for.
                d->report = {round_outcome::failed, make_error_code(errc::cancelled), 0, 0.0};
                d->dropped = true;
            } else {
                auto pending = std::exchange(st->scheduled_round, nullptr);
                if (!pending || pending->done) pending = schedule(*st, *st->rounds, d->epoch);
                d->round = pending;
                d->report =
                    co_await run_round(st, *st->rounds, std::move(pending), d->epoch, weight);
            }
            count(*st, d->report);
        }
        if (!d->dropped && st->options.delay_optimizer_step &&
            st->role != averaging::member_role::aux) {
            // On a copy: the trainer reads the parameters meanwhile. This runs between the
            // trainer's steps, so it reads them only while the optimizer is open.
            bool closed = false;
            auto step = [&self = *st, &closed] {
                {
                    std::lock_guard lock(self.background_mutex);
                    closed = self.closed;
                    if (closed) return;
                    for (std::size_t i = 0; i < self.params.size(); ++i)
                        self.params[i].value.copy_to(self.update_values[i]);
                }
                self.local.step(self.update_params);
            };
            co_await timed(st, &optimizer_statistics::optimizer_step, step);
            if (closed) d->dropped = true;
        }
    } catch (...) {
        const auto ec = escaped_exception_code(std::current_exception(),
                                               "optim::collaborative_optimizer delayed update");
        d->report = {round_outcome::failed, ec, 0, 0.0};
        d->dropped = true; // nothing of it is applied
    }
    d->done = true;
    d->finished.notify();
    st->round_ended->notify();
}

template <net::transport Transport>
asio::awaitable<void> collaborative_optimizer<Transport>::apply_delayed(shared_ptr st, bool wait,
                                                                        step_report& report) {
    const auto d = st->delayed_round;
    if (!d || (!d->done && !wait)) co_return;
    while (!d->done)
        co_await d->finished.wait();
    st->delayed_round.reset();
    report.averaging = d->report;
    if (d->dropped) co_return;
    if (st->role != averaging::member_role::aux) {
        if (st->options.delay_optimizer_step) {
            auto copy_in = [&self = *st] {
                for (std::size_t i = 0; i < self.params.size(); ++i)
                    self.params[i].value.copy_from(self.update_values[i]);
            };
            co_await timed(st, &optimizer_statistics::optimizer_step, copy_in);
        } else {
            co_await apply_buffers(st);
        }
    }
    report.update_applied = true;
    if (d->state_due) {
        const bool alone = st->tracker.global_progress().num_keeping_up() <= 1;
        co_await average_state(st, d->epoch, alone, report);
    }
    co_await publish_served_state(st);
}

template <net::transport Transport>
asio::awaitable<void> collaborative_optimizer<Transport>::drop_delayed(shared_ptr st) {
    const auto d = std::exchange(st->delayed_round, nullptr);
    if (!d || d->done) co_return;
    d->dropped = true;
    if (d->round && !d->round->done) d->round->cancel.emit(asio::cancellation_type::all);
    while (!d->done)
        co_await d->finished.wait();
}

} // namespace hivemesh::optim
