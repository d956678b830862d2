// The RPC node's datagram calls (net::datagram_options): its port and receive loop, the
// caller's side with its retries and its way back to a stream, and serving requests
// (included by net/node.hpp).
#pragma once

#include "hivemesh/net/node.hpp"

namespace hivemesh::net {

template <transport Transport>
auto node<Transport>::open_datagrams(const state_ptr& st, const endpoint_type& local, bool serving)
    -> std::shared_ptr<datagram_socket_type> {
    std::error_code ec;
    auto opened = st->transport.open_datagram(local, ec);
    if (ec) {
        log::warning("rpc", "no datagrams on ", local, ": ", ec.message());
        return nullptr;
    }
    auto socket = std::make_shared<datagram_socket_type>(std::move(opened));
    st->datagram_ports.push_back(
        {socket, st->transport.datagram_endpoint_for(socket->local_endpoint()), serving});
    if (st->next_datagram_call == 0) // a random start: a restarted node meets no late replies
        randombytes_buf(&st->next_datagram_call, sizeof st->next_datagram_call);
    asio::co_spawn(st->executor, receive_datagrams(st, socket), asio::detached);
    asio::co_spawn(st->executor, receive_datagram_errors(st, socket), asio::detached);
    return socket;
}

template <transport Transport>
auto node<Transport>::datagram_port_for(const state_ptr& st, const endpoint_type& remote)
    -> std::shared_ptr<datagram_socket_type> {
    const endpoint_type family = st->transport.datagram_endpoint_for(remote);
    const datagram_port* found = nullptr;
    for (const auto& port : st->datagram_ports)
        if (port.family == family && (!found || (port.serving && !found->serving))) found = &port;
    if (found) return found->socket;
    return open_datagrams(st, family, false);
}

template <transport Transport>
byte_buffer node<Transport>::seal_datagram(const state_ptr& st, const crypto::public_key& to,
                                           const byte_buffer& payload) {
    byte_buffer out;
    if (st->sealer->seal(to, payload, transport_now<Transport>(st->executor), out)) return {};
    return out;
}

template <transport Transport>
auto node<Transport>::datagram_peer_of(const state_ptr& st, const crypto::peer_id& id)
    -> datagram_peer& {
    auto& peers = st->datagram_peers;
    if (peers.size() >= 4096 && !peers.contains(id)) {
        // Bounded: forget those with nothing to remember first, else any one.
        const time_point now = transport_now<Transport>(st->executor);
        std::erase_if(peers, [&](const auto& entry) {
            return entry.second.round_trip == duration::zero() && entry.second.silent_until <= now;
        });
        if (peers.size() >= 4096) peers.erase(peers.begin());
    }
    return peers[id];
}

template <transport Transport>
asio::awaitable<std::optional<call_result>>
node<Transport>::datagram_exchange(state_ptr st, const peer& target, const std::string& method,
                                   const byte_buffer& request, duration timeout) {
    const datagram_options& options = st->options.datagrams;
    if (!st->sealer || st->closed || !(target.key->id() == target.id)) co_return std::nullopt;
    if (const auto it = st->datagram_peers.find(target.id);
        it != st->datagram_peers.end() &&
        transport_now<Transport>(st->executor) < it->second.silent_until)
        co_return std::nullopt;
    const auto port = datagram_port_for(st, target.endpoint);
    if (!port) co_return std::nullopt;

    const std::uint64_t call = st->next_datagram_call++;
    byte_buffer payload;
    append_datagram_header(datagram_kind::request, call, payload);
    const byte_buffer header =
        encode_call_header(call_kind::unary, method, detail::to_timeout_ms(timeout), request);
    payload.insert(payload.end(), header.begin(), header.end());
    const byte_buffer datagram = seal_datagram(st, *target.key, payload);
    if (datagram.empty() || datagram.size() > options.max_size) co_return std::nullopt;

    datagram_wait wait(st->executor, *target.key, target.endpoint);
    st->datagram_calls.emplace(call, &wait);
    struct unregister {
        state* st;
        std::uint64_t call;
        ~unregister() { st->datagram_calls.erase(call); }
    } registered{st.get(), call};
    const auto known = st->datagram_peers.find(target.id);
    const duration round_trip =
        known == st->datagram_peers.end() ? duration::zero() : known->second.round_trip;
    duration interval = round_trip == duration::zero()
                            ? options.retry_interval
                            : std::max(4 * round_trip, options.min_retry_interval);
    timer_type timer(st->executor);
    unsigned sent = 0;
    const duration first_sent = detail::timer_now<timer_type>(st->executor);
    for (; sent < options.attempts && !wait.answered && !wait.refused && !st->closed;
         interval *= 2) {
        // A send that fails (say, the port's address family cannot reach the target's)
        // would fail again: the call goes by stream at once.
        if (co_await send_datagram(st, port, datagram, target.endpoint)) co_return std::nullopt;
        ++sent;
        if (wait.answered || wait.refused) break;
        using namespace asio::experimental::awaitable_operators;
        timer.expires_after(interval);
        co_await (wait.wake.wait() ||
                  timer.async_wait(asio::experimental::as_tuple(asio::use_awaitable)));
    }
    if (st->closed && !wait.answered) co_return call_result{errc::connection_closed, {}};
    datagram_peer& remembered = datagram_peer_of(st, target.id);
    if (!wait.answered) {
        remembered.silent_until = transport_now<Transport>(st->executor) + options.silence_period;
        if (wait.refused) {
            ++st->statistics.datagram_refusals;
            co_return std::nullopt;
        }
        if (remembered.round_trip == duration::zero()) co_return std::nullopt;
        remembered.round_trip = duration::zero(); // it may come back elsewhere
        co_return call_result{errc::unreachable, {}};
    }
    if (sent == 1) { // an answer when only one was sent is no retry's (Karn): it times the path
        const duration sample = detail::timer_now<timer_type>(st->executor) - first_sent;
        remembered.round_trip = remembered.round_trip == duration::zero()
                                    ? sample
                                    : (7 * remembered.round_trip + sample) / 8;
    }
    if (wait.by_stream) co_return std::nullopt;
    reply_message reply;
    if (decode_reply(wait.reply, reply) || reply.tag == reply_tag::data)
        co_return call_result{errc::protocol_violation, {}};
    ++st->statistics.datagram_calls;
    if (reply.tag == reply_tag::status) co_return call_result{reply.status, {}};
    co_return call_result{std::error_code{}, byte_buffer(reply.body.begin(), reply.body.end())};
}

template <transport Transport>
asio::awaitable<std::error_code>
node<Transport>::send_datagram(state_ptr st, std::shared_ptr<datagram_socket_type> port,
                               byte_buffer datagram, endpoint_type to) {
    if (!port) co_return make_error_code(errc::connection_closed);
    if (st->upload) {
        const duration wait =
            st->upload->take(detail::timer_now<timer_type>(st->executor), datagram.size());
        if (wait > duration::zero()) {
            timer_type timer(st->executor);
            timer.expires_after(wait);
            co_await timer.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
        }
    }
    if (!port->is_open()) co_return make_error_code(errc::connection_closed);
    auto [ec, sent] = co_await port->async_send_to(
        asio::buffer(datagram), to, asio::experimental::as_tuple(asio::use_awaitable));
    if (!ec) ++st->statistics.datagrams_sent;
    co_return ec;
}

template <transport Transport>
asio::awaitable<void>
node<Transport>::receive_datagrams(state_ptr st, std::shared_ptr<datagram_socket_type> port) {
    const std::size_t max_size = st->options.datagrams.max_size;
    byte_buffer buffer(max_size + 1); // one byte more shows a datagram too large
    timer_type pause(st->executor);
    while (port->is_open()) {
        endpoint_type from;
        auto [ec, size] = co_await port->async_receive_from(
            asio::buffer(buffer), from, asio::experimental::as_tuple(asio::use_awaitable));
        if (!port->is_open()) co_return;
        if (ec && ec != asio::error::message_size) {
            // Nothing arrived (say, no memory for buffers): try again, without spinning.
            pause.expires_after(std::chrono::milliseconds(10));
            co_await pause.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
            continue;
        }
        ++st->statistics.datagrams_received;
        if (ec || size > max_size) {
            ++st->statistics.datagrams_dropped;
            continue;
        }
        if (st->download) {
            const duration wait =
                st->download->take(detail::timer_now<timer_type>(st->executor), size);
            if (wait > duration::zero()) {
                pause.expires_after(wait);
                co_await pause.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
            }
        }
        on_datagram(st, port, std::span(buffer.data(), size), from);
    }
}

template <transport Transport>
asio::awaitable<void>
node<Transport>::receive_datagram_errors(state_ptr st, std::shared_ptr<datagram_socket_type> port) {
    timer_type pause(st->executor);
    while (port->is_open()) {
        endpoint_type about;
        auto [ec, reported] = co_await port->async_receive_error(
            about, asio::experimental::as_tuple(asio::use_awaitable));
        if (!port->is_open() || ec == asio::error::operation_not_supported) co_return;
        if (ec) { // without spinning, as receive_datagrams
            pause.expires_after(std::chrono::milliseconds(10));
            co_await pause.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
            continue;
        }
        if (reported != asio::error::connection_refused) continue; // a route may come back
        for (auto& [call, wait] : st->datagram_calls)
            if (wait->target == about && !wait->answered && !wait->refused) {
                wait->refused = true;
                wait->wake.notify();
            }
    }
}

template <transport Transport>
void node<Transport>::on_datagram(const state_ptr& st,
                                  const std::shared_ptr<datagram_socket_type>& port,
                                  std::span<std::byte> datagram, const endpoint_type& from) {
    crypto::datagram_sealer::opened opened;
    datagram_message message;
    if (st->sealer->open(datagram, transport_now<Transport>(st->executor), opened) ||
        decode_datagram_message(opened.payload, message)) {
        ++st->statistics.datagrams_dropped;
        return;
    }
    if (message.kind != datagram_kind::request) {
        const auto it = st->datagram_calls.find(message.call);
        // A late or repeated reply, or one from another peer than the callee: not ours.
        if (it == st->datagram_calls.end() || it->second->answered ||
            !(it->second->callee == opened.sender))
            return;
        datagram_wait& wait = *it->second;
        wait.answered = true;
        wait.by_stream = message.kind == datagram_kind::by_stream;
        wait.reply.assign(message.message.begin(), message.message.end());
        wait.wake.notify();
        return;
    }
    call_header header;
    if (decode_call_header(message.message, header) || header.kind != call_kind::unary) {
        ++st->statistics.datagrams_dropped;
        return;
    }
    // Not served this way, or too many served at once: to a stream, whose flow control
    // makes the caller wait rather than give up.
    if (!st->datagram_methods.contains(header.method) ||
        st->datagrams_in_service >= st->options.datagrams.max_serving) {
        byte_buffer payload;
        append_datagram_header(datagram_kind::by_stream, message.call, payload);
        asio::co_spawn(st->executor,
                       send_datagram(st, port, seal_datagram(st, opened.sender, payload), from),
                       asio::detached);
        return;
    }
    ++st->datagrams_in_service;
    asio::co_spawn(st->executor,
                   serve_datagram(st, port, opened.sender, from, message.call,
                                  std::move(header.method), header.timeout_ms,
                                  byte_buffer(header.body.begin(), header.body.end())),
                   asio::detached);
}

template <transport Transport>
asio::awaitable<void>
node<Transport>::serve_datagram(state_ptr st, std::shared_ptr<datagram_socket_type> port,
                                crypto::public_key caller, endpoint_type from, std::uint64_t call,
                                std::string method, std::uint32_t timeout_ms, byte_buffer request) {
    struct in_service {
        state* st;
        ~in_service() { --st->datagrams_in_service; }
    } counted{st.get()};
    std::error_code status = errc::refused; // unless the handler is still there
    byte_buffer response;
    if (const auto it = st->unary_handlers.find(method); it != st->unary_handlers.end()) {
        const unary_handler handler = it->second; // the map may change while it runs
        const call_context context{caller.id(), method, caller};
        const duration limit =
            std::min<duration>(std::chrono::milliseconds(timeout_ms), st->options.max_handler_time);
        status = co_await within<timer_type>(guarded(method, handler(context, request, response)),
                                             limit);
    }
    byte_buffer payload;
    append_datagram_header(datagram_kind::reply, call, payload);
    const byte_buffer message =
        status ? encode_status(status, status.message()) : encode_reply(reply_tag::reply, response);
    payload.insert(payload.end(), message.begin(), message.end());
    byte_buffer datagram = seal_datagram(st, caller, payload);
    if (datagram.size() > st->options.datagrams.max_size) { // the caller asks again by stream
        payload.clear();
        append_datagram_header(datagram_kind::by_stream, call, payload);
        datagram = seal_datagram(st, caller, payload);
    }
    co_await send_datagram(st, std::move(port), std::move(datagram), std::move(from));
}

} // namespace hivemesh::net
