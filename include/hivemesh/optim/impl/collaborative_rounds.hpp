// optim::collaborative_optimizer: averaging rounds scheduled ahead, triggered at the end of
// an epoch, and what they report (included by optim/collaborative.hpp).
#pragma once

#include "hivemesh/optim/collaborative.hpp"

#include <asio/bind_cancellation_slot.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/awaitable_operators.hpp>

#include <algorithm>
#include <memory>
#include <mutex>
#include <utility>

namespace hivemesh::optim {

template <net::transport Transport>
std::size_t collaborative_optimizer<Transport>::expected_members(const shared& st) {
    // The group is complete once it holds every peer the tracker counts (aux peers publish
    // no record and are not expected): it need not wait for target_group_size peers, or the
    // end of matchmaking_time, which may come long after the end of a short epoch. Without
    // the delayed modes a peer enters the next epoch only after its rounds, so a peer already
    // there is not coming (e.g. one half of a healed partition, an epoch ahead of the other).
    // Nor are the peers more than an epoch behind: they load the state first, or are gone.
    // With a Moshpit key the peers spread over several groups, and the count says nothing.
    if (st.options.averaging.group_key_length != 0) return 0;
    const auto global = st.tracker.global_progress();
    return st.delayed() ? global.num_keeping_up() : global.num_keeping_up() - global.num_ahead;
}

template <net::transport Transport>
auto collaborative_optimizer<Transport>::schedule(shared& st, averager_type& averager,
                                                  std::uint64_t epoch) -> pending_ptr {
    auto pending = std::make_shared<pending_round>(st.executor);
    pending->control = averager.make_control(detail::round_tag(epoch), expected_members(st));
    averager.async_scheduled_step(
        pending->control,
        asio::bind_cancellation_slot(
            pending->cancel.slot(),
            [pending, ended = st.round_ended](std::error_code ec, averaging::step_result r) {
                pending->done = true;
                pending->error = ec;
                pending->result = std::move(r);
                pending->finished.notify();
                ended->notify();
            }));
    return pending;
}

template <net::transport Transport>
asio::awaitable<round_report>
collaborative_optimizer<Transport>::run_round(shared_ptr st, averager_type& averager,
                                              pending_ptr pending, std::uint64_t epoch,
                                              double weight) {
    // A step that ended before its trigger found no group: look again, now.
    if (!pending || pending->done) pending = schedule(*st, averager, epoch);
    pending->triggered_at = st->now();
    pending->control->expect(expected_members(*st));
    pending->control->trigger(weight);
    // Counted afresh at every estimate while the group forms: peers move on meanwhile.
    bool tracking = true;
    while (!pending->done) {
        if (!tracking) {
            co_await pending->finished.wait();
            continue;
        }
        using namespace asio::experimental::awaitable_operators;
        const std::uint64_t seen = st->tracker.global_progress().version;
        auto woke = co_await (pending->finished.wait() ||
                              st->tracker.async_wait_for_update(
                                  seen, asio::experimental::as_tuple(asio::use_awaitable)));
        if (woke.index() == 0) continue;
        tracking = !std::get<0>(std::get<1>(woke)); // not after the tracker closed
        if (tracking && !pending->done) pending->control->expect(expected_members(*st));
    }
    const time_point ended = st->now();
    const averaging::step_result& r = pending->result;
    const bool began = r.allreduce_started != time_point{};

    round_report out;
    out.error = pending->error;
    out.group_size = r.group_size;
    out.fraction_averaged = began ? r.allreduce.fraction_averaged() : 0.0;
    out.members_excluded = static_cast<std::size_t>(
        std::count(r.allreduce.excluded.begin(), r.allreduce.excluded.end(), true));
    out.parts_refused = r.allreduce.parts_refused;
    if (!out.error && out.fraction_averaged >= 1)
        out.outcome = round_outcome::averaged;
    else if (began && r.allreduce.elements_averaged > 0)
        out.outcome = round_outcome::partial;
    else
        out.outcome = round_outcome::failed;
    {
        std::lock_guard lock(st->mutex);
        auto& s = st->stats;
        s.waiting_for_group += (began ? r.allreduce_started : ended) - pending->triggered_at;
        if (began) s.averaging += ended - r.allreduce_started;
        s.bytes_sent += r.allreduce.bytes_sent;
        s.bytes_received += r.allreduce.bytes_received;
    }
    if (out.outcome != round_outcome::averaged)
        log::warning("optim", averager.options().prefix, " round of epoch ", epoch, " ",
                     to_string(out.outcome), " (",
                     out.error ? out.error.message() : "a member failed", ", ",
                     out.fraction_averaged * 100,
                     "% averaged): using this peer's own values "
                     "for the rest");
    co_return out;
}

template <net::transport Transport>
asio::awaitable<void> collaborative_optimizer<Transport>::abandon(pending_ptr& slot) {
    const pending_ptr pending = std::exchange(slot, nullptr);
    if (!pending || pending->done) co_return;
    pending->cancel.emit(asio::cancellation_type::all);
    while (!pending->done)
        co_await pending->finished.wait();
}

template <net::transport Transport>
void collaborative_optimizer<Transport>::count(shared& st, const round_report& r) {
    std::lock_guard lock(st.mutex);
    auto& s = st.stats;
    switch (r.outcome) {
    case round_outcome::none:
        break;
    case round_outcome::averaged:
        ++s.rounds_averaged;
        break;
    case round_outcome::partial:
        ++s.rounds_partial;
        break;
    case round_outcome::failed:
        ++s.rounds_failed;
        break;
    case round_outcome::alone:
        ++s.rounds_alone;
        break;
    }
    s.members_excluded += r.members_excluded;
    s.parts_refused += r.parts_refused;
}

} // namespace hivemesh::optim
