// net/tcp.hpp's non-template function bodies: address conversions, dial coroutines, listener.
#pragma once

#include "hivemesh/net/tcp.hpp"

#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/deferred.hpp>
#include <asio/experimental/parallel_group.hpp>
#include <asio/ip/v6_only.hpp>

#if __has_include(<netinet/tcp.h>)
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#if defined(__linux__)
#include <linux/errqueue.h>
#endif
#endif

#include <array>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <utility>

namespace hivemesh::net::tcp {

HIVEMESH_DECL bool limits_unsent_bytes(const asio::ip::address& remote) {
    return !detail::unmapped(remote).is_loopback();
}

HIVEMESH_DECL std::error_code apply_connection_options(asio::ip::tcp::socket& socket) {
    std::error_code ec;
    socket.set_option(asio::ip::tcp::no_delay(true), ec);
    if (ec) return ec;
#if defined(TCP_NOTSENT_LOWAT)
    // A socket the peer already reset has no remote endpoint: its first read fails anyway.
    std::error_code unknown;
    const auto remote = socket.remote_endpoint(unknown);
    if (!unknown && limits_unsent_bytes(remote.address())) {
        // Best effort: a kernel without the option queues more, and works as before.
        const int limit = static_cast<int>(unsent_bytes_limit);
        ::setsockopt(socket.native_handle(), IPPROTO_TCP, TCP_NOTSENT_LOWAT, &limit, sizeof limit);
    }
#endif
    return ec;
}

HIVEMESH_DECL hivemesh::duration round_trip_time(asio::ip::tcp::socket& socket) noexcept {
#if defined(TCP_INFO)
    tcp_info info{};
    socklen_t size = sizeof info;
    if (::getsockopt(socket.native_handle(), IPPROTO_TCP, TCP_INFO, &info, &size) == 0 &&
        size >= offsetof(tcp_info, tcpi_rtt) + sizeof info.tcpi_rtt)
        return std::chrono::microseconds(info.tcpi_rtt);
#else
    (void)socket;
#endif
    return hivemesh::duration::zero();
}

HIVEMESH_DECL std::optional<asio::ip::tcp::endpoint> to_endpoint(const peer_address& address) {
    using protocol = peer_address::protocol;
    if (address.proto != protocol::ip4 && address.proto != protocol::ip6) return std::nullopt;
    if (!address.is_valid()) return std::nullopt; // e.g. an IPv6 zone, which Asio would take
    std::error_code ec;
    const asio::ip::address ip =
        address.proto == protocol::ip4
            ? asio::ip::address(asio::ip::make_address_v4(address.host, ec))
            : asio::ip::address(asio::ip::make_address_v6(address.host, ec));
    if (ec) return std::nullopt;
    return asio::ip::tcp::endpoint(ip, address.port);
}

HIVEMESH_DECL peer_address to_address(const asio::ip::tcp::endpoint& endpoint,
                                      std::optional<crypto::peer_id> peer) {
    const asio::ip::address ip = detail::unmapped(endpoint.address());
    if (ip.is_v4())
        return {peer_address::protocol::ip4, ip.to_v4().to_string(), endpoint.port(), peer};
    return {peer_address::protocol::ip6, asio::ip::address_v6(ip.to_v6().to_bytes()).to_string(),
            endpoint.port(), peer};
}

namespace detail {

HIVEMESH_DECL asio::ip::address unmapped(const asio::ip::address& ip) {
    if (ip.is_v6() && ip.to_v6().is_v4_mapped())
        return asio::ip::make_address_v4(asio::ip::v4_mapped, ip.to_v6());
    return ip;
}

HIVEMESH_DECL steady_time deadline_after(hivemesh::duration timeout) noexcept {
    const steady_time now = std::chrono::steady_clock::now();
    if (timeout <= hivemesh::duration::zero()) return now;
    if (timeout >= steady_time::max() - now) return steady_time::max();
    return now + timeout;
}

HIVEMESH_DECL void cancellation_relay::operator()(asio::cancellation_type type) {
    asio::dispatch(dial_strand_, [signal = dial_signal_, type] { signal->emit(type); });
}

HIVEMESH_DECL asio::awaitable<bool> cancellation_requested() {
    co_return (co_await asio::this_coro::cancellation_state).cancelled() !=
        asio::cancellation_type::none;
}

HIVEMESH_DECL asio::awaitable<std::error_code> connect_before(asio::ip::tcp::socket& socket,
                                                              asio::ip::tcp::endpoint target,
                                                              asio::steady_timer& deadline) {
    namespace ex = asio::experimental;
    // Whichever finishes first cancels the other, and the group completes only once both
    // have, so nothing is left running that refers to the socket or the timer.
    auto [order, connect_ec, timer_ec] =
        co_await ex::make_parallel_group(socket.async_connect(target, ex::deferred),
                                         deadline.async_wait(ex::deferred))
            .async_wait(ex::wait_for_one(), asio::use_awaitable);
    if (!connect_ec) co_return std::error_code{}; // connected, even if the deadline hit too
    if (order[0] == 1 && !timer_ec) co_return asio::error::timed_out;
    co_return connect_ec; // refused, unreachable, ..., or operation_aborted if cancelled
}

HIVEMESH_DECL asio::awaitable<dial_outcome> dial_endpoint(asio::any_io_executor socket_executor,
                                                          asio::ip::tcp::endpoint target,
                                                          steady_time deadline) {
    if (deadline <= std::chrono::steady_clock::now())
        co_return dial_outcome{asio::error::timed_out, asio::ip::tcp::socket(socket_executor)};
    asio::steady_timer timer(co_await asio::this_coro::executor, deadline);
    const asio::ip::tcp::endpoint targets[] = {target};
    co_return co_await connect_first(socket_executor, std::span(targets), timer);
}

// g++ warns (-Wsubobject-linkage, on by default) when the coroutine frame of a function that
// is not inline, defined outside the main file, holds a lambda (`fail`), a type without
// linkage: a false positive, the frame belongs to this one definition. Header-only, the
// function is inline and the warning does not apply.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wsubobject-linkage"
#endif
HIVEMESH_DECL asio::awaitable<dial_outcome>
dial_address(asio::any_io_executor socket_executor, peer_address target, steady_time deadline) {
    const auto fail = [&](std::error_code ec) {
        return dial_outcome{ec, asio::ip::tcp::socket(socket_executor)};
    };
    if (target.proto == peer_address::protocol::sim || !target.is_valid())
        co_return fail(errc::invalid_argument);
    if (deadline <= std::chrono::steady_clock::now()) co_return fail(asio::error::timed_out);

    const auto strand = co_await asio::this_coro::executor;
    asio::steady_timer timer(strand, deadline);
    if (target.proto != peer_address::protocol::dns) {
        const auto endpoint = to_endpoint(target);
        if (!endpoint) co_return fail(errc::invalid_argument);
        const asio::ip::tcp::endpoint targets[] = {*endpoint};
        co_return co_await connect_first(socket_executor, std::span(targets), timer);
    }

    // The resolver and its handler run on this strand, so `lookup` needs no lock.
    auto lookup = std::make_shared<pending_lookup>();
    lookup->waiting_dialer = &timer;
    asio::ip::tcp::resolver resolver(strand);
    resolver.async_resolve(target.host, std::to_string(target.port),
                           asio::ip::resolver_base::numeric_service,
                           [lookup](std::error_code ec, asio::ip::tcp::resolver::results_type r) {
                               lookup->answered = true;
                               lookup->ec = ec;
                               lookup->results = std::move(r);
                               if (lookup->waiting_dialer) lookup->waiting_dialer->cancel();
                           });
    // Wakes when the lookup answers (it cancels this wait), the deadline passes, or the
    // dial is cancelled.
    auto [wait_ec] = co_await timer.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
    lookup->waiting_dialer = nullptr;
    if (!lookup->answered) {
        resolver.cancel(); // best effort: a lookup already under way finishes unobserved
        co_return fail(wait_ec ? std::error_code(asio::error::operation_aborted)
                               : std::error_code(asio::error::timed_out));
    }
    if (lookup->ec) co_return fail(lookup->ec);
    co_return co_await connect_first(socket_executor, std::move(lookup->results), timer);
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

HIVEMESH_DECL asio::awaitable<dial_outcome> run_dial(asio::any_io_executor socket_executor,
                                                     asio::awaitable<dial_outcome> dial) {
    // Must come first: co_awaiting a coroutine in a cancelled frame would otherwise throw.
    co_await asio::this_coro::throw_if_cancelled(false);
    const bool cancelled_early =
        (co_await asio::this_coro::cancellation_state).cancelled() != asio::cancellation_type::none;
    co_await asio::this_coro::reset_cancellation_state(asio::enable_total_cancellation());
    if (cancelled_early)
        co_return dial_outcome{asio::error::operation_aborted,
                               asio::ip::tcp::socket(socket_executor)};
    co_return co_await std::move(dial);
}

} // namespace detail

HIVEMESH_DECL listener::listener(const executor_type& executor, const endpoint_type& local)
    : acceptor_(executor) {
    std::error_code ec;
    open(local, ec);
    if (ec) {
        std::string where = local.address().to_string() + " port " + std::to_string(local.port());
        throw std::system_error(ec, "hivemesh: cannot listen on " + where);
    }
}

HIVEMESH_DECL listener::listener(const executor_type& executor, const endpoint_type& local,
                                 std::error_code& ec)
    : acceptor_(executor) {
    open(local, ec);
}

HIVEMESH_DECL void listener::close() noexcept {
    std::error_code ignored;
    acceptor_.close(ignored);
}

HIVEMESH_DECL void listener::open(const endpoint_type& local, std::error_code& ec) {
    ec.clear();
    acceptor_.open(local.protocol(), ec);
    if (!ec && local.address().is_v6()) acceptor_.set_option(asio::ip::v6_only(true), ec);
    if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(local, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (!ec) local_ = acceptor_.local_endpoint(ec);
    if (ec) close();
}

HIVEMESH_DECL datagram_socket::datagram_socket(const executor_type& executor,
                                               const endpoint_type& local, std::error_code& ec)
    : socket_(executor) {
    const asio::ip::udp::endpoint bound(local.address(), local.port());
    ec.clear();
    socket_.open(bound.protocol(), ec);
    if (!ec && local.address().is_v6()) socket_.set_option(asio::ip::v6_only(true), ec);
    if (!ec) socket_.bind(bound, ec);
#if defined(__linux__)
    // ICMP errors about our datagrams go to the error queue (async_receive_error); without
    // it the kernel reports none on an unconnected socket. A failure only loses those hints.
    if (!ec) {
        const int on = 1;
        if (local.address().is_v6())
            (void)::setsockopt(socket_.native_handle(), IPPROTO_IPV6, IPV6_RECVERR, &on, sizeof on);
        else
            (void)::setsockopt(socket_.native_handle(), IPPROTO_IP, IP_RECVERR, &on, sizeof on);
    }
#endif
    if (!ec) {
        const auto actual = socket_.local_endpoint(ec);
        local_ = endpoint_type(actual.address(), actual.port());
    }
    if (ec) close();
}

HIVEMESH_DECL std::error_code datagram_socket::read_error(endpoint_type& destination,
                                                          std::error_code& reported) {
#if defined(__linux__)
    asio::ip::udp::endpoint to; // where the datagram went, as the kernel gives it
    alignas(cmsghdr) std::array<std::byte, 256> control{};
    msghdr message{};
    message.msg_name = to.data();
    message.msg_namelen = static_cast<socklen_t>(to.capacity());
    message.msg_control = control.data();
    message.msg_controllen = control.size();
    // No buffer for the datagram itself: it comes back truncated, which is all we need.
    if (::recvmsg(socket_.native_handle(), &message, MSG_ERRQUEUE | MSG_DONTWAIT) < 0)
        return {errno, asio::error::get_system_category()};
    reported.clear();
    for (cmsghdr* c = CMSG_FIRSTHDR(&message); c != nullptr; c = CMSG_NXTHDR(&message, c)) {
        const bool error = (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_RECVERR) ||
                           (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_RECVERR);
        if (!error || c->cmsg_len < CMSG_LEN(sizeof(sock_extended_err))) continue;
        sock_extended_err e;
        std::memcpy(&e, CMSG_DATA(c), sizeof e);
        if (e.ee_errno != 0)
            reported = {static_cast<int>(e.ee_errno), asio::error::get_system_category()};
    }
    if (message.msg_namelen == 0 || message.msg_namelen > to.capacity()) {
        reported.clear(); // no destination to blame
        return {};
    }
    to.resize(message.msg_namelen);
    destination = endpoint_type(to.address(), to.port());
    return {};
#else
    (void)destination;
    (void)reported;
    return asio::error::operation_not_supported;
#endif
}

HIVEMESH_DECL void datagram_socket::close() noexcept {
    std::error_code ignored;
    socket_.close(ignored);
}

HIVEMESH_DECL transport::listener_type transport::listen(const peer_address& local) const {
    const auto endpoint = to_endpoint(local);
    if (!endpoint)
        throw std::system_error(errc::invalid_argument,
                                "hivemesh: tcp can listen only on ip4 or ip6 addresses, not " +
                                    local.to_string());
    return listener_type(executor_, *endpoint);
}

} // namespace hivemesh::net::tcp
