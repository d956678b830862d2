// An RPC node: one identity on one transport. It listens, dials peers by PeerId and
// endpoint (one secure, multiplexed connection per peer, reused and closed when idle),
// serves registered handlers and makes unary and streaming calls with deadlines.
//
// Threading: the node, its connections and its handlers run on the transport's executor,
// which must not run two of them at once: run its io_context on one thread, or give the
// transport a strand (`tcp::transport(asio::make_strand(io))`). An internal strand would
// cost every handler a heap allocation inside Asio (measured: half the instructions of a
// small call). Handlers must not block: post CPU-heavy work elsewhere and co_await it.
#pragma once

#include "hivemesh/core/async.hpp"
#include "hivemesh/core/clock.hpp"
#include "hivemesh/core/log.hpp"
#include "hivemesh/crypto/datagram.hpp"
#include "hivemesh/crypto/identity.hpp"
#include "hivemesh/net/mux.hpp"
#include "hivemesh/net/rate_limit.hpp"
#include "hivemesh/net/rpc_wire.hpp"
#include "hivemesh/net/secure_stream.hpp"
#include "hivemesh/net/ticket_store.hpp"
#include "hivemesh/net/transport.hpp"

#include <asio/async_result.hpp>
#include <asio/bind_cancellation_slot.hpp>
#include <asio/error.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/this_coro.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

namespace hivemesh::net {

using namespace std::chrono_literals;

/// Unary calls as one sealed datagram each way (crypto/datagram.hpp) instead of a stream on
/// a secure connection: no connection, handshake or stream to open, so a call to a peer never
/// met costs one round trip. A call goes this way when its target's key is given
/// (peer_endpoint::key), the callee serves the method by datagram (handler_options), and
/// request and reply fit in max_size; otherwise it goes by stream within the same timeout.
/// A peer that leaves every attempt unanswered is called by stream for silence_period: at
/// once if it never answered a datagram (UDP may be blocked on the way), else from its next
/// call, this one failing with `unreachable` (it answered before, so it is most likely down:
/// found out in a few of its round trips, where a dial would wait for its timeout). When the
/// callee's host says nothing takes datagrams at its port (ICMP port unreachable: the
/// process is gone, or serves no datagrams), the attempts end at once and the call goes by
/// stream, whose dial is refused as fast if the peer is gone; such notices are not
/// authenticated, so they only cut the wait short. A node's datagrams use UDP on the
/// address and port of each of its listeners (serve()), and calls to an address family
/// none of them serves use an ephemeral port of that family.
struct datagram_options {
    /// Off: every call goes by stream and the node opens no datagram socket.
    bool enabled = true;
    /// Largest datagram sent or taken, sealing included: 1232 bytes fit any IPv6 path
    /// (1280-byte MTU) unfragmented. From 128 to 65507.
    std::size_t max_size = 1232;
    /// How long to wait for a reply before sending the request again, doubled each time: to
    /// a peer that answered before, 4 times its smoothed round trip but at least
    /// min_retry_interval; to one that did not, retry_interval.
    duration retry_interval = std::chrono::milliseconds(250);
    duration min_retry_interval = std::chrono::milliseconds(20);
    /// Requests sent in all; at least 1.
    unsigned attempts = 3;
    /// A peer that left `attempts` requests unanswered is called by stream for this long.
    duration silence_period = std::chrono::minutes(10);
    /// Datagram calls served at once; further requests are answered `by stream`.
    std::size_t max_serving = 256;
    /// See crypto::datagram_options (the swarm key is security's).
    duration max_clock_skew = std::chrono::seconds(60);
    std::size_t max_cached_keys = 1024;
    double max_new_keys_per_second = 1000;
};

struct node_options {
    crypto::secure_options security;
    datagram_options datagrams;
    mux_options mux;
    /// Connect plus secure handshake, for dialing and for accepting.
    duration dial_timeout = 10s;
    /// A connection with no stream for this long (up to twice as long) is closed.
    duration idle_timeout = 60s;
    /// Time an incoming stream has to deliver its call header.
    duration header_timeout = 10s;
    /// Upper bound on any handler's run time, whatever the caller asks.
    duration max_handler_time = 600s;
    /// Open connections kept at most; 0 means no limit. A new connection (dialed or
    /// accepted) that would exceed it closes the least recently used connection that has
    /// carried a call and has none open (a connection yet to carry its first call is about
    /// to); when no connection qualifies the new one is kept anyway, so the limit never
    /// fails a call. For many nodes in one process, under the descriptor limit.
    std::size_t max_connections = 0;
    /// How long close() lets the calls in flight finish (both ways) before it closes their
    /// connections; 0 closes at once.
    duration drain_timeout = 2s;
    /// Incoming connections still in their handshake at once; a connection past this is
    /// closed at once, so a flood of silent connections holds at most this many
    /// descriptors (each for at most dial_timeout).
    std::size_t max_pending_handshakes = 256;
    /// Connections one PeerId may hold at once (two nodes dialing each other at the same
    /// time make two); 0 means no limit. One past it, accepted or dialed, is closed right
    /// after its handshake (only then is the identity known) and counted in
    /// node_statistics::connections_refused; dialing reuses an open connection, and fails
    /// with `refused` when the peer holds this many and none takes new streams (all in a
    /// drain). Each connection may carry mux_options::max_streams streams from the peer, so
    /// this bounds what one identity can make us hold.
    std::size_t max_connections_per_peer = 4;
    /// Caps on what the node sends and receives, in bytes per second summed over all its
    /// connections; 0 means no cap. What counts is every byte on the transport's streams
    /// (handshakes, record prefixes and tags included). In any window of length T the
    /// node writes at most max_upload_rate x T + burst bytes, and its reads hand on at
    /// most max_download_rate x T + burst, where burst = rate_limit_burst(rate): 50 ms at
    /// the cap, at least 64 KiB (see net/rate_limit.hpp). A capped download leaves the
    /// bytes in the transport, so the sender's flow control slows it. Each must be 0 or at
    /// least 1 (is_valid_rate_limit); the node's constructor throws std::invalid_argument
    /// otherwise (a negative, non-finite or tiny rate).
    double max_upload_rate = 0;
    double max_download_rate = 0;
    /// How long after a full handshake with a peer a later connection between the two,
    /// dialed by either, may resume: its handshake proves the ticket's secret instead of
    /// signing (see crypto/secure_channel.hpp; about half the CPU of a full one). 0: every
    /// handshake is full.
    duration resumption_lifetime = std::chrono::hours(1);
    /// Tickets kept at most, one per peer (about 300 bytes each).
    std::size_t max_resumption_tickets = 1024;
};

/// What is wrong with `options`' rate caps, naming the field ("max_upload_rate: ..."), or
/// an empty string when both are valid (is_valid_rate_limit).
inline std::string rate_limit_error(const node_options& options) {
    constexpr const char* valid = ": 0 (no cap) or a finite number of bytes per second, at least 1";
    if (!is_valid_rate_limit(options.max_upload_rate))
        return std::string("max_upload_rate") + valid;
    if (!is_valid_rate_limit(options.max_download_rate))
        return std::string("max_download_rate") + valid;
    return {};
}

/// Counters and current figures of a node, for monitoring and tests.
struct node_statistics {
    std::uint64_t accept_errors = 0;       ///< accepts that failed (e.g. out of descriptors)
    std::uint64_t handshakes_refused = 0;  ///< connections closed at max_pending_handshakes
    std::size_t pending_handshakes = 0;    ///< incoming connections in their handshake now
    std::uint64_t connections_refused = 0; ///< closed after the handshake: peer at its cap
    /// Idle connections closed to make room: under max_connections, or to free a
    /// descriptor for a dial or an accept when the process had none left.
    std::uint64_t connections_evicted = 0;
    std::uint64_t handshakes_completed = 0; ///< secure handshakes done, either side
    std::uint64_t handshakes_resumed = 0;   ///< of those, the ones that resumed a ticket
    /// Streams peers opened past mux_options::max_streams (reset with `refused`), on every
    /// connection so far, closed ones included.
    std::uint64_t streams_refused = 0;
    std::size_t open_connections = 0; ///< in the pool now
    std::size_t open_streams = 0;     ///< on those connections now, both directions
    /// Writes that waited for node_options::max_upload_rate: the bytes they carried and
    /// their waits, summed over the writes (connections wait side by side, so the sum may
    /// exceed the time that passed); 0 without a cap.
    std::uint64_t upload_delayed_bytes = 0;
    duration upload_delay{};
    /// The same for reads held back by node_options::max_download_rate.
    std::uint64_t download_delayed_bytes = 0;
    duration download_delay{};
    /// Datagrams sent and received (datagram_options), retries and replies included.
    std::uint64_t datagrams_sent = 0;
    std::uint64_t datagrams_received = 0;
    /// Received datagrams dropped: not sealed for us (forged, another swarm, outside the
    /// clock window), from a new sender past max_new_keys_per_second, malformed or too large.
    std::uint64_t datagrams_dropped = 0;
    /// Calls this node made with the callee's key that a datagram answered, and those that
    /// went by stream: the request or its answer did not fit, the key did not prove the
    /// PeerId, the callee does not serve the method by datagram, or within
    /// datagram_options::silence_period it left every attempt unanswered (a first such call
    /// to a peer that answered before fails with `unreachable` instead: neither count).
    std::uint64_t datagram_calls = 0;
    std::uint64_t datagram_fallbacks = 0;
    /// Of the fallbacks, those whose callee's host said no datagram socket was at its port.
    std::uint64_t datagram_refusals = 0;
};

/// Who to call: the PeerId the connection must prove, and where to dial if needed.
template <class Endpoint>
struct peer_endpoint {
    crypto::peer_id id;
    Endpoint endpoint;
    /// The peer's public key, when known: it lets a unary call go by datagram (see
    /// datagram_options). Ignored unless it proves `id`.
    std::optional<crypto::public_key> key = std::nullopt;
};

/// A unary call's outcome: the error, or the response.
using call_result = std::pair<std::error_code, byte_buffer>;

/// What a handler knows about the call it serves.
struct call_context {
    crypto::peer_id remote;
    std::string method;
    crypto::public_key remote_key; ///< the key that proved `remote`
};

class call_stream;

/// How a unary handler may be called.
struct handler_options {
    /// Also answer calls that come by datagram (datagram_options). Only for handlers that a
    /// repeated request does no harm: a datagram may arrive twice (a retry), or be replayed
    /// within the datagrams' clock window.
    bool datagrams = false;
};

/// `co_return` an error code; on success `response` is the reply.
using unary_handler = std::function<asio::awaitable<std::error_code>(
    const call_context&, byte_view request, byte_buffer& response)>;
/// Reads and writes messages on `stream`; the returned code is the call's final status.
using stream_handler =
    std::function<asio::awaitable<std::error_code>(const call_context&, call_stream& stream)>;

/// One side of a streaming call. The caller's side: write(), close_write(), read() until
/// eof (the callee's final status is then in status()). The callee's side: read() until
/// eof (the caller closed its side), write().
class call_stream {
public:
    call_stream() = default;
    call_stream(mux_stream stream, bool caller) noexcept
        : stream_(std::move(stream))
        , caller_(caller) {}

    /// Sends one message. Errors as mux_stream::send.
    asio::awaitable<std::error_code> write(byte_buffer message) {
        mux_message out = framed(std::move(message), nullptr); // named: see CONTRIBUTING.md
        co_return co_await stream_.send(std::move(out));
    }
    /// The same for a buffer shared with other writes (e.g. one result to many peers);
    /// it is not copied and must not change until the write completes.
    asio::awaitable<std::error_code> write(std::shared_ptr<const byte_buffer> message) {
        mux_message out = framed({}, std::move(message));
        co_return co_await stream_.send(std::move(out));
    }
    /// Sends `head` (copied; at most mux_message::max_lead - 1 bytes) followed by `body`,
    /// which is not copied: it must stay valid and unchanged until the write completes,
    /// and is read no more after that, however the write ended (mux_stream::send).
    /// Errors as mux_stream::send.
    asio::awaitable<std::error_code> write_borrowed(byte_view head, byte_view body) {
        mux_message out = framed({}, nullptr);
        out.add_lead(head);
        out.borrowed_body = body;
        co_return co_await stream_.send(std::move(out));
    }

    /// Caller only: no more messages from this side.
    asio::awaitable<std::error_code> close_write() { co_return co_await stream_.end(); }

    /// The next message; asio::error::eof at the end. For the caller, the callee's error
    /// status is returned as the error (and kept in status()).
    asio::awaitable<std::error_code> read(byte_buffer& message) {
        if (!caller_) co_return co_await stream_.receive(message);
        byte_buffer raw;
        byte_view body;
        const auto ec = co_await read(raw, body);
        if (!ec) message.assign(body.begin(), body.end());
        co_return ec;
    }

    /// As read(message), without copying: the message is `body`, a view into `storage`.
    asio::awaitable<std::error_code> read(byte_buffer& storage, byte_view& body) {
        body = {};
        if (!caller_) {
            const auto ec = co_await stream_.receive(storage);
            if (!ec) body = storage;
            co_return ec;
        }
        while (true) {
            if (ended_) co_return status_ ? status_ : std::error_code(asio::error::eof);
            if (auto ec = co_await stream_.receive(storage)) {
                if (ec == asio::error::eof) { // ended without a reply or status
                    ended_ = true;
                    status_ = errc::protocol_violation;
                }
                co_return ec == asio::error::eof ? status_ : ec;
            }
            reply_message reply;
            if (auto ec = decode_reply(storage, reply)) {
                stream_.reset(errc::protocol_violation);
                co_return ec;
            }
            if (reply.tag == reply_tag::status) {
                ended_ = true;
                status_ = reply.status;
                co_return status_;
            }
            if (reply.tag == reply_tag::reply) ended_ = true;
            if (reply.tag == reply_tag::reply && reply.body.empty()) continue;
            body = reply.body;
            co_return std::error_code{};
        }
    }

    /// The callee's final status once read() returned eof or an error status.
    std::error_code status() const noexcept { return status_; }
    const crypto::peer_id& remote() const noexcept { return stream_.remote(); }
    /// Aborts the call; the other side sees `code`.
    void cancel(errc code = errc::cancelled) { stream_.reset(code); }
    mux_stream& stream() noexcept { return stream_; }

private:
    /// The callee's messages carry the reply tag in front.
    mux_message framed(byte_buffer body, std::shared_ptr<const byte_buffer> shared) const {
        mux_message message;
        message.body = std::move(body);
        message.shared_body = std::move(shared);
        const auto tag = static_cast<std::byte>(reply_tag::data);
        if (!caller_) message.add_lead(byte_view(&tag, 1));
        return message;
    }

    mux_stream stream_;
    bool caller_ = false;
    bool ended_ = false;
    std::error_code status_;
};

/// Whether `ec` says this process (or the system) has no file descriptor left (EMFILE,
/// ENFILE): a shortage of our own, which says nothing about the peer a call was for.
/// Compared by value, since Asio's own system category does not map these to std::errc.
inline bool out_of_descriptors(std::error_code ec) {
    const bool errno_value = ec.category() == asio::error::get_system_category() ||
                             ec.category() == std::system_category() ||
                             ec.category() == std::generic_category();
    return errno_value && (ec.value() == EMFILE || ec.value() == ENFILE);
}

namespace detail {

/// The secure session over a transport's (rate-capped) stream as the multiplexer's record
/// channel.
template <transport Transport, class Stream>
class secure_record_channel final : public record_channel {
public:
    explicit secure_record_channel(secure_stream<Stream> stream)
        : stream_(std::move(stream)) {}
    asio::awaitable<std::error_code> write(std::span<const byte_view> heads,
                                           std::span<const byte_view> bodies) override {
        co_return co_await stream_.write(heads, bodies);
    }
    asio::awaitable<std::error_code> read(byte_view& record) override {
        co_return co_await stream_.read(record);
    }
    asio::awaitable<std::error_code> wait() override { return stream_.wait(); } // no frame
    bool reads_bodies_while_pending() const noexcept override {
        return stream_.cipher() == crypto::cipher::plaintext; // established: cannot throw
    }
    asio::awaitable<std::error_code> read_placed(byte_view& record, std::size_t head_size,
                                                 const placement& place,
                                                 std::size_t& placed) override {
        co_return co_await stream_.read(record, head_size, place, placed);
    }
    void close() noexcept override { stream_.close(); }
    duration round_trip_time() noexcept override {
        return Transport::round_trip_time(stream_.next_layer().next_layer());
    }
    time_point now() noexcept override { return transport_now<Transport>(stream_.get_executor()); }

private:
    secure_stream<Stream> stream_;
};

/// Maps transport errors to the RPC layer's codes; running out of descriptors stays as it is.
inline std::error_code to_rpc_error(std::error_code ec) {
    if (!ec || ec.category() == hivemesh_category()) return ec;
    if (out_of_descriptors(ec)) return ec; // a local shortage, not the peer's doing
    if (ec == asio::error::connection_refused) return errc::refused;
    if (ec == asio::error::timed_out) return errc::timeout;
    if (ec == asio::error::operation_aborted) return errc::cancelled;
    if (ec == asio::error::host_unreachable || ec == asio::error::network_unreachable ||
        ec == asio::error::host_not_found)
        return errc::unreachable;
    return errc::connection_closed;
}

inline std::uint32_t to_timeout_ms(duration d) {
    const auto ms = std::chrono::ceil<std::chrono::milliseconds>(d).count();
    return static_cast<std::uint32_t>(std::clamp<std::int64_t>(ms, 1, 0xFFFFFFFF));
}

} // namespace detail

/// `operation`'s result, or errc::timeout once `deadline` (armed by the caller, who may cancel
/// it to give up early: errc::cancelled) expires first; the operation is cancelled then.
/// Result: std::error_code, or a pair or tuple whose first member is one (failed_result).
template <class Timer, class Result>
asio::awaitable<Result> within(asio::awaitable<Result> operation, Timer& deadline) {
    using namespace asio::experimental::awaitable_operators;
    auto outcome =
        co_await (std::move(operation) ||
                  deadline.async_wait(asio::experimental::as_tuple(asio::use_awaitable)));
    if (outcome.index() == 0) co_return std::move(std::get<0>(outcome));
    const auto [waited] = std::get<1>(outcome);
    co_return failed_result<Result>(waited ? errc::cancelled : errc::timeout);
}

/// within() a deadline `limit` from now, on a `Timer` (the transport's timer type, so that
/// simulated time counts) of the awaiting coroutine's executor.
template <class Timer, class Result>
asio::awaitable<Result> within(asio::awaitable<Result> operation, duration limit) {
    Timer deadline(co_await asio::this_coro::executor);
    deadline.expires_after(limit);
    co_return co_await within(std::move(operation), deadline);
}

/// An RPC node over `Transport` (net::tcp::transport or net::sim::transport).
template <transport Transport>
class node {
public:
    using endpoint_type = typename Transport::endpoint_type;
    using stream_type = typename Transport::stream_type;
    using listener_type = typename Transport::listener_type;
    using timer_type = typename Transport::timer_type;
    using peer = peer_endpoint<endpoint_type>;
    using datagram_socket_type = typename Transport::datagram_socket_type;

    /// A node of `identity` on `transport`; it serves nothing until serve(). Throws
    /// std::invalid_argument for a rate cap that is not is_valid_rate_limit or datagram
    /// options out of their ranges.
    node(Transport& transport, crypto::identity identity, node_options options = {});
    node(const node&) = delete;
    node& operator=(const node&) = delete;
    ~node();

    const crypto::peer_id& id() const noexcept { return state_->identity.id(); }
    const crypto::identity& identity() const noexcept { return state_->identity; }
    asio::any_io_executor get_executor() const { return state_->executor; }
    /// The options the node was made with.
    const node_options& options() const noexcept { return state_->options; }

    /// Starts accepting on `listener` (from the transport's listen()); its endpoint also
    /// takes datagrams (datagram_options: when its UDP port cannot be had, the node serves no
    /// datagrams there and logs why).
    /// A failed accept (e.g. out of file descriptors) is retried after a pause that doubles
    /// from 10 ms to 1 s while failures go on (counted in statistics()).
    void serve(listener_type listener);

    /// The counters so far and the current figures. On the node's executor, as every
    /// member (it walks the connection pool).
    node_statistics statistics() const;

    /// Registers a handler; a name registered again replaces the old handler.
    /// Throws std::invalid_argument for a malformed method name.
    void add_handler(const std::string& method, unary_handler handler, handler_options how = {});
    void add_stream_handler(const std::string& method, stream_handler handler);

    /// Calls `method` on `target` with `request`, within `timeout`.
    /// Completion: void(std::error_code, byte_buffer response). Errors: timeout, cancelled
    /// (the token's cancellation slot was emitted), unreachable, refused (no such method,
    /// nothing listening), handshake_failed, peer_id_mismatch, connection_closed,
    /// message_too_large, protocol_violation, the system's too-many-open-files error (out
    /// of descriptors with no idle connection to close), or the handler's own error code.
    template <ASIO_COMPLETION_TOKEN_FOR(void(std::error_code, byte_buffer)) Token = default_token_t>
    auto async_call(peer target, std::string method, byte_buffer request, duration timeout,
                    Token&& token = default_token_t{}) {
        return asio::async_initiate<Token, void(std::error_code, byte_buffer)>(
            [st = state_](auto handler, peer target, std::string method, byte_buffer request,
                          duration timeout) {
                start_call(st, std::move(target), std::move(method), std::move(request), timeout,
                           call_handler(std::move(handler), st->executor));
            },
            token, std::move(target), std::move(method), std::move(request), timeout);
    }

    /// Opens a streaming call; the whole call (until both sides end) must finish within
    /// `timeout`, after which the stream is reset with errc::timeout. Errors as
    /// async_call() for the connection.
    asio::awaitable<std::error_code> open_call(peer target, std::string method, duration timeout,
                                               call_stream& out);

    /// open_call() that gives up with errc::timeout once `limit` has passed (a dead peer then
    /// costs `limit`, not node_options::dial_timeout); the call, once open, keeps `timeout`.
    asio::awaitable<std::error_code> open_call_within(peer target, std::string method,
                                                      duration timeout, duration limit,
                                                      call_stream& out) {
        return within<timer_type>(open_call(std::move(target), std::move(method), timeout, out),
                                  limit);
    }

    /// Opens a connection to `target` now (calls do it on demand).
    asio::awaitable<std::error_code> connect(peer target);

    /// One open connection, as seen by connections().
    struct connection_info {
        crypto::peer_id remote;
        bool dialed = false; ///< this node dialed it
        std::size_t streams = 0;
        mux_statistics statistics;
    };

    /// Every open connection with its counters.
    std::vector<connection_info> connections() const;

    /// Number of open connections.
    std::size_t connection_count() const;

    /// The public key `peer` proved on an open connection; nullopt with none open.
    std::optional<crypto::public_key> key_of(const crypto::peer_id& peer) const;

    /// Stops listening and starts no call; new calls fail with connection_closed. Idle
    /// connections close at once. The others get a goaway (their peers open nothing more
    /// on them) and close once their calls in flight, both ways, have finished, or after
    /// node_options::drain_timeout, which fails the calls still open with
    /// connection_closed. Idempotent. Destroying the node does close_now().
    void close();

    /// close() without the drain: every connection closes at once, failing the calls in
    /// flight with connection_closed (also those a close() was draining).
    void close_now();

    /// close(), then waits for the drain. Completion: void(std::error_code): success, or
    /// timeout when calls were still open at drain_timeout (they failed); bounded by
    /// drain_timeout. Cancellation (cancelled) ends only the wait, not the drain.
    template <ASIO_COMPLETION_TOKEN_FOR(void(std::error_code)) Token = default_token_t>
    auto async_close(Token&& token = default_token_t{}) {
        return asio::async_initiate<Token, void(std::error_code)>(
            [this](auto handler) {
                close();
                co_launch(state_->executor, drained(state_), std::move(handler),
                          "net::node::async_close");
            },
            token);
    }

private:
    struct pooled_connection {
        std::shared_ptr<mux_connection> connection;
        crypto::public_key remote_key; ///< proven by its handshake
        std::uint64_t seen_activity = ~std::uint64_t{0};
        std::uint64_t last_used = 0; ///< use_clock at its last call: its key in by_use
    };

    struct pending_dial {
        std::vector<std::shared_ptr<wakeup>> waiters;
        std::error_code result;
    };

    /// A datagram socket and the remotes it reaches.
    struct datagram_port {
        std::shared_ptr<datagram_socket_type> socket; ///< shared with its receive loop
        /// The transport's datagram_endpoint_for its local endpoint: a remote whose
        /// datagram_endpoint_for is the same (its address family) can be sent to from it.
        endpoint_type family;
        bool serving; ///< a listener's endpoint, not one opened for calls
    };

    /// A peer called by datagram.
    struct datagram_peer {
        duration round_trip{};     ///< smoothed, of answered first attempts; zero: none yet
        time_point silent_until{}; ///< called by stream until then (transport time)
    };

    /// A datagram call waiting for its reply.
    struct datagram_wait {
        datagram_wait(const asio::any_io_executor& executor, crypto::public_key key,
                      endpoint_type to)
            : callee(key)
            , target(std::move(to))
            , wake(executor) {}
        crypto::public_key callee;
        endpoint_type target;
        wakeup wake;
        bool answered = false;
        bool by_stream = false; ///< the callee said to call by stream
        bool refused = false;   ///< the callee's host said no socket is at its port
        byte_buffer reply;      ///< the reply or status message
    };

    /// A listener, and the timer that paces its retries after failed accepts.
    struct listening {
        listening(listener_type l, const asio::any_io_executor& executor)
            : listener(std::move(l))
            , retry(executor) {}
        listener_type listener;
        timer_type retry;
    };

    struct state {
        state(Transport& t, crypto::identity id, node_options opts)
            : transport(t)
            , executor(t.executor())
            , identity(std::move(id))
            , options(std::move(opts))
            , upload(detail::make_bucket(options.max_upload_rate))
            , download(detail::make_bucket(options.max_download_rate))
            , tickets(options.resumption_lifetime > duration::zero()
                          ? options.max_resumption_tickets
                          : 0)
            , sweep_timer(executor) {
            if (options.datagrams.enabled)
                sealer.emplace(identity, crypto::datagram_options{
                                             .swarm_key = options.security.swarm_key,
                                             .max_clock_skew = options.datagrams.max_clock_skew,
                                             .max_cached_keys = options.datagrams.max_cached_keys,
                                             .max_new_keys_per_second =
                                                 options.datagrams.max_new_keys_per_second});
        }

        Transport& transport;
        asio::any_io_executor executor;
        crypto::identity identity;
        node_options options;
        /// The rate caps' buckets, shared by every connection (none: no cap).
        std::shared_ptr<detail::token_bucket> upload;
        std::shared_ptr<detail::token_bucket> download;
        detail::ticket_store tickets;
        std::vector<std::shared_ptr<listening>> listeners;
        node_statistics statistics; ///< the counters; the current figures are computed
        std::unordered_map<crypto::peer_id, std::vector<pooled_connection>> connections;
        std::unordered_map<crypto::peer_id, std::shared_ptr<pending_dial>> dials;
        std::map<std::string, unary_handler, std::less<>> unary_handlers;
        std::map<std::string, stream_handler, std::less<>> stream_handlers;
        std::set<std::string, std::less<>> datagram_methods; ///< handler_options::datagrams
        timer_type sweep_timer;
        /// Datagrams: none unless enabled; a port is opened by each serve() and, for an
        /// address family no listener serves, by the first call there.
        std::optional<crypto::datagram_sealer> sealer;
        std::vector<datagram_port> datagram_ports;
        std::uint64_t next_datagram_call = 0;
        std::unordered_map<std::uint64_t, datagram_wait*> datagram_calls;
        /// What the node knows of the peers it called by datagram (at most 4096).
        std::unordered_map<crypto::peer_id, datagram_peer> datagram_peers;
        std::size_t datagrams_in_service = 0;
        std::uint64_t use_clock = 0;
        /// The pooled connections by last use, oldest first: make_room's eviction order,
        /// kept as they are used rather than found by scanning the pool.
        std::map<std::uint64_t, mux_connection*> by_use;
        bool closed = false;
        std::size_t draining = 0; ///< connections close() is still draining
        bool drain_cut = false;   ///< one of them still had calls at drain_timeout
        std::vector<std::shared_ptr<wakeup>> drain_waiters;
    };
    using state_ptr = std::shared_ptr<state>;
    /// What a connection's secure session runs on: the transport's stream under the caps.
    using capped_stream = detail::throttled_stream<stream_type, timer_type>;

    /// `options`, if its rate caps are valid; else throws std::invalid_argument.
    static node_options checked(node_options options);

    static void check_method(const std::string& method);

    // ---- connections (impl/node_connections.hpp) ------------------------------------

    /// An open connection to `id` that takes new streams, marked used; of two, the one the
    /// smaller PeerId dialed. Null when there is none.
    static std::shared_ptr<mux_connection> find_connection(const state_ptr& st,
                                                           const crypto::peer_id& id);

    /// Marks `connection` used now (an incoming call), for the least-recently-used choice.
    static void touch(const state_ptr& st, const crypto::peer_id& remote,
                      const mux_connection* connection);
    static void mark_used(const state_ptr& st, pooled_connection& pooled);

    /// Closes the least recently used idle connection; false if none is idle. A connection
    /// that never carried a stream is not idle but new: its dialer is about to call on it
    /// (closing it would fail that call).
    static bool close_idle(const state_ptr& st);

    /// Closes least recently used idle connections until one more fits under
    /// max_connections, or none is idle.
    static void make_room(const state_ptr& st);

    /// Runs `handshake` on `stream`, closing the stream if it takes longer than the dial
    /// timeout; then starts a multiplexed connection and adds it to the pool.
    static asio::awaitable<std::error_code> secure(state_ptr st, stream_type raw, crypto::role side,
                                                   std::optional<crypto::peer_id> expected,
                                                   std::shared_ptr<mux_connection>& out);

    static void forget(const state_ptr& st, const crypto::peer_id& remote,
                       const mux_connection* connection);

    /// Whether `remote` holds max_connections_per_peer open connections already.
    static bool at_peer_cap(const state_ptr& st, const crypto::peer_id& remote);

    /// An open connection to `target`, dialing if there is none. Concurrent callers share
    /// one dial.
    static asio::awaitable<std::error_code> connect(state_ptr st, peer target,
                                                    std::shared_ptr<mux_connection>& out);

    static asio::awaitable<void> run_dial(state_ptr st, peer target,
                                          std::shared_ptr<pending_dial> dial);

    static asio::awaitable<void> accept_loop(state_ptr st, std::shared_ptr<listening> l);

    static asio::awaitable<void> accept_one(state_ptr st, stream_type stream);

    /// Waits until `connection` has no stream or drain_timeout passed, then closes it.
    static asio::awaitable<void> drain(state_ptr st, std::shared_ptr<mux_connection> connection);

    /// Completes when close()'s drain has ended; timeout if it had to cut calls.
    static asio::awaitable<std::error_code> drained(state_ptr st);

    /// Closes connections that had no stream during a whole idle period.
    static asio::awaitable<void> sweep_idle(state_ptr st);

    // ---- calls (impl/node_calls.hpp) -----------------------------------------------

    /// async_call's handler, erased so that start_call is compiled once.
    using call_handler = erased_handler<void(std::error_code, byte_buffer)>;

    static void start_call(const state_ptr& st, peer target, std::string method,
                           byte_buffer request, duration timeout, call_handler handler);

    static asio::awaitable<call_result> unary_call(state_ptr st, peer target, std::string method,
                                                   byte_buffer request, duration timeout);

    static asio::awaitable<call_result> unary_exchange(state_ptr st, peer target,
                                                       std::string method, byte_buffer request,
                                                       duration timeout);

    /// Resets the stream watched by `watch` with errc::timeout unless it ends first.
    static asio::awaitable<void> reset_after(mux_stream::watcher watch, duration timeout,
                                             state_ptr st);

    /// Runs a handler's coroutine; what it throws becomes its status code.
    static asio::awaitable<std::error_code> guarded(const std::string& method,
                                                    asio::awaitable<std::error_code> work);

    static asio::awaitable<void> serve_call(state_ptr st, mux_stream stream,
                                            crypto::public_key remote_key);

    // ---- datagrams (impl/node_datagrams.hpp) ---------------------------------------

    /// Opens a datagram port on `local` and starts its receive loop: null, logged, if it
    /// cannot be opened.
    static std::shared_ptr<datagram_socket_type>
    open_datagrams(const state_ptr& st, const endpoint_type& local, bool serving);

    /// The port to send to `remote` from: a listener's of its address family, else one
    /// opened for that family; null if none can be opened.
    static std::shared_ptr<datagram_socket_type> datagram_port_for(const state_ptr& st,
                                                                   const endpoint_type& remote);

    /// What the node remembers of `id` (made if new, within the bound).
    static datagram_peer& datagram_peer_of(const state_ptr& st, const crypto::peer_id& id);

    /// The unary call by datagram: its result, or nullopt when it must go by stream (no
    /// key, too large, no port, the peer silent or saying so).
    static asio::awaitable<std::optional<call_result>>
    datagram_exchange(state_ptr st, const peer& target, const std::string& method,
                      const byte_buffer& request, duration timeout);

    /// Sends `datagram` to `to` once the upload cap allows it; the send's error, if any.
    static asio::awaitable<std::error_code>
    send_datagram(state_ptr st, std::shared_ptr<datagram_socket_type> port, byte_buffer datagram,
                  endpoint_type to);

    static asio::awaitable<void> receive_datagrams(state_ptr st,
                                                   std::shared_ptr<datagram_socket_type> port);
    /// Ends the datagram calls to where `port`'s datagrams found no socket (its
    /// async_receive_error), so that they go by stream at once.
    static asio::awaitable<void>
    receive_datagram_errors(state_ptr st, std::shared_ptr<datagram_socket_type> port);

    /// Handles one received datagram (opened in place).
    static void on_datagram(const state_ptr& st, const std::shared_ptr<datagram_socket_type>& port,
                            std::span<std::byte> datagram, const endpoint_type& from);

    /// Runs the handler of a datagram request and sends its reply.
    static asio::awaitable<void> serve_datagram(state_ptr st,
                                                std::shared_ptr<datagram_socket_type> port,
                                                crypto::public_key caller, endpoint_type from,
                                                std::uint64_t call, std::string method,
                                                std::uint32_t timeout_ms, byte_buffer request);

    /// Seals `payload` for `to`; an empty buffer if it cannot be (an invalid key).
    static byte_buffer seal_datagram(const state_ptr& st, const crypto::public_key& to,
                                     const byte_buffer& payload);

    state_ptr state_;
};

} // namespace hivemesh::net

// Header-only use sees the member definitions here. With HIVEMESH_SEPARATE_COMPILATION (the
// hivemesh::compiled target) they are compiled once, in src/net.cpp, for net::tcp and net::sim,
// and a program links them from there; the TCP instantiation is declared extern so that
// no translation unit instantiates it again.
#if !defined(HIVEMESH_SEPARATE_COMPILATION)
#include "hivemesh/net/impl/node_calls.hpp"
#include "hivemesh/net/impl/node_connections.hpp"
#include "hivemesh/net/impl/node_datagrams.hpp"
#else
#include "hivemesh/net/tcp.hpp"

namespace hivemesh::net {
extern template class node<net::tcp::transport>;
} // namespace hivemesh::net
#endif
