// The TCP transport: listeners and dials with deadlines over Asio sockets.
//
// It satisfies net::transport (net/transport.hpp), as the simulated transport does, so
// components are templates over either.
// It moves bytes and nothing else: no authentication (the secure session does that), no
// error mapping (errors are Asio's own codes, which the RPC layer maps).
//
// Socket options, for accepted and dialled sockets alike:
//   - TCP_NODELAY: small RPC frames must not wait up to 40 ms for Nagle's algorithm.
//   - TCP_NOTSENT_LOWAT of 512 KiB, except on loopback: what the kernel holds unsent ahead
//     of a slow link delays everything written after it, and its autotuned send buffer
//     holds megabytes (a quarter-second at 100 Mbit/s shared by two flows). Kept in the
//     multiplexer instead, the queue lets window credits and small calls go first; a
//     receiver's credits no longer lag behind its own bulk uploads and throttle what it
//     receives. On loopback a backlog drains at memory speed and costs no delay, while the
//     limit would cost wake-ups (a sixth of one stream's RPC bulk throughput).
//   - Send and receive buffers are left to the kernel. Setting SO_SNDBUF/SO_RCVBUF turns
//     off Linux's buffer autotuning, which grows the window up to net.ipv4.tcp_rmem/wmem
//     as a long fat link needs; a fixed size would cap throughput instead.
//   - No SO_KEEPALIVE: its two-hour default detects nothing useful; liveness is the
//     deadline and ping business of the layers above.
#pragma once

#include "hivemesh/core/clock.hpp"
#include "hivemesh/core/config.hpp"
#include "hivemesh/core/error.hpp"
#include "hivemesh/crypto/peer_id.hpp"
#include "hivemesh/net/address.hpp"
#include "hivemesh/net/transport.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/associated_cancellation_slot.hpp>
#include <asio/associator.hpp>
#include <asio/async_result.hpp>
#include <asio/awaitable.hpp>
#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/cancellation_type.hpp>
#include <asio/co_spawn.hpp>
#include <asio/compose.hpp>
#include <asio/dispatch.hpp>
#include <asio/error.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/deferred.hpp>
#include <asio/experimental/parallel_group.hpp>
#include <asio/ip/address.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/ip/udp.hpp>
#include <asio/post.hpp>
#include <asio/socket_base.hpp>
#include <asio/steady_timer.hpp>
#include <asio/strand.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <chrono>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>

namespace hivemesh::net::tcp {

/// The most a connection to another machine leaves unsent in the kernel
/// (TCP_NOTSENT_LOWAT; see the top of this file).
inline constexpr std::size_t unsent_bytes_limit = 512 << 10;

/// Whether a connection to `remote` gets unsent_bytes_limit: all but loopback ones.
HIVEMESH_DECL bool limits_unsent_bytes(const asio::ip::address& remote);

/// Sets the options every hivemesh TCP connection uses (TCP_NODELAY, and
/// TCP_NOTSENT_LOWAT where the platform has it; see the top of this file for what is left
/// alone and why). Returns the error of TCP_NODELAY; TCP_NOTSENT_LOWAT is best effort.
HIVEMESH_DECL std::error_code apply_connection_options(asio::ip::tcp::socket& socket);

/// The kernel's smoothed round-trip time of a connected socket (TCP_INFO); zero where the
/// platform does not tell, or for a socket that is not connected.
HIVEMESH_DECL hivemesh::duration round_trip_time(asio::ip::tcp::socket& socket) noexcept;

/// The endpoint of an ip4 or ip6 address (its peer id, if any, is not part of it).
/// nullopt for dns and sim addresses, which need a resolver or the simulated network, and
/// for hosts that are not valid (see peer_address::is_valid()).
HIVEMESH_DECL std::optional<asio::ip::tcp::endpoint> to_endpoint(const peer_address& address);

/// The address of `endpoint`, naming `peer` if given. An IPv4-mapped IPv6 address becomes
/// ip4; an IPv6 zone (scope id) is dropped, since the text form has none.
HIVEMESH_DECL peer_address to_address(const asio::ip::tcp::endpoint& endpoint,
                                      std::optional<crypto::peer_id> peer = std::nullopt);

namespace detail {

/// The IPv4 address an IPv4-mapped IPv6 one (::ffff:a.b.c.d) stands for; others as they are.
HIVEMESH_DECL asio::ip::address unmapped(const asio::ip::address& ip);

using steady_time = std::chrono::steady_clock::time_point;
static_assert(std::is_same_v<std::chrono::steady_clock::duration, hivemesh::duration>,
              "deadline arithmetic below assumes a nanosecond steady clock");

/// `timeout` from now; saturates at the end of time instead of overflowing, and is `now`
/// (already expired) for zero or negative timeouts.
HIVEMESH_DECL steady_time deadline_after(hivemesh::duration timeout) noexcept;

/// What a dial produces. The socket is always engaged when the coroutine returns; it is
/// optional only because co_spawn needs a default-constructible result.
struct dial_outcome {
    std::error_code ec;
    std::optional<asio::ip::tcp::socket> socket;
};

/// co_spawn's completion handler for a dial: turns `(exception_ptr, dial_outcome)` into the
/// public `(error_code, socket)` and forwards every association to the user's handler.
template <class Handler>
class dial_completion {
public:
    explicit dial_completion(Handler handler,
                             std::shared_ptr<asio::cancellation_signal> dial_signal = nullptr)
        : handler_(std::move(handler))
        , dial_signal_(std::move(dial_signal)) {}

    void operator()(std::exception_ptr failure, dial_outcome outcome) {
        // The dial coroutine reports every expected failure as an error code; only
        // resource exhaustion (std::bad_alloc) gets here, and it propagates out of
        // io_context::run() like an exception from any other handler.
        if (failure) std::rethrow_exception(failure);
        std::move(handler_)(outcome.ec, std::move(*outcome.socket));
    }

    const Handler& handler() const noexcept { return handler_; }

private:
    Handler handler_;
    // co_spawn keeps the dial's cancellation state in this signal's slot: it must live
    // until the dial has completed.
    std::shared_ptr<asio::cancellation_signal> dial_signal_;
};

/// Installed in the caller's cancellation slot: carries a cancellation over to the dial's
/// strand and emits it there, because the dial's coroutine state lives on that strand and
/// cancellation slots are not thread-safe (the caller may emit from another thread).
class cancellation_relay {
public:
    cancellation_relay(asio::any_io_executor dial_strand,
                       std::shared_ptr<asio::cancellation_signal> dial_signal)
        : dial_strand_(std::move(dial_strand))
        , dial_signal_(std::move(dial_signal)) {}

    HIVEMESH_DECL void operator()(asio::cancellation_type type);

private:
    asio::any_io_executor dial_strand_;
    std::shared_ptr<asio::cancellation_signal> dial_signal_;
};

/// The acceptor's completion handler: applies the connection options before handing the
/// socket over, and forwards every association to the user's handler.
template <class Handler>
class accept_completion {
public:
    explicit accept_completion(Handler handler)
        : handler_(std::move(handler)) {}

    void operator()(std::error_code ec, asio::ip::tcp::socket socket) {
        if (!ec) ec = apply_connection_options(socket);
        if (ec) {
            std::error_code ignored;
            socket.close(ignored);
        }
        // Already running in the handler's own executor context (the association is
        // forwarded), so the handler is invoked directly, as Asio's composed operations do.
        std::move(handler_)(ec, std::move(socket));
    }

    const Handler& handler() const noexcept { return handler_; }

private:
    Handler handler_;
};

HIVEMESH_DECL asio::awaitable<bool> cancellation_requested();

/// Connects `socket` to `target` unless `deadline` expires first. The timer keeps its
/// expiry, so one timer bounds a whole sequence of steps.
HIVEMESH_DECL asio::awaitable<std::error_code> connect_before(asio::ip::tcp::socket& socket,
                                                              asio::ip::tcp::endpoint target,
                                                              asio::steady_timer& deadline);

/// Tries `targets` in order until one connects, the deadline passes or the dial is
/// cancelled. Each attempt gets a fresh socket: a failed connect leaves a socket unusable.
template <class Endpoints>
asio::awaitable<dial_outcome> connect_first(asio::any_io_executor socket_executor,
                                            Endpoints targets, asio::steady_timer& deadline) {
    std::error_code last_error = asio::error::host_not_found;
    for (const auto& entry : targets) {
        // A cancellation that arrived between two steps (say, just as the lookup answered)
        // found no operation to stop: check for it before starting the next one.
        if (co_await cancellation_requested()) {
            last_error = asio::error::operation_aborted;
            break;
        }
        asio::ip::tcp::socket socket(socket_executor);
        const asio::ip::tcp::endpoint target = entry;
        last_error = co_await connect_before(socket, target, deadline);
        if (!last_error) last_error = apply_connection_options(socket);
        if (!last_error) co_return dial_outcome{{}, std::move(socket)};
        std::error_code ignored;
        socket.close(ignored);
        if (last_error == asio::error::timed_out || last_error == asio::error::operation_aborted)
            break;
    }
    co_return dial_outcome{last_error, asio::ip::tcp::socket(socket_executor)};
}

/// Dials one endpoint before `deadline`. Runs on a private strand.
HIVEMESH_DECL asio::awaitable<dial_outcome> dial_endpoint(asio::any_io_executor socket_executor,
                                                          asio::ip::tcp::endpoint target,
                                                          steady_time deadline);

/// The state a DNS lookup shares with its completion handler, which may outlive the dial:
/// getaddrinfo cannot be interrupted, so a dial that gives up leaves it to finish alone.
/// Only touched on the dial's strand.
struct pending_lookup {
    /// The dialer's deadline timer, cancelled to wake the dialer; null once it stopped waiting.
    asio::steady_timer* waiting_dialer = nullptr;
    bool answered = false;
    std::error_code ec;
    asio::ip::tcp::resolver::results_type results;
};

/// Dials a peer address before `deadline`: ip4 and ip6 directly, dns through an
/// asynchronous lookup bounded by the same deadline. Runs on a private strand.
HIVEMESH_DECL asio::awaitable<dial_outcome> dial_address(asio::any_io_executor socket_executor,
                                                         peer_address target, steady_time deadline);

/// The body every dial runs in. Every cancellation type is honoured (a dial that stops has
/// no effect the caller could see), cancellation is reported as operation_aborted rather
/// than thrown, and a cancellation that arrived before the start stops the dial at once.
HIVEMESH_DECL asio::awaitable<dial_outcome> run_dial(asio::any_io_executor socket_executor,
                                                     asio::awaitable<dial_outcome> dial);

/// Makes the dial coroutine, given its deadline.
using dial_maker = std::function<asio::awaitable<dial_outcome>(steady_time)>;

/// async_dial's initiation: a named type, so that async_dial's return type is known without
/// instantiating its body (the net::transport concept asks for it in every translation unit).
struct initiate_dial {
    asio::any_io_executor executor;
    hivemesh::duration timeout;

    template <class Handler>
    void operator()(Handler&& handler, const dial_maker& make) const {
        using handler_type = std::decay_t<Handler>;
        // The deadline counts from initiation, which for deferred tokens is the launch.
        auto dial = run_dial(executor, make(deadline_after(timeout)));
        const asio::any_io_executor strand = asio::make_strand(executor);
        auto caller_slot = asio::get_associated_cancellation_slot(handler);
        if (!caller_slot.is_connected()) {
            asio::co_spawn(strand, std::move(dial),
                           dial_completion<handler_type>(std::forward<Handler>(handler)));
            return;
        }
        auto dial_signal = std::make_shared<asio::cancellation_signal>();
        caller_slot.template emplace<cancellation_relay>(strand, dial_signal);
        const asio::cancellation_slot dial_slot = dial_signal->slot();
        asio::co_spawn(strand, std::move(dial),
                       asio::bind_cancellation_slot(
                           dial_slot, dial_completion<handler_type>(std::forward<Handler>(handler),
                                                                    std::move(dial_signal))));
    }
};

/// Starts `make_dial(deadline)` on a private strand (so the deadline timer, the lookup
/// handler, cancellation and the dial never run concurrently on a multi-threaded executor)
/// and completes `token` with `(error_code, socket)`.
template <class Token>
auto async_dial(asio::any_io_executor executor, hivemesh::duration timeout, dial_maker make_dial,
                Token&& token)
    -> decltype(asio::async_initiate<Token, void(std::error_code, asio::ip::tcp::socket)>(
        std::declval<initiate_dial>(), token, std::move(make_dial))) {
    return asio::async_initiate<Token, void(std::error_code, asio::ip::tcp::socket)>(
        initiate_dial{std::move(executor), timeout}, token, std::move(make_dial));
}

/// listener::async_accept's initiation, named for the same reason as initiate_dial.
struct initiate_accept {
    asio::ip::tcp::acceptor* acceptor;

    template <class Handler>
    void operator()(Handler&& handler) const {
        acceptor->async_accept(acceptor->get_executor(), accept_completion<std::decay_t<Handler>>(
                                                             std::forward<Handler>(handler)));
    }
};

} // namespace detail

/// A socket accepting TCP connections, like asio::ip::tcp::acceptor plus the connection
/// options. Not thread-safe: use one from one strand at a time, like any Asio object.
/// It must outlive its pending accepts (close() completes them first).
class listener {
public:
    using executor_type = asio::any_io_executor;
    using endpoint_type = asio::ip::tcp::endpoint;
    using socket_type = asio::ip::tcp::socket;

    /// Listens on `local` (port 0: an ephemeral port, see local_endpoint()). Sets
    /// SO_REUSEADDR, so a restarted peer can listen while old connections linger in
    /// TIME_WAIT, and on IPv6 sockets IPV6_V6ONLY, so [::] and 0.0.0.0 can be bound on the
    /// same port by two listeners instead of the v6 one taking IPv4 as mapped addresses.
    /// Throws std::system_error (e.g. address_in_use, address_not_available).
    HIVEMESH_DECL listener(const executor_type& executor, const endpoint_type& local);

    /// As above, reporting failure in `ec`; the listener is then closed.
    HIVEMESH_DECL listener(const executor_type& executor, const endpoint_type& local,
                           std::error_code& ec);

    executor_type get_executor() noexcept { return acceptor_.get_executor(); }
    bool is_open() const noexcept { return acceptor_.is_open(); }

    /// The bound endpoint, with the actual port when 0 was asked for.
    const endpoint_type& local_endpoint() const noexcept { return local_; }

    /// Accepts one connection, with the connection options applied.
    ///
    /// Completion: `void(std::error_code, asio::ip::tcp::socket)`. Errors are Asio's:
    /// operation_aborted after close() or cancellation, bad_descriptor on a closed listener,
    /// too_many_files_open and the like; the listener stays usable after an error unless
    /// it was closed. A connection whose options cannot be set is closed and reported as
    /// that error. The socket's executor is the listener's.
    /// Cancellation: per-operation (terminal, partial and total), as the acceptor supports.
    template <ASIO_COMPLETION_TOKEN_FOR(void(std::error_code, socket_type)) Token>
    auto async_accept(Token&& token)
        -> decltype(asio::async_initiate<Token, void(std::error_code, socket_type)>(
            std::declval<detail::initiate_accept>(), token)) {
        return asio::async_initiate<Token, void(std::error_code, socket_type)>(
            detail::initiate_accept{&acceptor_}, token);
    }

    /// Stops listening; pending accepts complete with operation_aborted.
    HIVEMESH_DECL void close() noexcept;

private:
    HIVEMESH_DECL void open(const endpoint_type& local, std::error_code& ec);

    asio::ip::tcp::acceptor acceptor_;
    endpoint_type local_;
};

/// A UDP socket addressed by TCP endpoints: a node's datagrams use the same address and
/// port number as its listener, so a peer's one endpoint names both. Not thread-safe, like
/// any Asio object; at most one receive pending at a time, and no move meanwhile (the
/// socket keeps that receive's UDP sender).
class datagram_socket {
public:
    using executor_type = asio::any_io_executor;
    using endpoint_type = asio::ip::tcp::endpoint;

    /// Binds to `local` (port 0: an ephemeral port; see local_endpoint()). On IPv6 sets
    /// IPV6_V6ONLY, as listener does. Errors in `ec` (address_in_use, ...); the socket is
    /// then closed.
    HIVEMESH_DECL datagram_socket(const executor_type& executor, const endpoint_type& local,
                                  std::error_code& ec);

    executor_type get_executor() noexcept { return socket_.get_executor(); }
    bool is_open() const noexcept { return socket_.is_open(); }
    /// The bound endpoint, with the actual port when 0 was asked for.
    const endpoint_type& local_endpoint() const noexcept { return local_; }

    /// Sends `buffers` as one datagram to `to`.
    /// Completion: `void(std::error_code, std::size_t)`. Errors are Asio's (message_size
    /// beyond the kernel's limit, bad_descriptor once closed, network_unreachable, ...); a
    /// datagram the network loses is no error. An error reported about an earlier datagram
    /// (async_receive_error), which Linux also hands to the socket's next send, does not
    /// fail this one: that send is made again, at most max_send_attempts in all.
    /// Cancellation: as Asio's socket supports.
    template <class ConstBufferSequence,
              ASIO_COMPLETION_TOKEN_FOR(void(std::error_code, std::size_t)) Token>
    auto async_send_to(const ConstBufferSequence& buffers, const endpoint_type& to, Token&& token) {
        return asio::async_compose<Token, void(std::error_code, std::size_t)>(
            [this, buffers, to = asio::ip::udp::endpoint(to.address(), to.port()),
             attempts = 0u](auto& self, std::error_code ec = {}, std::size_t sent = 0) mutable {
                if (attempts == 0 || (reports_earlier(ec) && attempts < max_send_attempts)) {
                    ++attempts;
                    return socket_.async_send_to(buffers, to, std::move(self));
                }
                self.complete(ec, sent);
            },
            token, socket_);
    }
    static constexpr unsigned max_send_attempts = 4;

    /// Receives the next datagram into `buffers` and its sender into `sender`, which must
    /// stay valid until completion. A datagram longer than the buffers is cut short by the
    /// kernel without an error: give 65,507 bytes to receive any. Errors reported about
    /// datagrams sent earlier, which Linux also hands to a receive, are not this one's: it
    /// goes on waiting (async_receive_error reads them).
    /// Completion: `void(std::error_code, std::size_t)`. Cancellation: per-operation, any
    /// type; close() completes it with operation_aborted.
    template <class MutableBufferSequence,
              ASIO_COMPLETION_TOKEN_FOR(void(std::error_code, std::size_t)) Token>
    auto async_receive_from(const MutableBufferSequence& buffers, endpoint_type& sender,
                            Token&& token) {
        return asio::async_compose<Token, void(std::error_code, std::size_t)>(
            [this, buffers, from = &sender, started = false](auto& self, std::error_code ec = {},
                                                             std::size_t size = 0) mutable {
                if (!started || reports_earlier(ec)) {
                    started = true;
                    return socket_.async_receive_from(buffers, source_, std::move(self));
                }
                *from = endpoint_type(source_.address(), source_.port());
                self.complete(ec, size);
            },
            token, socket_);
    }

    /// Waits for the next error the network reported about a datagram this socket sent
    /// (an ICMP or ICMPv6 error, or a local one), and sets `destination` to where that
    /// datagram went. Completion: `void(std::error_code ec, std::error_code reported)`, where
    /// `reported` is the error (connection_refused: no socket at that port; host_unreachable,
    /// network_unreachable, ...) and `ec` the wait's own (operation_aborted when closed).
    /// Such errors are not authenticated and hosts rate-limit them: a hint, not a verdict.
    /// Cancellation: per-operation, any type; close() completes it with operation_aborted.
    template <ASIO_COMPLETION_TOKEN_FOR(void(std::error_code, std::error_code)) Token>
    auto async_receive_error(endpoint_type& destination, Token&& token) {
        return asio::async_compose<Token, void(std::error_code, std::error_code)>(
            [this, to = &destination, started = false](auto& self,
                                                       std::error_code waited = {}) mutable {
                if (!started) { // never completes inside the initiating call
                    started = true;
                    return asio::post(socket_.get_executor(), std::move(self));
                }
                // The queue is read before every wait: the reactor reports only new errors.
                while (!waited) {
                    std::error_code reported;
                    const auto read = read_error(*to, reported);
                    if (read == asio::error::would_block)
                        return socket_.async_wait(asio::socket_base::wait_error, std::move(self));
                    if (read) return self.complete(read, std::error_code{});
                    if (reported) return self.complete(std::error_code{}, reported);
                }
                self.complete(waited, std::error_code{});
            },
            token, socket_);
    }

    /// Closes the socket; a pending receive completes with operation_aborted.
    HIVEMESH_DECL void close() noexcept;

private:
    /// Whether `ec` is an error Linux reported about an earlier datagram (an ICMP one, with
    /// IP_RECVERR set), which it also hands to the socket's next send or receive.
    static bool reports_earlier(const std::error_code& ec) noexcept {
        return ec == asio::error::connection_refused || ec == asio::error::host_unreachable ||
               ec == asio::error::network_unreachable;
    }

    /// Takes the oldest entry of the socket's error queue without waiting: would_block when
    /// it is empty; `reported` stays clear for an entry that names no error.
    HIVEMESH_DECL std::error_code read_error(endpoint_type& destination, std::error_code& reported);

    asio::ip::udp::socket socket_;
    endpoint_type local_;
    asio::ip::udp::endpoint source_; ///< where the pending receive's datagram came from
};

/// The TCP transport: a factory of listeners and dialled sockets on one executor.
/// Stateless apart from the executor and the default timeout, so it is thread-safe.
class transport {
public:
    using executor_type = asio::any_io_executor;
    using stream_type = asio::ip::tcp::socket;
    using listener_type = tcp::listener;
    using timer_type = asio::steady_timer;
    using clock_type = hivemesh::wall_clock;
    using endpoint_type = asio::ip::tcp::endpoint;
    using datagram_socket_type = tcp::datagram_socket;

    static constexpr hivemesh::duration default_connect_timeout = std::chrono::seconds(10);

    /// A transport whose sockets and listeners use `executor`; dials without an explicit
    /// timeout give up after `connect_timeout`.
    explicit transport(executor_type executor,
                       hivemesh::duration connect_timeout = default_connect_timeout)
        : executor_(std::move(executor))
        , connect_timeout_(connect_timeout) {}

    executor_type executor() const noexcept { return executor_; }
    hivemesh::duration connect_timeout() const noexcept { return connect_timeout_; }
    /// See tcp::round_trip_time.
    static hivemesh::duration round_trip_time(stream_type& socket) noexcept {
        return tcp::round_trip_time(socket);
    }

    /// Address conversions, so components over any transport can send endpoints as
    /// peer_address (see tcp::to_endpoint and tcp::to_address).
    static std::optional<endpoint_type> to_endpoint(const peer_address& address) {
        return tcp::to_endpoint(address);
    }
    static peer_address to_address(const endpoint_type& endpoint,
                                   std::optional<crypto::peer_id> peer = std::nullopt) {
        return tcp::to_address(endpoint, peer);
    }

    /// Listens on `local` (see listener). Throws std::system_error.
    listener_type listen(const endpoint_type& local) const {
        return listener_type(executor_, local);
    }
    /// Listens on `local`, reporting failure in `ec` (the listener is then closed).
    listener_type listen(const endpoint_type& local, std::error_code& ec) const {
        return listener_type(executor_, local, ec);
    }
    /// A datagram socket bound to `local` (see datagram_socket), errors in `ec`.
    datagram_socket_type open_datagram(const endpoint_type& local, std::error_code& ec) const {
        return datagram_socket_type(executor_, local, ec);
    }
    /// The endpoint a datagram socket binds to when it must reach `remote` and serves
    /// nothing: any address of remote's family, an ephemeral port.
    static endpoint_type datagram_endpoint_for(const endpoint_type& remote) {
        return endpoint_type(remote.protocol(), 0);
    }

    /// Listens on an ip4 or ip6 address such as "/ip4/0.0.0.0/tcp/0"; its peer id, if any,
    /// is ignored. Throws std::system_error: errc::invalid_argument for dns and sim.
    HIVEMESH_DECL listener_type listen(const peer_address& local) const;

    /// Connects to `remote`, giving up after `timeout` (zero or less: at once).
    ///
    /// Completion: `void(std::error_code, asio::ip::tcp::socket)`; on success the socket is
    /// connected with the connection options applied and uses executor(); on failure it is
    /// closed. Errors are Asio's: connection_refused, timed_out when the deadline passes
    /// first, network_unreachable, operation_aborted when cancelled, ...
    /// Cancellation: per-operation, any type (terminal, partial, total): the attempt stops,
    /// its socket is closed and the operation completes with operation_aborted.
    template <ASIO_COMPLETION_TOKEN_FOR(void(std::error_code, stream_type)) Token>
    auto async_connect(const endpoint_type& remote, hivemesh::duration timeout, Token&& token)
        -> decltype(detail::async_dial(std::declval<executor_type>(), timeout, detail::dial_maker{},
                                       std::forward<Token>(token))) {
        return detail::async_dial(
            executor_, timeout,
            [socket_executor = executor_, remote](detail::steady_time deadline) {
                return detail::dial_endpoint(socket_executor, remote, deadline);
            },
            std::forward<Token>(token));
    }

    /// As above with connect_timeout().
    template <ASIO_COMPLETION_TOKEN_FOR(void(std::error_code, stream_type)) Token>
    auto async_connect(const endpoint_type& remote, Token&& token)
        -> decltype(async_connect(remote, hivemesh::duration{}, std::forward<Token>(token))) {
        return async_connect(remote, connect_timeout_, std::forward<Token>(token));
    }

    /// Connects to the peer at `remote`, giving up after `timeout` in all (lookup included).
    /// ip4 and ip6 addresses are dialled directly; dns names are resolved asynchronously
    /// and the resulting endpoints tried in order until one connects. The peer id, if any,
    /// is not checked here: proving who answered is the secure session's job.
    ///
    /// Completion and cancellation as for endpoints. Additional errors:
    /// errc::invalid_argument for sim addresses (they belong to the simulated transport)
    /// and invalid hosts; the resolver's errors (host_not_found, ...) for dns names. With
    /// several endpoints the error is that of the last one tried. A lookup cannot be
    /// interrupted: when the deadline passes or the dial is cancelled during one, the dial
    /// completes at once and the lookup finishes unobserved in the background.
    template <ASIO_COMPLETION_TOKEN_FOR(void(std::error_code, stream_type)) Token>
    auto async_connect(const peer_address& remote, hivemesh::duration timeout, Token&& token) {
        return detail::async_dial(
            executor_, timeout,
            [socket_executor = executor_, remote](detail::steady_time deadline) {
                return detail::dial_address(socket_executor, remote, deadline);
            },
            std::forward<Token>(token));
    }

    /// As above with connect_timeout().
    template <ASIO_COMPLETION_TOKEN_FOR(void(std::error_code, stream_type)) Token>
    auto async_connect(const peer_address& remote, Token&& token) {
        return async_connect(remote, connect_timeout_, std::forward<Token>(token));
    }

private:
    executor_type executor_;
    hivemesh::duration connect_timeout_;
};

static_assert(net::transport<transport>);

} // namespace hivemesh::net::tcp

// Completion handlers that wrap the user's handler forward its executor, allocator and
// cancellation slot, so the wrapping is invisible to Asio and to the caller.
template <template <typename, typename> class Associator, class Handler, class DefaultCandidate>
struct asio::associator<Associator, hivemesh::net::tcp::detail::dial_completion<Handler>,
                        DefaultCandidate> {
    using type = typename Associator<Handler, DefaultCandidate>::type;
    static type get(const hivemesh::net::tcp::detail::dial_completion<Handler>& h,
                    const DefaultCandidate& c = DefaultCandidate()) noexcept {
        return Associator<Handler, DefaultCandidate>::get(h.handler(), c);
    }
};

template <template <typename, typename> class Associator, class Handler, class DefaultCandidate>
struct asio::associator<Associator, hivemesh::net::tcp::detail::accept_completion<Handler>,
                        DefaultCandidate> {
    using type = typename Associator<Handler, DefaultCandidate>::type;
    static type get(const hivemesh::net::tcp::detail::accept_completion<Handler>& h,
                    const DefaultCandidate& c = DefaultCandidate()) noexcept {
        return Associator<Handler, DefaultCandidate>::get(h.handler(), c);
    }
};

#if !defined(HIVEMESH_SEPARATE_COMPILATION)
#include "hivemesh/net/impl/tcp.ipp"
#endif
