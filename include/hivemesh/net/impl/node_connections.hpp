// The RPC node's life and connection pool: construction, listening, dialing (one dial per
// peer at a time), accepting, the secure handshake, least-recently-used eviction and the idle
// sweep (included by net/node.hpp).
#pragma once

#include "hivemesh/net/node.hpp"

namespace hivemesh::net {

template <transport Transport>
node<Transport>::node(Transport& transport, crypto::identity identity, node_options options)
    : state_(std::make_shared<state>(transport, std::move(identity), checked(std::move(options)))) {
    asio::co_spawn(state_->executor, sweep_idle(state_), asio::detached);
}

template <transport Transport>
node_options node<Transport>::checked(node_options options) {
    if (const auto error = rate_limit_error(options); !error.empty())
        throw std::invalid_argument("hivemesh::net::node_options::" + error);
    const datagram_options& d = options.datagrams;
    if (d.max_size < 128 || d.max_size > 65507 || d.attempts == 0 ||
        d.retry_interval <= duration::zero() || d.min_retry_interval <= duration::zero() ||
        d.max_serving == 0 || d.max_cached_keys == 0 || d.max_clock_skew <= duration::zero() ||
        !(d.max_new_keys_per_second >= 0) || !std::isfinite(d.max_new_keys_per_second))
        throw std::invalid_argument(
            "hivemesh::net::node_options::datagrams: out of range (max_size 128..65507; "
            "attempts, max_serving, max_cached_keys at least 1; retry intervals and "
            "max_clock_skew positive; max_new_keys_per_second finite, 0 or more)");
    return options;
}

template <transport Transport>
node<Transport>::~node() {
    close_now(); // no drain past the node's life: what runs it (the executor) may go next
}

template <transport Transport>
void node<Transport>::close_now() {
    close();
    for (auto connections = state_->connections; auto& [id, list] : connections)
        for (auto& pooled : list)
            pooled.connection->close();
}

template <transport Transport>
void node<Transport>::serve(listener_type listener) {
    auto shared = std::make_shared<listening>(std::move(listener), state_->executor);
    state_->listeners.push_back(shared);
    if (state_->sealer) open_datagrams(state_, shared->listener.local_endpoint(), true);
    asio::co_spawn(state_->executor, accept_loop(state_, shared), asio::detached);
}

template <transport Transport>
std::vector<typename node<Transport>::connection_info> node<Transport>::connections() const {
    std::vector<connection_info> out;
    for (const auto& [id, list] : state_->connections)
        for (const auto& pooled : list)
            out.push_back({id, pooled.connection->we_dialed(), pooled.connection->stream_count(),
                           pooled.connection->statistics()});
    return out;
}

template <transport Transport>
node_statistics node<Transport>::statistics() const {
    node_statistics out = state_->statistics; // streams_refused: of the closed connections
    for (const auto& [id, list] : state_->connections)
        for (const auto& pooled : list) {
            ++out.open_connections;
            out.open_streams += pooled.connection->stream_count();
            out.streams_refused += pooled.connection->statistics().streams_refused;
        }
    if (const auto& up = state_->upload) {
        out.upload_delayed_bytes = up->delayed_bytes();
        out.upload_delay = up->delay();
    }
    if (const auto& down = state_->download) {
        out.download_delayed_bytes = down->delayed_bytes();
        out.download_delay = down->delay();
    }
    return out;
}

template <transport Transport>
std::size_t node<Transport>::connection_count() const {
    std::size_t n = 0;
    for (const auto& [id, list] : state_->connections)
        n += list.size();
    return n;
}

template <transport Transport>
std::optional<crypto::public_key> node<Transport>::key_of(const crypto::peer_id& peer) const {
    const auto it = state_->connections.find(peer);
    if (it == state_->connections.end() || it->second.empty()) return std::nullopt;
    return it->second.front().remote_key;
}

template <transport Transport>
asio::awaitable<std::error_code> node<Transport>::connect(peer target) {
    std::shared_ptr<mux_connection> connection;
    co_return co_await connect(state_, std::move(target), connection);
}

template <transport Transport>
void node<Transport>::close() {
    auto st = state_;
    if (st->closed) return;
    st->closed = true;
    for (auto& l : st->listeners) {
        l->listener.close();
        l->retry.cancel();
    }
    st->listeners.clear();
    for (auto& port : st->datagram_ports)
        port.socket->close();
    st->datagram_ports.clear();
    for (auto& [call, wait] : st->datagram_calls)
        wait->wake.notify(); // unanswered: they end with connection_closed
    for (auto connections = st->connections; auto& [id, list] : connections)
        for (auto& pooled : list) {
            const auto& connection = pooled.connection;
            if (connection->stream_count() == 0 || st->options.drain_timeout <= duration::zero()) {
                connection->close();
                continue;
            }
            connection->go_away();
            ++st->draining;
            asio::co_spawn(st->executor, drain(st, connection), asio::detached);
        }
    st->sweep_timer.cancel();
}

template <transport Transport>
asio::awaitable<void> node<Transport>::drain(state_ptr st,
                                             std::shared_ptr<mux_connection> connection) {
    using namespace asio::experimental::awaitable_operators;
    timer_type timer(st->executor);
    timer.expires_after(st->options.drain_timeout);
    co_await (connection->until_idle() ||
              timer.async_wait(asio::experimental::as_tuple(asio::use_awaitable)));
    if (connection->stream_count() > 0) {
        st->drain_cut = true;
        log::debug("net", "drain cut ", connection->stream_count(), " stream(s) to ",
                   connection->remote().short_string());
    }
    connection->close();
    if (--st->draining == 0) {
        for (auto& waiter : st->drain_waiters)
            waiter->notify();
        st->drain_waiters.clear();
    }
}

template <transport Transport>
asio::awaitable<std::error_code> node<Transport>::drained(state_ptr st) {
    if (st->draining > 0) {
        auto waiter = std::make_shared<wakeup>(st->executor);
        st->drain_waiters.push_back(waiter);
        co_await waiter->wait();
    }
    co_return st->drain_cut ? make_error_code(errc::timeout) : std::error_code{};
}

template <transport Transport>
std::shared_ptr<mux_connection> node<Transport>::find_connection(const state_ptr& st,
                                                                 const crypto::peer_id& id) {
    const auto it = st->connections.find(id);
    if (it == st->connections.end()) return nullptr;
    // Two nodes that dialed each other at once hold two connections. Both prefer the one the
    // smaller PeerId dialed, so each pair's traffic shares one TCP flow both ways and the
    // other goes idle and closes, with its descriptor and buffers.
    const bool prefer_ours = st->identity.id() < id;
    pooled_connection* chosen = nullptr;
    for (auto& pooled : it->second) {
        if (!pooled.connection->accepts_streams()) continue;
        if (!chosen) chosen = &pooled;
        if (pooled.connection->we_dialed() == prefer_ours) {
            chosen = &pooled;
            break;
        }
    }
    if (!chosen) return nullptr;
    mark_used(st, *chosen);
    return chosen->connection;
}

template <transport Transport>
void node<Transport>::mark_used(const state_ptr& st, pooled_connection& pooled) {
    auto entry = st->by_use.extract(pooled.last_used); // moved, not reallocated
    pooled.last_used = entry.key() = ++st->use_clock;
    st->by_use.insert(std::move(entry));
}

template <transport Transport>
void node<Transport>::touch(const state_ptr& st, const crypto::peer_id& remote,
                            const mux_connection* connection) {
    const auto it = st->connections.find(remote);
    if (it == st->connections.end()) return;
    for (auto& pooled : it->second)
        if (pooled.connection.get() == connection) mark_used(st, pooled);
}

template <transport Transport>
bool node<Transport>::close_idle(const state_ptr& st) {
    const auto idle = std::find_if(st->by_use.begin(), st->by_use.end(), [](const auto& entry) {
        const mux_connection& c = *entry.second;
        return c.is_open() && c.stream_count() == 0 && c.activity() > 0;
    });
    if (idle == st->by_use.end()) return false;
    ++st->statistics.connections_evicted;
    // Its descriptor is released at once, and it leaves the pool (kept alive meanwhile).
    idle->second->shared_from_this()->close();
    return true;
}

template <transport Transport>
void node<Transport>::make_room(const state_ptr& st) {
    while (st->by_use.size() >= st->options.max_connections && close_idle(st)) {
    }
}

template <transport Transport>
asio::awaitable<std::error_code> node<Transport>::secure(state_ptr st, stream_type raw,
                                                         crypto::role side,
                                                         std::optional<crypto::peer_id> expected,
                                                         std::shared_ptr<mux_connection>& out) {
    using namespace asio::experimental::awaitable_operators;
    secure_stream<capped_stream> stream(capped_stream(std::move(raw), st->upload, st->download));
    timer_type timer(st->executor);
    timer.expires_after(st->options.dial_timeout);
    auto watchdog = [&]() -> asio::awaitable<std::error_code> {
        auto [ec] = co_await timer.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
        if (!ec) stream.close();
        co_return make_error_code(errc::timeout);
    };
    const time_point now = transport_now<Transport>(st->executor);
    // The handshake calls these before it completes, while `st` is held here.
    crypto::resumption resume;
    if (side == crypto::role::dialer && expected)
        resume.offer = st->tickets.for_peer(*expected, now);
    else if (side == crypto::role::listener)
        resume.find = [s = st.get(), now](const crypto::ticket_id& id) {
            return s->tickets.with_id(id, now);
        };
    resume.keep = [s = st.get(), now](const crypto::resumption_ticket& ticket) {
        s->tickets.insert(ticket, now, s->options.resumption_lifetime);
    };
    const bool offered = resume.offer.has_value();
    auto result = co_await (
        stream.handshake(side, st->identity, expected, st->options.security, std::move(resume)) ||
        watchdog());
    std::error_code ec = result.index() == 0 ? std::get<0>(result) : std::get<1>(result);
    if (!ec && st->closed) ec = errc::connection_closed;
    if (ec) {
        // A ticket the peer answered but could not prove is no use again.
        if (offered && ec == errc::handshake_failed) st->tickets.erase(*expected);
        stream.close();
        co_return ec;
    }
    ++st->statistics.handshakes_completed;
    if (stream.resumed()) ++st->statistics.handshakes_resumed;
    const crypto::peer_id remote = stream.remote_id();
    const crypto::public_key remote_key = stream.remote_key();
    if (at_peer_cap(st, remote)) {
        stream.close();
        ++st->statistics.connections_refused;
        log::debug("net", "closed a connection of ", remote.short_string(),
                   ": it holds max_connections_per_peer");
        // A dial that raced the peer's own connections uses one of those instead.
        if (side == crypto::role::dialer)
            if ((out = find_connection(st, remote))) co_return std::error_code{};
        co_return errc::refused;
    }
    // Both ends negotiated the same cipher, so they agree on the frame size too.
    mux_options mux = st->options.mux;
    if (stream.cipher() != crypto::cipher::plaintext)
        mux.frame_payload = mux.encrypted_frame_payload;
    // Under an upload cap a batch waits for the bucket whole: keep it within a burst, so a
    // small call queued behind bulk data waits one burst's time, not a megabyte's.
    if (st->upload) mux.max_batch_bytes = std::min(mux.max_batch_bytes, st->upload->burst());
    auto connection = std::make_shared<mux_connection>(
        st->executor,
        std::make_unique<detail::secure_record_channel<Transport, capped_stream>>(
            std::move(stream)),
        remote, side == crypto::role::dialer, mux);
    if (st->options.max_connections > 0) make_room(st);
    st->connections[remote].push_back({connection, remote_key, ~std::uint64_t{0}, ++st->use_clock});
    st->by_use.emplace(st->use_clock, connection.get());
    std::weak_ptr<state> weak = st;
    std::weak_ptr<mux_connection> weak_connection = connection;
    connection->start(
        {},
        [weak, weak_connection, remote, remote_key](mux_stream incoming) {
            if (auto st = weak.lock()) {
                if (st->options.max_connections > 0)
                    touch(st, remote, weak_connection.lock().get());
                asio::co_spawn(st->executor, serve_call(st, std::move(incoming), remote_key),
                               asio::detached);
            }
        },
        [weak, weak_connection, remote](std::error_code) {
            if (auto st = weak.lock()) forget(st, remote, weak_connection.lock().get());
        });
    out = std::move(connection);
    co_return std::error_code{};
}

template <transport Transport>
void node<Transport>::forget(const state_ptr& st, const crypto::peer_id& remote,
                             const mux_connection* connection) {
    const auto it = st->connections.find(remote);
    if (it == st->connections.end()) return;
    std::erase_if(it->second, [&](const pooled_connection& p) {
        if (p.connection.get() != connection) return false;
        st->by_use.erase(p.last_used);
        st->statistics.streams_refused += p.connection->statistics().streams_refused;
        return true;
    });
    if (it->second.empty()) st->connections.erase(it);
}

template <transport Transport>
bool node<Transport>::at_peer_cap(const state_ptr& st, const crypto::peer_id& remote) {
    const std::size_t limit = st->options.max_connections_per_peer;
    if (limit == 0) return false;
    const auto it = st->connections.find(remote);
    if (it == st->connections.end()) return false;
    return std::count_if(it->second.begin(), it->second.end(), [](const pooled_connection& p) {
               return p.connection->is_open();
           }) >= static_cast<std::ptrdiff_t>(limit);
}

template <transport Transport>
asio::awaitable<std::error_code> node<Transport>::connect(state_ptr st, peer target,
                                                          std::shared_ptr<mux_connection>& out) {
    while (true) {
        if (st->closed) co_return errc::connection_closed;
        if ((out = find_connection(st, target.id))) co_return std::error_code{};
        // Every connection to the peer is draining: a new one would exceed the cap.
        if (at_peer_cap(st, target.id)) co_return errc::refused;
        auto& dial = st->dials[target.id];
        if (!dial) {
            dial = std::make_shared<pending_dial>();
            asio::co_spawn(st->executor, run_dial(st, target, dial), asio::detached);
        }
        auto waiter = std::make_shared<wakeup>(st->executor);
        auto pending = dial;
        pending->waiters.push_back(waiter);
        const std::error_code cancelled = co_await waiter->wait();
        if (cancelled) co_return errc::cancelled;
        if (pending->result) co_return pending->result;
    }
}

template <transport Transport>
asio::awaitable<void> node<Transport>::run_dial(state_ptr st, peer target,
                                                std::shared_ptr<pending_dial> dial) {
    using namespace asio::experimental::awaitable_operators;
    timer_type timer(st->executor);
    timer.expires_after(st->options.dial_timeout); // for every attempt together
    // Out of descriptors, the dial tries again after closing an idle connection of ours,
    // a few times at most (another thread may take the descriptor first).
    constexpr int max_attempts = 4;
    std::error_code ec;
    for (int attempt = 1;; ++attempt) {
        auto connected =
            co_await (st->transport.async_connect(
                          target.endpoint, asio::experimental::as_tuple(asio::use_awaitable)) ||
                      timer.async_wait(asio::experimental::as_tuple(asio::use_awaitable)));
        if (connected.index() == 1) {
            ec = errc::timeout;
            break;
        }
        auto& [connect_error, stream] = std::get<0>(connected);
        if (out_of_descriptors(connect_error) && attempt < max_attempts && !st->closed &&
            close_idle(st)) {
            log::debug("net", "out of descriptors: closed an idle connection to dial");
            continue;
        }
        ec = detail::to_rpc_error(connect_error);
        if (!ec) {
            std::shared_ptr<mux_connection> connection;
            ec =
                co_await secure(st, std::move(stream), crypto::role::dialer, target.id, connection);
        }
        break;
    }
    if (ec) log::debug("net", "dial ", target.id.short_string(), " failed: ", ec.message());
    dial->result = ec;
    if (const auto it = st->dials.find(target.id); it != st->dials.end() && it->second == dial)
        st->dials.erase(it);
    for (auto& waiter : dial->waiters)
        waiter->notify();
}

template <transport Transport>
asio::awaitable<void> node<Transport>::accept_loop(state_ptr st, std::shared_ptr<listening> l) {
    // Failures such as EMFILE repeat at once (accept() takes a descriptor before it looks
    // for a connection): unless an idle connection can give up its descriptor, pause
    // rather than spin on the io thread, doubling the pause while they go on. A failure
    // after a quiet spell starts a new episode.
    constexpr duration first_pause = 10ms, longest_pause = 1s;
    duration pause = first_pause;
    std::optional<time_point> last_failure;
    while (!st->closed) {
        auto [ec, stream] =
            co_await l->listener.async_accept(asio::experimental::as_tuple(asio::use_awaitable));
        if (st->closed) break;
        if (!ec) {
            if (std::exchange(last_failure, std::nullopt)) log::info("net", "accepting again");
            if (st->statistics.pending_handshakes >= st->options.max_pending_handshakes) {
                ++st->statistics.handshakes_refused;
                continue; // `stream` closes as it goes out of scope
            }
            ++st->statistics.pending_handshakes;
            asio::co_spawn(st->executor, accept_one(st, std::move(stream)), asio::detached);
            continue;
        }
        if (ec == asio::error::operation_aborted || ec == asio::error::bad_descriptor) break;
        ++st->statistics.accept_errors;
        // Out of descriptors: an idle connection of ours gives its one to the newcomer. As
        // accept() fails before it looks, the accept after one at the limit fails too even
        // with no one waiting: that closes a connection early and keeps its descriptor spare.
        if (out_of_descriptors(ec) && close_idle(st)) {
            log::debug("net", "out of descriptors: closed an idle connection to accept");
            continue;
        }
        const time_point now = transport_now<Transport>(st->executor);
        if (!last_failure || now - *last_failure > 2 * longest_pause) {
            log::warning("net", "accept failed: ", ec.message(), "; retrying with pauses");
            pause = first_pause;
        }
        last_failure = now;
        l->retry.expires_after(pause);
        co_await l->retry.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
        pause = std::min<duration>(2 * pause, longest_pause);
    }
}

template <transport Transport>
asio::awaitable<void> node<Transport>::accept_one(state_ptr st, stream_type stream) {
    std::shared_ptr<mux_connection> connection;
    const auto ec =
        co_await secure(st, std::move(stream), crypto::role::listener, std::nullopt, connection);
    --st->statistics.pending_handshakes;
    if (ec) log::debug("net", "incoming handshake failed: ", ec.message());
}

template <transport Transport>
asio::awaitable<void> node<Transport>::sweep_idle(state_ptr st) {
    while (!st->closed) {
        st->sweep_timer.expires_after(st->options.idle_timeout);
        auto [ec] =
            co_await st->sweep_timer.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
        if (ec || st->closed) break;
        std::vector<std::shared_ptr<mux_connection>> idle;
        for (auto& [id, list] : st->connections)
            for (auto& pooled : list) {
                const auto activity = pooled.connection->activity();
                if (pooled.connection->stream_count() == 0 && pooled.seen_activity == activity)
                    idle.push_back(pooled.connection);
                pooled.seen_activity = activity;
            }
        for (auto& connection : idle)
            connection->close();
    }
}

} // namespace hivemesh::net
