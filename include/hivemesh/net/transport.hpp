// The shape every transport has (net::tcp::transport, net::sim::transport), written as a
// concept so that the templates over a transport (the RPC node, the DHT node, the averaging
// services) state what they need and a wrong argument fails at their declaration.
#pragma once

#include "hivemesh/core/clock.hpp"
#include "hivemesh/net/address.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/use_awaitable.hpp>

#include <concepts>
#include <optional>
#include <system_error>
#include <tuple>
#include <type_traits>

namespace hivemesh::net {

/// A transport listens and dials; it moves bytes and nothing else.
///   - `stream_type`: a connected byte stream (async_read_some / async_write_some, close);
///   - `listener_type`: made by `listen(endpoint)`; `async_accept(token)` completes with
///     `(error_code, stream_type)`; `local_endpoint()`, `close()`;
///   - `timer_type`: an Asio-style waitable timer constructible from the executor;
///   - `clock_type`: what `timer_type` counts in (see transport_now);
///   - `endpoint_type`, with `to_endpoint(peer_address)` and `to_address(endpoint)` to cross
///     the wire as a peer_address;
///   - `executor()`, on which its streams, listeners and timers run;
///   - `async_connect(endpoint, token)`, completing with `(error_code, stream_type)` and
///     giving up after the transport's own connect timeout;
///   - `round_trip_time(stream)`: the connection's round-trip time as far as the transport
///     knows it, zero if it does not (the multiplexer's windows follow it);
///   - `datagram_socket_type`, made by `open_datagram(endpoint, ec)`: a datagram socket with
///     `async_send_to(buffers, endpoint, token)` and `async_receive_from(buffers, endpoint&,
///     token)`, both completing with `(error_code, size_t)`, `async_receive_error(endpoint&,
///     token)`, completing with `(error_code, error_code reported)` when the network reports
///     an error (connection_refused: no socket at the port) about a datagram it sent to that
///     endpoint, `local_endpoint()`, `is_open()` and `close()`;
///     `datagram_endpoint_for(remote)`, where a socket that serves nothing
///     binds to reach `remote` (remotes for which it is the same, one address family, are
///     reached from one socket).
template <class T>
concept transport = std::copy_constructible<T> &&
    requires(T& t, const typename T::endpoint_type& endpoint, const peer_address& address,
             typename T::listener_type& listener, typename T::stream_type& stream,
             std::error_code& ec) {
    typename T::stream_type;
    typename T::timer_type;
    typename T::clock_type;
    { t.executor() } -> std::convertible_to<asio::any_io_executor>;
    { T::to_endpoint(address) } -> std::same_as<std::optional<typename T::endpoint_type>>;
    { T::to_address(endpoint) } -> std::same_as<peer_address>;
    { t.listen(endpoint) } -> std::same_as<typename T::listener_type>;
    { listener.local_endpoint() } -> std::convertible_to<typename T::endpoint_type>;
    {
        listener.async_accept(asio::experimental::as_tuple(asio::use_awaitable))
        } -> std::same_as<asio::awaitable<std::tuple<std::error_code, typename T::stream_type>>>;
    {
        t.async_connect(endpoint, asio::experimental::as_tuple(asio::use_awaitable))
        } -> std::same_as<asio::awaitable<std::tuple<std::error_code, typename T::stream_type>>>;
    { T::round_trip_time(stream) } -> std::same_as<hivemesh::duration>;
    typename T::datagram_socket_type;
    { t.open_datagram(endpoint, ec) } -> std::same_as<typename T::datagram_socket_type>;
    { t.datagram_endpoint_for(endpoint) } -> std::same_as<typename T::endpoint_type>;
    requires std::constructible_from<typename T::timer_type, decltype(t.executor())>;
};

/// The time `Transport`'s clock shows on `executor` (virtual on the simulated network).
template <transport Transport>
time_point transport_now(const asio::any_io_executor& executor) {
    if constexpr (std::is_constructible_v<typename Transport::clock_type, asio::any_io_executor>)
        return typename Transport::clock_type(executor).now();
    else
        return typename Transport::clock_type().now();
}

} // namespace hivemesh::net
