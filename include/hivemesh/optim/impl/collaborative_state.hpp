// optim::collaborative_optimizer: construction and closing, the state it serves, and catching
// up with the swarm by downloading state (included by optim/collaborative.hpp).
#pragma once

#include "hivemesh/optim/collaborative.hpp"

#include <asio/detached.hpp>
#include <asio/post.hpp>

#include <algorithm>
#include <cmath>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace hivemesh::optim {

template <net::transport Transport>
collaborative_optimizer<Transport>::shared::shared(peer_type& peer, std::vector<parameter> p,
                                                   model_buffers m, local_optimizer optimizer,
                                                   collaborative_options o,
                                                   averaging::member_role r)
    : executor(peer.get_executor())
    , compute(peer.compute_executor())
    , options(std::move(o))
    , role(r)
    , params(std::move(p))
    , model(std::move(m))
    , local(std::move(optimizer))
    , tracker(peer,
              [&] {
                  progress::tracker_options t = options.tracking;
                  t.run_id = options.run_id;
                  t.target_batch_size = options.target_batch_size;
                  t.client = r == averaging::member_role::client;
                  t.reports_samples = r != averaging::member_role::aux;
                  return t;
              }())
    , round_ended(std::make_shared<wakeup>(executor)) {}

template <net::transport Transport>
collaborative_optimizer<Transport>::collaborative_optimizer(peer_type& peer,
                                                            std::vector<parameter> params,
                                                            local_optimizer optimizer,
                                                            collaborative_options options,
                                                            model_buffers buffers) {
    using averaging::member_role;
    options = detail::checked(std::move(options));
    if (params.empty()) detail::throw_invalid(detail::collaborative_who, "no parameters");
    detail::check_parameters(params, detail::collaborative_who);
    member_role role = options.role;
    if (peer.client_mode()) {
        if (role == member_role::aux)
            detail::throw_invalid(detail::collaborative_who,
                                  "an aux peer reduces for others, so it cannot be in client "
                                  "mode");
        role = member_role::client;
    }
    if (options.delay_optimizer_step && optimizer.name().starts_with("torch:"))
        detail::throw_invalid(detail::collaborative_who,
                              "delay_optimizer_step needs an optimizer that updates the values "
                              "it is given; " +
                                  optimizer.name() + " updates its module's own tensors");
    state_ = std::make_shared<shared>(peer, std::move(params), std::move(buffers),
                                      std::move(optimizer), std::move(options), role);
    auto& st = *state_;
    const auto& o = st.options;
    st.epoch = o.tracking.initial_epoch;

    // The parameters with the buffers that must agree with them.
    std::vector<tensor::tensor_ref> values;
    for (const auto& p : st.params)
        values.push_back(p.value);
    values.insert(values.end(), st.model.averaged.begin(), st.model.averaged.end());
    st.state_tensors = values;
    st.averaged_state = values;
    const auto local_state = st.local.state_tensors(st.params);
    st.state_tensors.insert(st.state_tensors.end(), local_state.begin(), local_state.end());
    if (!o.average_opt_statistics) {
        st.averaged_state.insert(st.averaged_state.end(), local_state.begin(), local_state.end());
    } else {
        const auto names = st.local.state_names(st.params);
        if (names.size() != local_state.size())
            detail::throw_invalid(detail::collaborative_who,
                                  "average_opt_statistics: " + st.local.name() +
                                      " does not name its state tensors");
        for (const auto& wanted : *o.average_opt_statistics)
            if (std::find(names.begin(), names.end(), wanted) == names.end())
                detail::throw_invalid(detail::collaborative_who,
                                      "average_opt_statistics: " + st.local.name() +
                                          " has no state named \"" + wanted + "\"");
        for (std::size_t i = 0; i < local_state.size(); ++i)
            if (std::find(o.average_opt_statistics->begin(), o.average_opt_statistics->end(),
                          names[i]) != o.average_opt_statistics->end())
                st.averaged_state.push_back(local_state[i]);
    }
    if (!o.use_local_updates || o.outer_optimizer)
        st.buffers = detail::copies_of(parameter_values(st));
    if (!o.use_local_updates)
        for (std::size_t i = 0; i < st.params.size(); ++i) {
            st.accumulators.emplace_back(st.params[i].value.size(), 0.0f);
            st.buffered.push_back({st.params[i].value, st.buffers[i]});
        }
    if (o.outer_optimizer) {
        st.outer.emplace(sgd(*o.outer_optimizer));
        st.start_values = detail::copies_of(parameter_values(st));
        for (std::size_t i = 0; i < st.params.size(); ++i)
            st.outer_params.push_back({st.start_values[i], st.buffers[i]});
        for (const auto& t : st.outer->state_tensors(st.outer_params)) {
            st.state_tensors.push_back(t);
            st.averaged_state.push_back(t);
        }
    }
    if (o.delay_optimizer_step) {
        st.update_values = detail::copies_of(parameter_values(st));
        for (std::size_t i = 0; i < st.params.size(); ++i)
            st.update_params.push_back({st.update_values[i], st.buffers[i]});
    }

    const auto announce = peer.announce_endpoint();
    if (!st.buffers.empty()) {
        const std::vector<tensor::tensor_ref> buffers(st.buffers.begin(), st.buffers.end());
        const std::string suffix = o.outer_optimizer ? "_outer" : "_grads";
        const auto codec = o.outer_optimizer ? o.state_compression : o.grad_compression;
        st.rounds = std::make_unique<averager_type>(
            peer.rpc(), peer.dht(), announce, buffers,
            detail::round_options(o, o.run_id + suffix, role, codec, o.outer_optimizer.has_value()),
            st.compute);
    } else if (o.average_state_every != 1) {
        st.rounds = std::make_unique<averager_type>(
            peer.rpc(), peer.dht(), announce, values,
            detail::round_options(o, o.run_id + "_params", role, o.state_compression, true),
            st.compute);
    }
    st.state = std::make_unique<averager_type>(
        peer.rpc(), peer.dht(), announce, st.averaged_state,
        detail::round_options(o, o.run_id, role, o.state_compression, true), st.compute);

    if (o.learning_rate_schedule) st.local.set_learning_rate(o.learning_rate_schedule(st.epoch));
    // A donor serves the snapshot of its latest epoch; aux peers' parameters are not trained.
    if (announce && role == member_role::node) {
        st.server = std::make_shared<served_state>();
        refresh_served_state(st);
        averaging::server_options serving;
        serving.codec = o.state_compression;
        st.state->serve_state(
            [box = st.server] {
                std::lock_guard lock(box->mutex);
                return *box->current;
            },
            static_cast<double>(st.epoch.load()), serving);
    }
}

template <net::transport Transport>
collaborative_optimizer<Transport>::~collaborative_optimizer() {
    close();
}

template <net::transport Transport>
void collaborative_optimizer<Transport>::close() {
    if (!begin_close(state_, nullptr)) return;
    // The rest on the executor: the scheduled rounds' signals and the server are its alone.
    asio::post(state_->executor, [st = state_] { stop_on_executor(*st, nullptr); });
}

template <net::transport Transport>
bool collaborative_optimizer<Transport>::begin_close(const shared_ptr& st,
                                                     const closing_ptr& waiting) {
    if (st->closed.exchange(true)) return false;
    // Waits out the background step's read of the parameters; none starts after this.
    { const std::lock_guard lock(st->background_mutex); }
    // Started here, while the caller knows the peer runs; completes on its executor.
    if (waiting)
        st->tracker.async_close([waiting](std::error_code ec) {
            waiting->progress_record = ec;
            waiting->stored.notify();
        });
    else
        st->tracker.close();
    return true;
}

template <net::transport Transport>
void collaborative_optimizer<Transport>::stop_on_executor(shared& st, const closing_ptr& waiting) {
    cancel_rounds(st);
    auto* server = st.state->state_server_ptr();
    if (!waiting) {
        if (server) server->stop();
        return;
    }
    if (!server) {
        waiting->donor_record = std::error_code{};
        return;
    }
    server->async_stop([waiting](std::error_code ec) {
        waiting->donor_record = ec;
        waiting->stored.notify();
    });
}

template <net::transport Transport>
bool collaborative_optimizer<Transport>::cancel_rounds(shared& st) {
    bool running = false;
    // Emitting again while a round winds down only repeats the request.
    const auto cancel = [&](const pending_ptr& pending) {
        if (!pending || pending->done) return;
        pending->cancel.emit(asio::cancellation_type::all);
        running = true;
    };
    cancel(st.scheduled_round);
    cancel(st.scheduled_state);
    if (const auto& d = st.delayed_round; d && !d->done) {
        cancel(d->round);
        running = true;
    }
    return running;
}

template <net::transport Transport>
void collaborative_optimizer<Transport>::close_and_wait(
    const shared_ptr& st, erased_handler<void(std::error_code)> handler) {
    auto waiting = std::make_shared<closing>(st->executor);
    if (!begin_close(st, waiting)) {
        asio::post(st->executor, [handler = std::move(handler)]() mutable {
            std::move(handler)(std::error_code{});
        });
        return;
    }
    // Not cancellable: the handler's slot is not passed on.
    co_launch(
        st->executor, close_rest(st, std::move(waiting)),
        [handler = std::move(handler)](std::error_code ec) mutable { std::move(handler)(ec); },
        "optim::collaborative_optimizer::async_close");
}

template <net::transport Transport>
asio::awaitable<std::error_code>
collaborative_optimizer<Transport>::close_rest(shared_ptr st, closing_ptr waiting) {
    stop_on_executor(*st, waiting);
    // A cancelled round withdraws its matchmaking declaration as its search ends, so the
    // withdrawals are all counted once the rounds have ended. Cancelled again at each
    // wake-up: the delayed update may only now have started its round.
    while (cancel_rounds(*st))
        co_await st->round_ended->wait();
    std::error_code withdrawals;
    for (auto* averager : {st->rounds.get(), st->state.get()}) {
        if (!averager) continue;
        auto [ec] = co_await averager->async_wait_withdrawals();
        if (!withdrawals) withdrawals = ec;
    }
    while (!waiting->progress_record || !waiting->donor_record)
        co_await waiting->stored.wait();
    for (const std::error_code ec :
         {*waiting->progress_record, *waiting->donor_record, withdrawals})
        if (ec) co_return ec;
    co_return std::error_code{};
}

template <net::transport Transport>
void collaborative_optimizer<Transport>::refresh_served_state(shared& st) {
    if (!st.serves_state()) return;
    auto snapshot = std::make_shared<averaging::state_snapshot>();
    snapshot->metadata =
        encode(state_metadata{st.epoch.load(), st.local.step_count(), integer_values(st)});
    snapshot->tensors = detail::copies_of(st.state_tensors);
    std::lock_guard lock(st.server->mutex);
    st.server->current = std::move(snapshot);
}

template <net::transport Transport>
asio::awaitable<void> collaborative_optimizer<Transport>::publish_served_state(shared_ptr st) {
    if (!st->serves_state()) co_return;
    auto refresh = [&] { refresh_served_state(*st); };
    co_await offload(st->compute, refresh);
    if (auto* server = st->state->state_server_ptr(); server && !st->closed) {
        server->set_priority(static_cast<double>(st->epoch.load()));
        server->async_advertise(asio::detached);
    }
}

template <net::transport Transport>
void collaborative_optimizer<Transport>::enter_epoch(shared& st, std::uint64_t epoch) {
    st.epoch = epoch;
    st.samples = 0;
    st.accumulated_steps = 0;
    st.tracker.update_epoch(epoch);
    if (st.options.learning_rate_schedule)
        st.local.set_learning_rate(st.options.learning_rate_schedule(epoch));
    st.check_sync = true;
    st.fetch_mark = st.tracker.statistics().fetches;
}

template <net::transport Transport>
std::vector<std::vector<std::int64_t>>
collaborative_optimizer<Transport>::integer_values(const shared& st) {
    std::vector<std::vector<std::int64_t>> out;
    out.reserve(st.model.carried.size());
    for (const auto& t : st.model.carried)
        out.push_back(t.values());
    return out;
}

template <net::transport Transport>
std::error_code collaborative_optimizer<Transport>::write_integers(
    shared& st, const std::vector<std::vector<std::int64_t>>& values) {
    const auto before = integer_values(st);
    for (std::size_t i = 0; i < values.size(); ++i) {
        try {
            st.model.carried[i].copy_from(values[i]);
        } catch (const std::system_error& e) {
            log::warning("optim", "integer buffer ", i, " refused its new values: ", e.what());
            for (std::size_t j = 0; j < i; ++j)
                st.model.carried[j].copy_from(before[j]);
            return errc::invalid_argument;
        }
    }
    return {};
}

template <net::transport Transport>
bool collaborative_optimizer<Transport>::should_load_state(shared& st) {
    if (st.role == averaging::member_role::aux || st.now() < st.next_load_attempt) return false;
    const std::uint64_t global = st.tracker.global_progress().epoch;
    const std::uint64_t local = st.epoch.load();
    // Once per epoch, after the first read of the DHT in it, the epochs must agree; otherwise
    // one epoch behind is a peer that has not yet noticed the end of the epoch.
    if (st.check_sync && st.tracker.statistics().fetches > st.fetch_mark) {
        st.check_sync = false;
        return local < global;
    }
    return local + 1 < global;
}

template <net::transport Transport>
std::error_code collaborative_optimizer<Transport>::apply_state(shared& st,
                                                                const averaging::state_snapshot& s,
                                                                state_metadata& meta) {
    if (auto ec = decode(s.metadata, meta)) return ec;
    if (s.tensors.size() != st.state_tensors.size() ||
        !detail::same_sizes(st.model.carried, meta.integer_buffers))
        return errc::size_mismatch;
    for (std::size_t i = 0; i < s.tensors.size(); ++i) {
        if (s.tensors[i].size() != st.state_tensors[i].size()) return errc::size_mismatch;
        for (const float x : s.tensors[i])
            if (!std::isfinite(x)) return errc::corrupt_data;
    }
    // First the integers, the only writes that can fail (and then are undone).
    if (auto ec = write_integers(st, meta.integer_buffers)) return ec;
    for (std::size_t i = 0; i < s.tensors.size(); ++i)
        st.state_tensors[i].copy_from(s.tensors[i]);
    for (std::size_t i = 0; i < st.start_values.size(); ++i) // DiLoCo starts from them
        st.start_values[i] = s.tensors[i];
    st.local.set_step_count(meta.step_count);
    return {};
}

template <net::transport Transport>
asio::awaitable<std::error_code> collaborative_optimizer<Transport>::load_state(shared_ptr st) {
    co_await drop_delayed(st);
    co_await abandon(st->scheduled_round);
    co_await abandon(st->scheduled_state);
    const time_point started = st->now();
    averaging::load_options how;
    how.timeout = st->options.load_state_timeout;
    auto [error, downloaded] = co_await st->state->async_load_state_from_peers(std::move(how));
    std::error_code ec = error;
    const averaging::downloaded_state got = std::move(downloaded);
    state_metadata meta;
    std::uint64_t values = 0;
    if (!ec) {
        auto apply = [&] { ec = apply_state(*st, got.contents, meta); };
        co_await offload(st->compute, apply);
        for (const auto& t : got.contents.tensors)
            values += t.size();
    }
    {
        std::lock_guard lock(st->mutex);
        st->stats.state_download += st->now() - started;
        st->stats.samples_discarded += st->samples;
        if (ec) {
            ++st->stats.state_load_failures;
        } else {
            ++st->stats.state_loads;
            st->stats.state_bytes_downloaded += values * sizeof(float);
        }
    }
    if (ec) {
        log::warning("optim", "loading state from peers failed: ", ec.message(),
                     "; training on from epoch ", st->epoch.load());
        // Not at every step: a swarm without donors would stall every step.
        st->next_load_attempt = st->now() + st->options.matchmaking_time;
        st->samples = 0;
        st->accumulated_steps = 0;
        st->tracker.report_local_progress(st->epoch.load(), 0);
        co_return ec;
    }
    // A donor that has not yet noticed the end of its epoch is one behind the swarm.
    const std::uint64_t global = st->tracker.global_progress().epoch;
    const std::uint64_t epoch = meta.epoch + 1 == global ? global : meta.epoch;
    log::info("optim", "loaded the state of epoch ", meta.epoch, " from ", got.donor.short_string(),
              "; now at epoch ", epoch);
    enter_epoch(*st, epoch);
    co_await publish_served_state(st);
    co_return std::error_code{};
}

template <net::transport Transport>
asio::awaitable<std::error_code>
collaborative_optimizer<Transport>::load_state_alone(shared_ptr st) {
    if (st->stepping.exchange(true)) co_return errc::invalid_argument;
    const detail::flag_release release{st->stepping};
    co_return co_await load_state(st);
}

} // namespace hivemesh::optim
