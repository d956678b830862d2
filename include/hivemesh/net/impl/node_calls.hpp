// The RPC node's calls: its handlers, the caller's side of unary and streaming calls, and
// serving incoming ones with their deadlines (included by net/node.hpp).
#pragma once

#include "hivemesh/net/node.hpp"

namespace hivemesh::net {

template <transport Transport>
void node<Transport>::check_method(const std::string& method) {
    if (!is_valid_method(method))
        throw std::invalid_argument("hivemesh: invalid RPC method name: " + method);
}

template <transport Transport>
void node<Transport>::add_handler(const std::string& method, unary_handler handler,
                                  handler_options how) {
    check_method(method);
    state_->unary_handlers[method] = std::move(handler);
    if (how.datagrams)
        state_->datagram_methods.insert(method);
    else
        state_->datagram_methods.erase(method);
}

template <transport Transport>
void node<Transport>::add_stream_handler(const std::string& method, stream_handler handler) {
    check_method(method);
    state_->stream_handlers[method] = std::move(handler);
}

template <transport Transport>
asio::awaitable<std::error_code> node<Transport>::open_call(peer target, std::string method,
                                                            duration timeout, call_stream& out) {
    auto st = state_;
    std::shared_ptr<mux_connection> connection;
    if (auto ec = co_await connect(st, target, connection)) co_return ec;
    mux_stream stream;
    if (auto ec = co_await connection->open(stream)) co_return ec;
    if (auto ec = co_await stream.send(
            encode_call_header(call_kind::streaming, method, detail::to_timeout_ms(timeout))))
        co_return ec;
    asio::co_spawn(st->executor, reset_after(stream.watch(), timeout, st), asio::detached);
    out = call_stream(std::move(stream), true);
    co_return std::error_code{};
}

template <transport Transport>
void node<Transport>::start_call(const state_ptr& st, peer target, std::string method,
                                 byte_buffer request, duration timeout, call_handler handler) {
    co_launch(st->executor,
              unary_call(st, std::move(target), std::move(method), std::move(request), timeout),
              std::move(handler), "net::node::async_call");
}

template <transport Transport>
asio::awaitable<call_result> node<Transport>::unary_call(state_ptr st, peer target,
                                                         std::string method, byte_buffer request,
                                                         duration timeout) {
    if (!is_valid_method(method)) co_return call_result{errc::invalid_argument, {}};
    co_return co_await within<timer_type>(
        unary_exchange(st, std::move(target), std::move(method), std::move(request), timeout),
        timeout);
}

template <transport Transport>
asio::awaitable<call_result>
node<Transport>::unary_exchange(state_ptr st, peer target, std::string method, byte_buffer request,
                                duration timeout) {
    if (target.key) {
        if (auto answered = co_await datagram_exchange(st, target, method, request, timeout))
            co_return std::move(*answered);
        ++st->statistics.datagram_fallbacks;
    }
    std::shared_ptr<mux_connection> connection;
    if (auto ec = co_await connect(st, std::move(target), connection))
        co_return call_result{ec, {}};
    mux_stream stream;
    if (auto ec = co_await connection->open(stream)) co_return call_result{ec, {}};
    byte_buffer message =
        encode_call_header(call_kind::unary, method, detail::to_timeout_ms(timeout), request);
    request = {};
    if (auto ec = co_await stream.send(std::move(message), true)) co_return call_result{ec, {}};
    byte_buffer raw;
    if (auto ec = co_await stream.receive(raw))
        co_return call_result{
            ec == asio::error::eof ? make_error_code(errc::protocol_violation) : ec, {}};
    reply_message reply;
    if (auto ec = decode_reply(raw, reply); ec || reply.tag == reply_tag::data) {
        stream.reset(errc::protocol_violation);
        co_return call_result{errc::protocol_violation, {}};
    }
    if (reply.tag == reply_tag::status) co_return call_result{reply.status, {}};
    co_return call_result{std::error_code{}, byte_buffer(reply.body.begin(), reply.body.end())};
}

template <transport Transport>
asio::awaitable<void> node<Transport>::reset_after(mux_stream::watcher watch, duration timeout,
                                                   state_ptr st) {
    using namespace asio::experimental::awaitable_operators;
    timer_type timer(st->executor);
    timer.expires_after(timeout);
    auto result = co_await (watch.until_finished() ||
                            timer.async_wait(asio::experimental::as_tuple(asio::use_awaitable)));
    if (result.index() == 1 && !std::get<0>(std::get<1>(result))) watch.reset(errc::timeout);
}

template <transport Transport>
asio::awaitable<std::error_code> node<Transport>::guarded(const std::string& method,
                                                          asio::awaitable<std::error_code> work) {
    try {
        co_return co_await std::move(work);
    } catch (const std::system_error& e) {
        co_return e.code();
    } catch (const std::exception& e) {
        log::warning("rpc", "handler ", method, " threw: ", e.what());
        co_return make_error_code(errc::remote_error);
    }
}

template <transport Transport>
asio::awaitable<void> node<Transport>::serve_call(state_ptr st, mux_stream stream,
                                                  crypto::public_key remote_key) {
    using namespace asio::experimental::awaitable_operators;
    byte_buffer first;
    // The header mostly comes in the frame that opened the stream: taking it then needs no
    // deadline, and skipping one saves a timer and two coroutines a call.
    const std::error_code received =
        stream.ready()
            ? co_await stream.receive(first)
            : co_await within<timer_type>(stream.receive(first), st->options.header_timeout);
    if (received) co_return; // dropping the stream resets it
    call_header header;
    if (decode_call_header(first, header)) {
        stream.reset(errc::protocol_violation);
        co_return;
    }
    const call_context context{stream.remote(), header.method, remote_key};
    const duration limit = std::min<duration>(std::chrono::milliseconds(header.timeout_ms),
                                              st->options.max_handler_time);
    auto watch = stream.watch();
    timer_type timer(st->executor);
    timer.expires_after(limit);

    if (header.kind == call_kind::unary) {
        const auto it = st->unary_handlers.find(header.method);
        if (it == st->unary_handlers.end()) {
            co_await stream.send(encode_status(errc::refused, "no such method"), true);
            co_return;
        }
        const unary_handler handler = it->second; // the map may change while it runs
        byte_buffer response;
        auto outcome =
            co_await (guarded(header.method, handler(context, header.body, response)) ||
                      watch.until_finished() ||
                      timer.async_wait(asio::experimental::as_tuple(asio::use_awaitable)));
        if (outcome.index() == 1) co_return; // the caller went away
        const std::error_code status =
            outcome.index() == 0 ? std::get<0>(outcome) : make_error_code(errc::timeout);
        byte_buffer last = status ? encode_status(status, status.message())
                                  : encode_reply(reply_tag::reply, response);
        co_await stream.send(std::move(last), true);
        co_return;
    }

    const auto it = st->stream_handlers.find(header.method);
    if (it == st->stream_handlers.end()) {
        co_await stream.send(encode_status(errc::refused, "no such method"), true);
        co_return;
    }
    const stream_handler handler = it->second;
    call_stream call(std::move(stream), false);
    const std::error_code status =
        co_await within(guarded(header.method, handler(context, call)), timer);
    byte_buffer last =
        status ? encode_status(status, status.message()) : encode_reply(reply_tag::reply, {});
    co_await call.stream().send(std::move(last), true);
}

} // namespace hivemesh::net
