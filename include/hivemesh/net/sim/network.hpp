// The simulated network: numbered nodes in one process exchanging reliable, ordered byte
// streams over links with latency, bandwidth and loss, with partitions and crashes, on
// virtual time (sim/virtual_time.hpp). Same seed, same calls => same event trace.
//
// Model, per direction of a connection (a -> b):
//   - Written bytes are copied once into the direction's buffer and count against
//     `send_buffer_size` until b's application reads them; async_write_some accepts at most
//     the free space and waits while there is none (TCP-like backpressure).
//   - A pump cuts unsent bytes into segments of at most `max_segment_size`, one segment
//     being serialised at a time per direction. A segment uses a's uplink
//     (upload_bandwidth, shared by all of a's connections), then the a -> b link
//     (bandwidth, shared by all a -> b connections), then b's downlink (download_bandwidth,
//     shared by everything b receives, entered when its first byte arrives). Each stage
//     serves segments first come, first served, and a stage cannot finish before the stage
//     before it: arrival = max(link done + latency, downlink start + size / download rate).
//   - Loss is drawn per transmission from the network's random_generator. A lost segment
//     is sent again after the retransmission timeout (max(min_rto, 2 x RTT), doubled per
//     attempt up to max_rto) and may be lost again: loss only adds delay. Bytes reach the
//     application in order: a segment waits for every earlier one.
//   - Across a partition nothing arrives: segments (and resets) that would are held, and
//     are sent again when the nodes can reach each other (heal()).
//   - Connection set-up is a lossless SYN / SYN-ACK exchange: refused (connection_refused)
//     one round trip after dialing a node that is up but not listening there (or whose
//     backlog is full); timed_out after the connect timeout if the node is down or across a
//     partition. The acceptor's side exists from the SYN's arrival, so the listener may
//     write before the dialer's connect completes.
//   - A reset (RST) travels with the link's latency. It is sent when a node crashes (for
//     each of its connections), when data arrives at a closed end, when a listener closes
//     with connections not yet accepted, and when a dialer no longer wants an answered
//     dial. The receiving end then discards unread bytes and fails every operation with
//     asio::error::connection_reset.
//
// Datagrams (datagram_socket, UDP-like) travel as one segment each, through the same uplink,
// link and downlink stages and with the same loss draw, but are never sent again: a datagram
// lost, across a partition, from or to a crashed node, to a port without a datagram socket,
// or to a socket whose queue holds datagram_queue_bytes or more, is dropped silently. One
// that reaches a node that is up but has no datagram socket at its port is answered, as a
// host's ICMP port unreachable is (unless port_unreachable_notices is off): a notice of
// notice_size bytes goes back through the same stages, may be lost too, and if the socket
// that sent the datagram is still open queues connection_refused for its
// async_receive_error (at most max_queued_notices; later ones are dropped). Real hosts
// rate-limit these notices; the simulated ones do not.
// Datagram ports are apart from listening ports, as UDP's are from TCP's.
//
// Everything runs on the io_context's single thread, driven by virtual_time's run
// functions; there is no locking. Destroy the network before its io_context.
#pragma once

#include <hivemesh/core/bytes.hpp>
#include <hivemesh/core/clock.hpp>
#include <hivemesh/core/random.hpp>
#include <hivemesh/net/sim/virtual_time.hpp>

#include <asio.hpp>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cinttypes>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <ostream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace hivemesh::net::sim {

/// A node of the simulated network, numbered from 0 in order of add_node().
using node_id = std::uint64_t;

/// Where a simulated stream ends: a node and a port.
struct endpoint {
    node_id node = 0;
    std::uint16_t port = 0;

    friend bool operator==(const endpoint&, const endpoint&) = default;
    friend auto operator<=>(const endpoint&, const endpoint&) = default;
};

inline std::string to_string(const endpoint& e) {
    return "sim:" + std::to_string(e.node) + ":" + std::to_string(e.port);
}

inline std::ostream& operator<<(std::ostream& out, const endpoint& e) {
    return out << to_string(e);
}

/// Properties of one direction of the path between two nodes.
struct link_properties {
    duration latency = std::chrono::milliseconds(10); ///< one way, >= 0
    std::uint64_t bandwidth = 0;                      ///< bytes per second, 0 = unlimited
    double loss = 0.0;                                ///< probability per transmission, [0, 1]
};

struct network_config {
    link_properties default_link{};
    /// Bytes written to one direction of a connection and not yet read by the peer's
    /// application; writers wait when it is full.
    std::size_t send_buffer_size = std::size_t{4} << 20;
    std::size_t max_segment_size = std::size_t{64} << 10; ///< 1 .. 16 MiB
    duration connect_timeout = std::chrono::seconds(3);
    duration min_retransmission_timeout = std::chrono::milliseconds(200);
    duration max_retransmission_timeout = std::chrono::seconds(60);
    std::size_t default_backlog = 128;     ///< connections a listener queues before refusing
    std::size_t max_datagram_size = 65507; ///< UDP's limit over IPv4; 1 .. 16 MiB
    /// Bytes of unread datagrams a datagram socket queues; one arriving while its queue holds
    /// this much or more is dropped.
    std::size_t datagram_queue_bytes = std::size_t{256} << 10;
    /// Whether a datagram to a port without a socket is answered with a notice (see the top
    /// of this file); off, it is dropped silently, as behind a firewall that filters ICMP.
    bool port_unreachable_notices = true;
    /// Events kept as text by trace_log() (the most recent ones); 0 keeps none.
    std::size_t trace_log_capacity = 0;
};

/// Counters since the network was created.
struct network_statistics {
    std::uint64_t events = 0; ///< trace events recorded
    std::uint64_t connections_established = 0;
    std::uint64_t connections_refused = 0;
    std::uint64_t connect_timeouts = 0;
    std::uint64_t resets = 0;          ///< resets sent
    std::uint64_t segments_sent = 0;   ///< transmissions, retransmissions included
    std::uint64_t segments_lost = 0;   ///< transmissions lost to random loss
    std::uint64_t segments_held = 0;   ///< arrivals held back by a partition
    std::uint64_t bytes_delivered = 0; ///< bytes that reached the receiving node, in order
    std::uint64_t datagrams_sent = 0;
    std::uint64_t datagrams_delivered = 0; ///< put in the queue of the receiving socket
    /// Lost, across a partition, from or to a crashed node, to no socket, to a full queue.
    std::uint64_t datagrams_dropped = 0;
    std::uint64_t notices_delivered = 0; ///< port unreachable notices queued at their socket
};

/// Kinds of trace events. The numbers in a trace line follow the kind's comment.
enum class trace_kind : std::uint8_t {
    node_added = 1,   ///< node
    listen,           ///< node port
    unlisten,         ///< node port
    dial,             ///< dial from to port
    syn_dropped,      ///< dial
    refused,          ///< dial
    connect_timeout,  ///< dial
    dial_aborted,     ///< dial
    accepted,         ///< connection dial (the acceptor's side exists)
    established,      ///< connection dial (the dialer's connect completed)
    segment_sent,     ///< connection side|fin<<1|attempt<<8 offset size
    segment_lost,     ///< same as segment_sent
    segment_held,     ///< same as segment_sent
    segment_arrived,  ///< same as segment_sent
    close,            ///< connection side
    shutdown_send,    ///< connection side
    shutdown_receive, ///< connection side
    reset_sent,       ///< connection side (the side that sends it)
    reset_held,       ///< connection side (the side it is for)
    reset_received,   ///< connection side
    crash,            ///< node
    restart,          ///< node
    partition,        ///< partition-side group-size
    heal,             ///<
    datagram_sent,    ///< datagram from to port|size<<16
    /// datagram reason: 1 lost, 2 unreachable (partition, unknown node), 3 sender or receiver
    /// crashed, 4 no socket at the port, 5 the socket's queue is full
    datagram_dropped,
    notice_delivered, ///< datagram (the one its sender is told no socket took)
};

inline const char* to_string(trace_kind kind) noexcept {
    switch (kind) {
    case trace_kind::node_added:
        return "node_added";
    case trace_kind::listen:
        return "listen";
    case trace_kind::unlisten:
        return "unlisten";
    case trace_kind::dial:
        return "dial";
    case trace_kind::syn_dropped:
        return "syn_dropped";
    case trace_kind::refused:
        return "refused";
    case trace_kind::connect_timeout:
        return "connect_timeout";
    case trace_kind::dial_aborted:
        return "dial_aborted";
    case trace_kind::accepted:
        return "accepted";
    case trace_kind::established:
        return "established";
    case trace_kind::segment_sent:
        return "segment_sent";
    case trace_kind::segment_lost:
        return "segment_lost";
    case trace_kind::segment_held:
        return "segment_held";
    case trace_kind::segment_arrived:
        return "segment_arrived";
    case trace_kind::close:
        return "close";
    case trace_kind::shutdown_send:
        return "shutdown_send";
    case trace_kind::shutdown_receive:
        return "shutdown_receive";
    case trace_kind::reset_sent:
        return "reset_sent";
    case trace_kind::reset_held:
        return "reset_held";
    case trace_kind::reset_received:
        return "reset_received";
    case trace_kind::crash:
        return "crash";
    case trace_kind::restart:
        return "restart";
    case trace_kind::partition:
        return "partition";
    case trace_kind::heal:
        return "heal";
    case trace_kind::datagram_sent:
        return "datagram_sent";
    case trace_kind::datagram_dropped:
        return "datagram_dropped";
    case trace_kind::notice_delivered:
        return "notice_delivered";
    }
    return "unknown";
}

class stream;
class listener;
class datagram_socket;
class network;

namespace detail {

// Buffer sequences are copied into a fixed list at initiation so that non-template state
// can complete the operation later. Like Asio's own, only the first buffers are used.
inline constexpr std::size_t max_buffers = 16;

template <class Buffer>
struct buffer_list {
    std::array<Buffer, max_buffers> items{};
    std::size_t count = 0;
    std::size_t total = 0;

    template <class Sequence>
    static buffer_list from(const Sequence& sequence) {
        buffer_list list;
        const auto end = asio::buffer_sequence_end(sequence);
        for (auto it = asio::buffer_sequence_begin(sequence); it != end && list.count < max_buffers;
             ++it) {
            const Buffer buffer(*it);
            if (buffer.size() == 0) continue; // so that empty buffers do not use up the list
            list.items[list.count++] = buffer;
            list.total += buffer.size();
        }
        return list;
    }
};

using mutable_buffers = buffer_list<asio::mutable_buffer>;
using const_buffers = buffer_list<asio::const_buffer>;

/// FIFO of bytes kept as the chunks they were written in (one copy in, one copy out).
class byte_queue {
public:
    std::size_t size() const noexcept { return size_; }

    /// Appends the first `n` bytes of `source` (n <= source.total).
    void append(const const_buffers& source, std::size_t n) {
        if (n == 0) return;
        byte_buffer chunk(n);
        std::size_t copied = 0;
        for (std::size_t i = 0; i < source.count && copied < n; ++i) {
            const auto take = std::min(source.items[i].size(), n - copied);
            std::memcpy(chunk.data() + copied, source.items[i].data(), take);
            copied += take;
        }
        chunks_.push_back(std::move(chunk));
        size_ += n;
    }

    /// Moves up to `n` bytes from the front into `target`; returns how many.
    std::size_t pop_into(const mutable_buffers& target, std::size_t n) {
        n = std::min({n, size_, target.total});
        std::size_t done = 0;
        std::size_t index = 0;
        std::size_t offset = 0; // within target.items[index]
        while (done < n) {
            const auto& chunk = chunks_.front();
            const auto& buffer = target.items[index];
            const auto take =
                std::min({chunk.size() - front_offset_, buffer.size() - offset, n - done});
            std::memcpy(static_cast<std::byte*>(buffer.data()) + offset,
                        chunk.data() + front_offset_, take);
            done += take;
            offset += take;
            if (offset == buffer.size()) {
                ++index;
                offset = 0;
            }
            advance(take);
        }
        return n;
    }

    /// Removes up to `n` bytes from the front.
    void discard(std::size_t n) {
        n = std::min(n, size_);
        while (n > 0) {
            const auto take = std::min(chunks_.front().size() - front_offset_, n);
            advance(take);
            n -= take;
        }
    }

private:
    void advance(std::size_t n) {
        front_offset_ += n;
        size_ -= n;
        if (front_offset_ == chunks_.front().size()) {
            chunks_.pop_front();
            front_offset_ = 0;
        }
    }

    std::deque<byte_buffer> chunks_;
    std::size_t front_offset_ = 0;
    std::size_t size_ = 0;
};

/// Key of the direction from -> to in per-link tables (add_node keeps ids below 2^32).
inline constexpr std::uint64_t link_key(node_id from, node_id to) noexcept {
    return (from << 32) | to;
}

inline constexpr std::size_t other(std::size_t side) noexcept {
    return 1 - side;
}

struct network_core;

/// A run of bytes in flight: sent, not yet delivered in order.
struct segment {
    std::uint64_t begin = 0; ///< offsets in the direction's byte stream
    std::uint64_t end = 0;
    std::uint32_t attempts = 0;
    bool fin = false; ///< the writer's end of stream follows the last byte
    bool arrived = false;
    bool held = false; ///< stopped by a partition; sent again when it heals
};

/// One direction of a connection: written at ends[side], read at ends[other(side)].
/// Offsets count bytes since the connection opened: consumed <= delivered <= sent <= written.
struct direction {
    byte_queue data; ///< bytes [consumed, written)
    std::uint64_t written = 0;
    std::uint64_t sent = 0;
    std::uint64_t delivered = 0;
    std::uint64_t consumed = 0;
    std::deque<segment> in_flight; ///< references stay valid: only the ends change
    bool fin_queued = false;
    bool fin_sent = false;
    bool fin_delivered = false;
    bool pumping = false; ///< a segment of ours is being serialised onto the uplink
    bool parked = false;  ///< in network_core::parked, waiting for a partition to heal
};

using io_completion = pending_completion<std::error_code, std::size_t>;
using stream_completion = pending_completion<std::error_code, stream>;
using notice_completion = pending_completion<std::error_code, std::error_code>;

template <class Buffer>
struct pending_io {
    io_completion completion;
    buffer_list<Buffer> buffers;
    std::uint64_t serial = 0; ///< identifies the operation for late cancellation signals
};

struct connection_end {
    node_id node = 0;
    std::uint16_t port = 0;
    bool open = true;   ///< not closed by its owner, and its node has not crashed since
    bool reset = false; ///< a reset arrived: every operation fails with connection_reset
    bool read_shut = false;
    bool write_shut = false;
    pending_io<asio::mutable_buffer> read;
    pending_io<asio::const_buffer> write;
};

struct connection : std::enable_shared_from_this<connection> {
    connection(std::shared_ptr<network_core> owner, std::uint64_t connection_id)
        : core(std::move(owner))
        , id(connection_id) {}
    ~connection();

    connection(const connection&) = delete;
    connection& operator=(const connection&) = delete;

    std::shared_ptr<network_core> core;
    std::uint64_t id;
    std::array<connection_end, 2> ends; ///< [0] dialer, [1] acceptor
    std::array<direction, 2> dirs;      ///< dirs[s] carries bytes written at ends[s]
    bool aborted = false;               ///< a reset was sent: nothing flows any more
};

struct listener_state {
    std::shared_ptr<network_core> core;
    node_id node = 0;
    std::uint16_t port = 0;
    std::size_t backlog = 0;
    bool open = true;
    std::deque<std::shared_ptr<connection>> ready; ///< accepted by the node, not yet by the owner
    stream_completion accept;
    std::uint64_t accept_serial = 0;
};

/// A datagram on its way, or waiting in the queue of the socket it reached.
struct datagram {
    std::uint64_t id = 0;
    endpoint from{};
    endpoint to{};
    std::uint64_t sender_crashes = 0; ///< the sender node's crash count when it was sent
    byte_buffer bytes;
};

struct datagram_socket_state {
    std::shared_ptr<network_core> core;
    node_id node = 0;
    std::uint16_t port = 0;
    bool open = true;
    std::deque<datagram> queue; ///< arrived, not yet received
    std::size_t queued_bytes = 0;
    pending_io<asio::mutable_buffer> receive;
    endpoint* receive_sender = nullptr; ///< the pending receive's `sender`
    std::deque<endpoint> notices;       ///< where datagrams went that no socket took, unread
    notice_completion notice_wait;
    endpoint* notice_destination = nullptr; ///< the pending async_receive_error's
    std::uint64_t notice_serial = 0;
};

struct dial_state {
    std::shared_ptr<network_core> core;
    std::uint64_t id = 0;
    node_id from = 0;
    endpoint to{};
    stream_completion completion; ///< empty once the dial has finished
    virtual_time::event_handle timeout;
};

struct node_state {
    bool up = true;
    std::uint64_t side = 0; ///< nodes reach each other when on the same side
    std::uint64_t upload_bandwidth = 0;
    std::uint64_t download_bandwidth = 0;
    time_point uplink_free_at{};
    time_point downlink_free_at{};
    std::uint64_t crashes = 0; ///< datagrams sent before a crash are dropped on arrival
    std::uint16_t next_port = first_ephemeral_port;
    std::uint16_t next_datagram_port = first_ephemeral_port; ///< datagram ports are apart
    // Ordered maps: crash() walks them, and the walk order is part of the trace.
    std::map<std::uint16_t, listener_state*> listeners;
    std::map<std::uint16_t, datagram_socket_state*> datagram_sockets;
    std::map<std::uint64_t, std::weak_ptr<connection>> connections;
    std::map<std::uint64_t, std::weak_ptr<dial_state>> dials;

    static constexpr std::uint16_t first_ephemeral_port = 49152;

    /// The next ephemeral port that is not listened on (0 if all are), in a fixed order.
    std::uint16_t allocate_port() { return allocate_from(listeners, next_port); }
    /// The same for datagram sockets, whose ports are apart.
    std::uint16_t allocate_datagram_port() {
        return allocate_from(datagram_sockets, next_datagram_port);
    }

private:
    template <class Registry>
    static std::uint16_t allocate_from(const Registry& taken, std::uint16_t& next) {
        for (std::uint32_t tries = 0; tries < 65536 - first_ephemeral_port; ++tries) {
            const auto candidate = next;
            next = candidate == 65535 ? first_ephemeral_port
                                      : static_cast<std::uint16_t>(candidate + 1);
            if (!taken.contains(candidate)) return candidate;
        }
        return 0;
    }
};

/// When the first and the last byte of a transmission have left the sender.
struct departure {
    time_point first_byte_out{};
    time_point last_byte_out{};
};

/// Why a datagram was dropped (its number in the trace).
enum class datagram_drop : std::uint8_t { lost = 1, unreachable, crashed, no_socket, queue_full };

/// The shared state behind network, stream, listener, datagram socket and transport. They
/// and pending events keep it alive, so it outlives the network object; `closed` says it is
/// gone.
struct network_core : std::enable_shared_from_this<network_core> {
    /// A port unreachable notice on the wire: IPv4 and ICMP headers, and the head of the
    /// datagram it is about.
    static constexpr std::size_t notice_size = 56;
    /// Notices a datagram socket keeps unread, as a kernel's error queue is bounded.
    static constexpr std::size_t max_queued_notices = 64;

    network_core(asio::io_context& io, std::uint64_t seed, const network_config& cfg)
        : executor(io.get_executor())
        , time(asio::use_service<virtual_time>(io))
        , config(cfg)
        , random(seed)
        , created_at(time.now()) {}

    // --- bookkeeping
    void check_node(node_id node) const;
    const link_properties& link(node_id from, node_id to) const;
    /// The latencies of the links between a and b, both ways (no queueing counted).
    duration round_trip(node_id a, node_id b) const {
        return link(a, b).latency + link(b, a).latency;
    }
    bool reachable(node_id a, node_id b) const { return nodes[a].side == nodes[b].side; }
    duration retransmission_timeout(node_id from, node_id to, std::uint32_t attempts) const;
    void record(trace_kind kind, std::uint64_t a = 0, std::uint64_t b = 0, std::uint64_t c = 0,
                std::uint64_t d = 0);
    void record_segment(trace_kind kind, const connection& c, std::size_t side, const segment& s);
    stream make_stream(std::shared_ptr<connection> c, std::size_t side);
    stream closed_stream();

    // --- byte streams
    /// Completes at once what no read or write can start on (the network down, the end
    /// closed, no bytes asked for); true if it did.
    bool settle_at_once(const connection_end& e, std::size_t bytes, io_completion& completion);
    std::uint64_t begin_read(connection& c, std::size_t side, const mutable_buffers& buffers,
                             io_completion completion);
    std::uint64_t begin_write(connection& c, std::size_t side, const const_buffers& buffers,
                              io_completion completion);
    void service_read(connection& c, std::size_t side);
    void service_write(connection& c, std::size_t side);
    void cancel_io(connection& c, std::size_t side, bool write, std::uint64_t serial);
    void abort_io(connection& c, std::size_t side, std::error_code ec);
    void drop_unread(connection& c, std::size_t direction_side);
    void close_end(connection& c, std::size_t side);
    void shutdown_end(connection& c, std::size_t side, asio::socket_base::shutdown_type what,
                      std::error_code& ec);

    // --- the stages every transmission (segment or datagram) goes through
    /// Serialises `size` bytes onto from's uplink, then the from -> to link.
    departure send_out(node_id from, node_id to, std::uint64_t size);
    bool draw_loss(const link_properties& path);
    /// Carries a transmission that left as `out` over the link's latency and, if `to` caps
    /// its download, its downlink; then calls arrival.arrive(). arrival.wanted() is checked
    /// before each step.
    template <class Arrival>
    void propagate(node_id to, std::uint64_t size, const departure& out, duration latency,
                   Arrival arrival);

    // --- segments
    void pump(connection& c, std::size_t side);
    time_point transmit(connection& c, std::size_t side, segment& s);
    void retransmit(connection& c, std::size_t side, segment& s);
    void arrive(connection& c, std::size_t side, segment& s);
    void hold(connection& c, std::size_t side, segment& s);
    void park(connection& c, std::size_t side);
    void resume_parked();
    void send_reset(connection& c, std::size_t from_side);
    void reset_arrival(connection& c, std::size_t side);

    // --- listeners and dials
    std::shared_ptr<listener_state> listen(node_id node, std::uint16_t port, std::size_t backlog,
                                           std::error_code& ec);
    void close_listener(listener_state& l);
    std::uint64_t begin_accept(listener_state& l, stream_completion completion);
    void service_accept(listener_state& l);
    void cancel_accept(listener_state& l, std::uint64_t serial);
    std::shared_ptr<dial_state> begin_dial(node_id from, const endpoint& to, duration timeout,
                                           stream_completion completion);
    void finish_dial(dial_state& dial, std::error_code ec, std::shared_ptr<connection> c = {});
    void syn_arrival(const std::shared_ptr<dial_state>& dial);
    void synack_arrival(dial_state& dial, const std::shared_ptr<connection>& c);

    // --- datagrams
    std::shared_ptr<datagram_socket_state> open_datagram(node_id node, std::uint16_t port,
                                                         std::error_code& ec);
    void close_datagram(datagram_socket_state& s);
    void close_datagram_sockets(node_state& n);
    /// Why a send of `size` bytes cannot start (nothing if it can).
    std::error_code refuse_send(const datagram_socket_state& s, std::size_t size) const;
    void send_datagram(datagram_socket_state& s, byte_buffer bytes, const endpoint& to,
                       io_completion completion);
    void deliver_datagram(datagram d);
    void drop_datagram(std::uint64_t id, datagram_drop reason);
    /// Sends the notice that `d` found no socket back towards its sender.
    void send_notice(datagram d);
    void deliver_notice(const datagram& d, std::uint64_t origin_crashes);
    std::uint64_t begin_notice_wait(datagram_socket_state& s, endpoint* destination,
                                    notice_completion completion);
    void service_notice_wait(datagram_socket_state& s);
    void finish_notice_wait(datagram_socket_state& s, std::error_code ec, std::error_code reported);
    void cancel_notice_wait(datagram_socket_state& s, std::uint64_t serial);
    std::uint64_t begin_receive(datagram_socket_state& s, const mutable_buffers& buffers,
                                endpoint* sender, io_completion completion);
    void service_receive(datagram_socket_state& s);
    void cancel_receive(datagram_socket_state& s, std::uint64_t serial);

    // --- faults
    void crash(node_id node);
    void restart(node_id node);
    void partition(const std::vector<node_id>& group);
    void heal();
    void close_all();

    asio::any_io_executor executor;
    virtual_time& time;
    network_config config;
    random_generator random;
    time_point created_at;
    std::vector<node_state> nodes;
    std::unordered_map<std::uint64_t, link_properties> link_overrides; ///< by link_key
    std::unordered_map<std::uint64_t, time_point> link_free_at;        ///< limited links only
    /// Directions and resets waiting for a partition to heal, in the order they stopped.
    std::vector<std::pair<std::weak_ptr<connection>, std::size_t>> parked;
    std::vector<std::pair<std::weak_ptr<connection>, std::size_t>> held_resets;
    std::uint64_t next_connection_id = 1;
    std::uint64_t next_dial_id = 1;
    std::uint64_t next_datagram_id = 1;
    std::uint64_t next_serial = 1;
    std::uint64_t next_side = 1;
    bool closed = false;
    std::uint64_t trace_hash = 0;
    network_statistics stats;
    std::deque<std::string> trace_lines;
};

// What propagate() delivers. A segment is no longer wanted once its connection is aborted.
struct arriving_segment {
    std::shared_ptr<connection> conn;
    std::size_t side;
    segment* seg;
    bool wanted() const { return !conn->core->closed && !conn->aborted; }
    void arrive() { conn->core->arrive(*conn, side, *seg); }
};

struct arriving_datagram {
    std::shared_ptr<network_core> core;
    datagram d;
    bool wanted() const { return !core->closed; }
    void arrive() { core->deliver_datagram(std::move(d)); }
};

/// A port unreachable notice on its way back to the socket that sent datagram `d`.
struct arriving_notice {
    std::shared_ptr<network_core> core;
    datagram d;                       ///< its bytes are not kept
    std::uint64_t origin_crashes = 0; ///< the answering node's crash count when it answered
    bool wanted() const { return !core->closed; }
    void arrive() { core->deliver_notice(d, origin_crashes); }
};

// Cancellation handlers hold only weak references and serial numbers, so a signal emitted
// after the operation finished (or after everything is gone) does nothing.
struct io_cancellation {
    io_cancellation(std::weak_ptr<connection> c, std::size_t s, bool w, std::uint64_t n)
        : conn(std::move(c))
        , side(s)
        , write(w)
        , serial(n) {}
    void operator()(asio::cancellation_type_t type) {
        if (type == asio::cancellation_type::none) return;
        if (auto c = conn.lock()) c->core->cancel_io(*c, side, write, serial);
    }
    std::weak_ptr<connection> conn;
    std::size_t side;
    bool write;
    std::uint64_t serial;
};

struct accept_cancellation {
    accept_cancellation(std::weak_ptr<listener_state> l, std::uint64_t n)
        : state(std::move(l))
        , serial(n) {}
    void operator()(asio::cancellation_type_t type) {
        if (type == asio::cancellation_type::none) return;
        if (auto l = state.lock()) l->core->cancel_accept(*l, serial);
    }
    std::weak_ptr<listener_state> state;
    std::uint64_t serial;
};

/// Cancels a datagram socket's pending receive or notice wait (`Cancel`).
template <void (network_core::*Cancel)(datagram_socket_state&, std::uint64_t)>
struct datagram_cancellation {
    datagram_cancellation(std::weak_ptr<datagram_socket_state> s, std::uint64_t n)
        : state(std::move(s))
        , serial(n) {}
    void operator()(asio::cancellation_type_t type) {
        if (type == asio::cancellation_type::none) return;
        if (auto s = state.lock()) (*s->core.*Cancel)(*s, serial);
    }
    std::weak_ptr<datagram_socket_state> state;
    std::uint64_t serial;
};
using receive_cancellation = datagram_cancellation<&network_core::cancel_receive>;
using notice_cancellation = datagram_cancellation<&network_core::cancel_notice_wait>;

struct dial_cancellation {
    explicit dial_cancellation(std::weak_ptr<dial_state> d)
        : dial(std::move(d)) {}
    void operator()(asio::cancellation_type_t type) {
        if (type == asio::cancellation_type::none) return;
        auto d = dial.lock();
        if (!d || !d->completion || d->core->closed) return;
        d->core->record(trace_kind::dial_aborted, d->id);
        d->core->finish_dial(*d, asio::error::operation_aborted);
    }
    std::weak_ptr<dial_state> dial;
};

template <class Handler, class Buffers>
void start_io(const std::shared_ptr<connection>& c, std::size_t side,
              const asio::any_io_executor& executor, const Buffers& buffers, Handler&& handler) {
    constexpr bool write = std::is_same_v<Buffers, const_buffers>;
    auto slot = asio::get_associated_cancellation_slot(handler);
    io_completion completion(std::forward<Handler>(handler), executor);
    if (!c) {
        completion.post(asio::error::bad_descriptor, 0);
        return;
    }
    std::uint64_t serial;
    if constexpr (write)
        serial = c->core->begin_write(*c, side, buffers, std::move(completion));
    else
        serial = c->core->begin_read(*c, side, buffers, std::move(completion));
    if (serial != 0 && slot.is_connected())
        slot.template emplace<io_cancellation>(c, side, write, serial);
}

} // namespace detail

/// One end of a simulated connection: an Asio AsyncReadStream and AsyncWriteStream, usable
/// with asio::async_read / async_write and any completion token. Movable, not copyable.
///
/// Semantics (TCP-like):
///   - shutdown(shutdown_send): the peer reads everything written before, then eof; later
///     writes fail with broken_pipe. shutdown(shutdown_receive): reads return eof, and
///     arriving bytes are dropped (freeing the writer's buffer).
///   - close() (and destruction): pending operations complete with operation_aborted and
///     later ones with bad_descriptor; bytes already written are still delivered, then the
///     peer reads eof; unread bytes are dropped, and bytes that arrive afterwards make the
///     network answer with a reset, so the peer's later operations fail with
///     connection_reset.
///   - When the stream's node crashes the stream behaves as closed (is_open() is false).
class stream {
public:
    using executor_type = asio::any_io_executor;

    /// A stream that is not connected (like an unopened socket); operations fail with
    /// bad_descriptor.
    explicit stream(const executor_type& executor)
        : executor_(executor) {}

    stream(stream&& other) noexcept
        : executor_(other.executor_)
        , connection_(std::move(other.connection_))
        , side_(other.side_) {}

    stream& operator=(stream&& other) noexcept {
        if (this != &other) {
            close_quietly();
            executor_ = other.executor_;
            connection_ = std::move(other.connection_);
            side_ = other.side_;
        }
        return *this;
    }

    stream(const stream&) = delete;
    stream& operator=(const stream&) = delete;

    ~stream() { close_quietly(); }

    executor_type get_executor() const noexcept { return executor_; }

    bool is_open() const noexcept {
        return connection_ && connection_->ends[side_].open && !connection_->core->closed;
    }

    /// The node and port of this end and of the peer. Throw std::system_error
    /// (asio::error::not_connected) for a stream that was never connected.
    endpoint local_endpoint() const { return end_point(side_); }
    endpoint remote_endpoint() const { return end_point(detail::other(side_)); }
    node_id local_node() const { return local_endpoint().node; }
    node_id remote_node() const { return remote_endpoint().node; }

    /// The latencies of the links both ways (no queueing counted); zero when not connected.
    duration round_trip_time() const noexcept {
        if (!connection_) return duration::zero();
        return connection_->core->round_trip(connection_->ends[0].node, connection_->ends[1].node);
    }

    /// Half-closes the connection (see the class comment). Errors: bad_descriptor when the
    /// stream is closed, network_down when the network is gone.
    void shutdown(asio::socket_base::shutdown_type what, std::error_code& ec) {
        if (!connection_) {
            ec = asio::error::bad_descriptor;
            return;
        }
        connection_->core->shutdown_end(*connection_, side_, what, ec);
    }

    void shutdown(asio::socket_base::shutdown_type what) {
        std::error_code ec;
        shutdown(what, ec);
        if (ec) throw std::system_error(ec, "hivemesh::net::sim::stream::shutdown");
    }

    /// Closes this end (see the class comment). Never fails; `ec` is cleared.
    void close(std::error_code& ec) {
        ec.clear();
        close_quietly();
    }
    void close() { close_quietly(); }

    /// Completes the pending read and write with operation_aborted.
    void cancel() {
        if (connection_ && !connection_->core->closed)
            connection_->core->abort_io(*connection_, side_, asio::error::operation_aborted);
    }

    /// Reads at least one byte (unless `buffers` is empty: then it completes with 0 bytes and
    /// no error). Completion: void(std::error_code, std::size_t). Errors: eof once the peer
    /// shut down or closed and every byte was read; connection_reset after a reset;
    /// operation_aborted when cancelled or closed meanwhile; bad_descriptor on a closed
    /// stream; already_started if a read is pending. Cancellation: the handler's slot, any
    /// type; nothing was read then, so no type loses data.
    template <class MutableBufferSequence,
              class ReadToken = asio::default_completion_token_t<executor_type>>
    auto async_read_some(const MutableBufferSequence& buffers,
                         ReadToken&& token = asio::default_completion_token_t<executor_type>()) {
        return initiate_io(token, detail::mutable_buffers::from(buffers));
    }

    /// Writes at least one byte, as many as the send buffer has room for, waiting while it is
    /// full (an empty `buffers` completes with 0 bytes and no error). Completion:
    /// void(std::error_code, std::size_t). Errors: broken_pipe after shutdown(send);
    /// connection_reset after a reset; operation_aborted when cancelled or closed meanwhile;
    /// bad_descriptor on a closed stream; already_started if a write is pending.
    /// Cancellation: the handler's slot, any type; a write that waits has written nothing.
    template <class ConstBufferSequence,
              class WriteToken = asio::default_completion_token_t<executor_type>>
    auto async_write_some(const ConstBufferSequence& buffers,
                          WriteToken&& token = asio::default_completion_token_t<executor_type>()) {
        return initiate_io(token, detail::const_buffers::from(buffers));
    }

private:
    friend struct detail::network_core;

    stream(const executor_type& executor, std::shared_ptr<detail::connection> c, std::size_t side)
        : executor_(executor)
        , connection_(std::move(c))
        , side_(side) {}

    /// Starts a read (mutable_buffers) or a write (const_buffers) of `list`.
    template <class Token, class Buffers>
    auto initiate_io(Token& token, Buffers list) {
        return asio::async_initiate<Token, void(std::error_code, std::size_t)>(
            [this](auto&& handler, const Buffers& buffers) {
                detail::start_io(connection_, side_, executor_, buffers,
                                 std::forward<decltype(handler)>(handler));
            },
            token, std::move(list));
    }

    endpoint end_point(std::size_t side) const {
        if (!connection_)
            throw std::system_error(asio::error::not_connected, "hivemesh::net::sim::stream");
        const auto& e = connection_->ends[side];
        return {e.node, e.port};
    }

    void close_quietly() noexcept {
        if (connection_ && !connection_->core->closed)
            connection_->core->close_end(*connection_, side_);
    }

    executor_type executor_;
    std::shared_ptr<detail::connection> connection_;
    std::size_t side_ = 0;
};

/// Accepts connections to one port of one node. Closing it (or destroying it, or its node
/// crashing) frees the port; connections that arrived but were not accepted are reset.
class listener {
public:
    using executor_type = asio::any_io_executor;
    using endpoint_type = sim::endpoint;

    /// A closed listener (async_accept fails with bad_descriptor).
    explicit listener(const executor_type& executor)
        : executor_(executor) {}

    listener(listener&& other) noexcept
        : executor_(other.executor_)
        , state_(std::move(other.state_)) {}

    listener& operator=(listener&& other) noexcept {
        if (this != &other) {
            close();
            executor_ = other.executor_;
            state_ = std::move(other.state_);
        }
        return *this;
    }

    listener(const listener&) = delete;
    listener& operator=(const listener&) = delete;

    ~listener() { close(); }

    executor_type get_executor() const noexcept { return executor_; }
    bool is_open() const noexcept { return state_ && state_->open && !state_->core->closed; }

    /// The node and port listened on; {0, 0} for a listener that never opened.
    endpoint local_endpoint() const noexcept {
        return state_ ? endpoint{state_->node, state_->port} : endpoint{};
    }
    std::uint16_t local_port() const noexcept { return local_endpoint().port; }

    /// Stops listening; a pending accept completes with operation_aborted.
    void close() noexcept {
        if (state_ && !state_->core->closed) state_->core->close_listener(*state_);
    }

    /// Waits for the next connection. Completion: void(std::error_code, stream); on error the
    /// stream is not connected. Errors: operation_aborted when closed or cancelled meanwhile
    /// (also when the node crashes); bad_descriptor on a closed listener; already_started if
    /// an accept is pending. Cancellation: the handler's slot, any type.
    template <class AcceptToken = asio::default_completion_token_t<executor_type>>
    auto async_accept(AcceptToken&& token = asio::default_completion_token_t<executor_type>()) {
        return asio::async_initiate<AcceptToken, void(std::error_code, stream)>(
            [this](auto&& handler) {
                auto slot = asio::get_associated_cancellation_slot(handler);
                detail::stream_completion completion(std::forward<decltype(handler)>(handler),
                                                     executor_);
                if (!state_ || state_->core->closed) {
                    completion.post(asio::error::bad_descriptor, stream(executor_));
                    return;
                }
                const auto serial = state_->core->begin_accept(*state_, std::move(completion));
                if (serial != 0 && slot.is_connected())
                    slot.template emplace<detail::accept_cancellation>(state_, serial);
            },
            token);
    }

private:
    friend class network;

    listener(const executor_type& executor, std::shared_ptr<detail::listener_state> state)
        : executor_(executor)
        , state_(std::move(state)) {}

    executor_type executor_;
    std::shared_ptr<detail::listener_state> state_;
};

/// A UDP-like socket bound to one port of one node (see the top of this file for how
/// datagrams travel). Closing it (or destroying it, or its node crashing) frees the port and
/// discards the datagrams it queued; datagrams on their way to it are then dropped on
/// arrival. Movable, not copyable.
class datagram_socket {
public:
    using executor_type = asio::any_io_executor;
    using endpoint_type = sim::endpoint;

    /// A closed socket (operations fail with bad_descriptor).
    explicit datagram_socket(const executor_type& executor)
        : executor_(executor) {}

    datagram_socket(datagram_socket&& other) noexcept
        : executor_(other.executor_)
        , state_(std::move(other.state_)) {}

    datagram_socket& operator=(datagram_socket&& other) noexcept {
        if (this != &other) {
            close();
            executor_ = other.executor_;
            state_ = std::move(other.state_);
        }
        return *this;
    }

    datagram_socket(const datagram_socket&) = delete;
    datagram_socket& operator=(const datagram_socket&) = delete;

    ~datagram_socket() { close(); }

    executor_type get_executor() const noexcept { return executor_; }
    bool is_open() const noexcept { return state_ && state_->open && !state_->core->closed; }

    /// The node and port it is bound to (also after close()). Throws std::system_error
    /// (asio::error::bad_descriptor) for a socket that never opened.
    endpoint local_endpoint() const {
        if (!state_)
            throw std::system_error(asio::error::bad_descriptor,
                                    "hivemesh::net::sim::datagram_socket");
        return {state_->node, state_->port};
    }

    /// Frees the port and discards the queued datagrams; a pending receive completes with
    /// operation_aborted. Never fails.
    void close() noexcept {
        if (state_ && !state_->core->closed) state_->core->close_datagram(*state_);
    }

    /// Sends `buffers` (all of them) as one datagram to `to`. Completes at once (posted,
    /// never inline) with the datagram handed to the sender's uplink. Completion:
    /// void(std::error_code, std::size_t bytes). Errors: message_size when larger than
    /// config().max_datagram_size; bad_descriptor on a closed socket; network_down when the
    /// network is gone. A datagram that is lost or dropped on its way still completes
    /// without error, as with UDP. Cancellation: none is needed, nothing waits.
    template <class ConstBufferSequence,
              ASIO_COMPLETION_TOKEN_FOR(void(std::error_code, std::size_t))
                  SendToken = asio::default_completion_token_t<executor_type>>
    auto async_send_to(const ConstBufferSequence& buffers, const endpoint& to,
                       SendToken&& token = asio::default_completion_token_t<executor_type>()) {
        return asio::async_initiate<SendToken, void(std::error_code, std::size_t)>(
            [this](auto&& handler, const ConstBufferSequence& data, const endpoint& destination) {
                detail::io_completion completion(std::forward<decltype(handler)>(handler),
                                                 executor_);
                const auto size = asio::buffer_size(data);
                const auto refused = state_ ? state_->core->refuse_send(*state_, size)
                                            : std::error_code(asio::error::bad_descriptor);
                if (refused) {
                    completion.post(refused, 0);
                    return;
                }
                byte_buffer bytes(size);
                asio::buffer_copy(asio::buffer(bytes), data);
                state_->core->send_datagram(*state_, std::move(bytes), destination,
                                            std::move(completion));
            },
            token, buffers, to);
    }

    /// Receives the next datagram into `buffers` (the first 16 non-empty ones) and sets
    /// `sender` to where it came from. Completion: void(std::error_code, std::size_t). A
    /// datagram longer than the buffers is truncated: the bytes that fit are copied and it
    /// completes with message_size and their count (empty buffers take a datagram and keep
    /// nothing of it). Errors: operation_aborted when cancelled, closed meanwhile or when
    /// the node crashes; bad_descriptor on a closed socket; network_down when the network
    /// is gone; already_started if a receive is pending. Cancellation: the handler's slot,
    /// any type; a cancelled receive took no datagram.
    template <class MutableBufferSequence,
              ASIO_COMPLETION_TOKEN_FOR(void(std::error_code, std::size_t))
                  ReceiveToken = asio::default_completion_token_t<executor_type>>
    auto
    async_receive_from(const MutableBufferSequence& buffers, endpoint& sender,
                       ReceiveToken&& token = asio::default_completion_token_t<executor_type>()) {
        return asio::async_initiate<ReceiveToken, void(std::error_code, std::size_t)>(
            [this](auto&& handler, const detail::mutable_buffers& into, endpoint* from) {
                auto slot = asio::get_associated_cancellation_slot(handler);
                detail::io_completion completion(std::forward<decltype(handler)>(handler),
                                                 executor_);
                if (!state_) {
                    completion.post(asio::error::bad_descriptor, 0);
                    return;
                }
                const auto serial =
                    state_->core->begin_receive(*state_, into, from, std::move(completion));
                if (serial != 0 && slot.is_connected())
                    slot.template emplace<detail::receive_cancellation>(state_, serial);
            },
            token, detail::mutable_buffers::from(buffers), &sender);
    }

    /// Waits for the next notice that a datagram this socket sent found no socket at its
    /// port (see the top of this file), and sets `destination` to where that datagram
    /// went. Completion: void(std::error_code ec, std::error_code reported), `reported`
    /// being connection_refused. Errors (`ec`): operation_aborted when cancelled, closed
    /// meanwhile or when the node crashes; bad_descriptor on a closed socket;
    /// network_down when the network is gone; already_started if a wait is pending.
    /// Cancellation: the handler's slot, any type.
    template <ASIO_COMPLETION_TOKEN_FOR(void(std::error_code, std::error_code))
                  WaitToken = asio::default_completion_token_t<executor_type>>
    auto
    async_receive_error(endpoint& destination,
                        WaitToken&& token = asio::default_completion_token_t<executor_type>()) {
        return asio::async_initiate<WaitToken, void(std::error_code, std::error_code)>(
            [this](auto&& handler, endpoint* to) {
                auto slot = asio::get_associated_cancellation_slot(handler);
                detail::notice_completion completion(std::forward<decltype(handler)>(handler),
                                                     executor_);
                if (!state_) {
                    completion.post(asio::error::bad_descriptor, {});
                    return;
                }
                const auto serial =
                    state_->core->begin_notice_wait(*state_, to, std::move(completion));
                if (serial != 0 && slot.is_connected())
                    slot.template emplace<detail::notice_cancellation>(state_, serial);
            },
            token, &destination);
    }

private:
    friend class network;

    datagram_socket(const executor_type& executor,
                    std::shared_ptr<detail::datagram_socket_state> state)
        : executor_(executor)
        , state_(std::move(state)) {}

    executor_type executor_;
    std::shared_ptr<detail::datagram_socket_state> state_;
};

/// A simulated network of nodes on the virtual time of one io_context (see the top of this
/// file for the model). Deterministic: the same seed and the same sequence of calls give the
/// same trace_hash(). Single-threaded; destroy it before its io_context.
class network {
public:
    /// Throws std::invalid_argument for an invalid configuration.
    network(asio::io_context& io, std::uint64_t seed, const network_config& config = {})
        : core_(std::make_shared<detail::network_core>(io, seed, validated(config))) {
        core_->trace_hash = seed;
    }

    /// Pending operations of every stream, listener, datagram socket and dial complete with
    /// operation_aborted; later operations fail with network_down.
    ~network() { core_->close_all(); }

    network(const network&) = delete;
    network& operator=(const network&) = delete;

    asio::any_io_executor get_executor() const noexcept { return core_->executor; }
    virtual_time& time() const noexcept { return core_->time; }
    const network_config& config() const noexcept { return core_->config; }

    /// Adds a node (up, on the main side of any partition, no bandwidth caps).
    node_id add_node() {
        const node_id node = core_->nodes.size();
        if (node > std::numeric_limits<std::uint32_t>::max())
            throw std::length_error("hivemesh::net::sim: too many nodes");
        core_->nodes.emplace_back();
        core_->record(trace_kind::node_added, node);
        return node;
    }

    std::size_t node_count() const noexcept { return core_->nodes.size(); }

    bool is_up(node_id node) const {
        core_->check_node(node);
        return core_->nodes[node].up;
    }

    /// Link properties for every pair without its own. Throws std::invalid_argument.
    void set_default_link(const link_properties& link) {
        check(link);
        core_->config.default_link = link;
    }

    /// Properties of the direction from -> to. Throws std::invalid_argument or
    /// std::out_of_range (unknown node).
    void set_link(node_id from, node_id to, const link_properties& link) {
        core_->check_node(from);
        core_->check_node(to);
        check(link);
        core_->link_overrides[detail::link_key(from, to)] = link;
    }

    /// The same properties for both directions between a and b.
    void set_links_between(node_id a, node_id b, const link_properties& link) {
        set_link(a, b, link);
        set_link(b, a, link);
    }

    link_properties link(node_id from, node_id to) const {
        core_->check_node(from);
        core_->check_node(to);
        return core_->link(from, to);
    }

    /// Caps what a node sends and receives in total, in bytes per second (0 = unlimited).
    void set_node_bandwidth(node_id node, std::uint64_t upload, std::uint64_t download) {
        core_->check_node(node);
        core_->nodes[node].upload_bandwidth = upload;
        core_->nodes[node].download_bandwidth = download;
    }

    /// Listens on `port` of `node` (0 picks a free port). Errors in `ec`: address_in_use,
    /// network_down (node crashed or network gone); the listener is then closed.
    /// `backlog` 0 means config().default_backlog. Throws std::out_of_range for an unknown node.
    listener listen(node_id node, std::uint16_t port, std::error_code& ec,
                    std::size_t backlog = 0) {
        core_->check_node(node);
        auto state = core_->listen(node, port, backlog, ec);
        if (ec) return listener(core_->executor);
        return listener(core_->executor, std::move(state));
    }

    /// As above; throws std::system_error.
    listener listen(node_id node, std::uint16_t port, std::size_t backlog = 0) {
        std::error_code ec;
        auto l = listen(node, port, ec, backlog);
        if (ec) throw std::system_error(ec, "hivemesh::net::sim::network::listen");
        return l;
    }

    /// Opens a datagram socket on `port` of `node` (0 picks a free port; datagram ports are
    /// apart from listening ones). Errors in `ec`: address_in_use (a datagram socket holds the
    /// port, or none is free), network_down (node crashed or network gone); the socket is
    /// then closed. Throws std::out_of_range for an unknown node.
    datagram_socket open_datagram(node_id node, std::uint16_t port, std::error_code& ec) {
        core_->check_node(node);
        auto state = core_->open_datagram(node, port, ec);
        if (ec) return datagram_socket(core_->executor);
        return datagram_socket(core_->executor, std::move(state));
    }

    /// As above; throws std::system_error.
    datagram_socket open_datagram(node_id node, std::uint16_t port) {
        std::error_code ec;
        auto s = open_datagram(node, port, ec);
        if (ec) throw std::system_error(ec, "hivemesh::net::sim::network::open_datagram");
        return s;
    }

    /// Connects node `from` to `to`, giving up after `timeout` (the SYN-ACK must arrive
    /// before it). Completion: void(std::error_code, stream); on error the stream is not
    /// connected. Errors: connection_refused (nothing listening, or backlog full) after one
    /// round trip; timed_out (node down, partition, timeout shorter than the round trip);
    /// host_unreachable (no such node); network_down (`from` crashed, network gone);
    /// invalid_argument (no such `from` node); operation_aborted when cancelled or when
    /// `from` crashes meanwhile. Cancellation: the handler's slot, any type.
    template <ASIO_COMPLETION_TOKEN_FOR(void(std::error_code, stream))
                  ConnectToken = asio::default_completion_token_t<asio::any_io_executor>>
    auto async_connect(
        node_id from, const endpoint& to, duration timeout,
        ConnectToken&& token = asio::default_completion_token_t<asio::any_io_executor>()) {
        return asio::async_initiate<ConnectToken, void(std::error_code, stream)>(
            [core = core_](auto&& handler, node_id from, const endpoint& to, duration timeout) {
                auto slot = asio::get_associated_cancellation_slot(handler);
                detail::stream_completion completion(std::forward<decltype(handler)>(handler),
                                                     core->executor);
                auto dial = core->begin_dial(from, to, timeout, std::move(completion));
                if (dial && slot.is_connected())
                    slot.template emplace<detail::dial_cancellation>(dial);
            },
            token, from, to, timeout);
    }

    /// As above with config().connect_timeout.
    template <ASIO_COMPLETION_TOKEN_FOR(void(std::error_code, stream))
                  ConnectToken = asio::default_completion_token_t<asio::any_io_executor>>
    auto async_connect(
        node_id from, const endpoint& to,
        ConnectToken&& token = asio::default_completion_token_t<asio::any_io_executor>()) {
        return async_connect(from, to, core_->config.connect_timeout,
                             std::forward<ConnectToken>(token));
    }

    /// Puts `group` on a new side of a partition: its nodes reach each other and no one else
    /// (nodes not listed keep their side). Dials across time out; bytes and resets across are
    /// held until the sides meet again. Throws std::out_of_range for an unknown node.
    void partition(const std::vector<node_id>& group) {
        for (const auto node : group)
            core_->check_node(node);
        core_->partition(group);
    }

    /// Puts every node back on one side; held bytes and resets flow again.
    void heal() { core_->heal(); }

    bool reachable(node_id a, node_id b) const {
        core_->check_node(a);
        core_->check_node(b);
        return core_->reachable(a, b);
    }

    /// Crashes `node`: its listeners and datagram sockets close, its dials and its streams'
    /// pending operations complete with operation_aborted, its streams close, and the peer of
    /// each of its connections receives a reset one latency later. Dials to it time out, and
    /// datagrams to it are dropped, until restart(); those it sent before the crash are
    /// dropped too.
    void crash(node_id node) {
        core_->check_node(node);
        core_->crash(node);
    }

    /// Brings a crashed node back: it can listen again (on the same ports) and be dialled.
    void restart(node_id node) {
        core_->check_node(node);
        core_->restart(node);
    }

    /// Running XXH3 hash of every event with its virtual time, seeded by the network seed.
    std::uint64_t trace_hash() const noexcept { return core_->trace_hash; }
    std::uint64_t events() const noexcept { return core_->stats.events; }
    const network_statistics& statistics() const noexcept { return core_->stats; }

    /// The most recent events as text (see network_config::trace_log_capacity), oldest first.
    std::vector<std::string> trace_log() const {
        return {core_->trace_lines.begin(), core_->trace_lines.end()};
    }

private:
    friend class transport;

    static void check(const link_properties& link) {
        if (link.latency.count() < 0)
            throw std::invalid_argument("hivemesh::net::sim: link latency must not be negative");
        if (!(link.loss >= 0.0 && link.loss <= 1.0))
            throw std::invalid_argument("hivemesh::net::sim: link loss must be within [0, 1]");
    }

    static const network_config& validated(const network_config& config) {
        check(config.default_link);
        if (config.send_buffer_size == 0)
            throw std::invalid_argument("hivemesh::net::sim: send_buffer_size must be positive");
        if (config.max_segment_size == 0 || config.max_segment_size > (std::size_t{16} << 20))
            throw std::invalid_argument(
                "hivemesh::net::sim: max_segment_size must be within 1 .. 16 MiB");
        if (config.default_backlog == 0)
            throw std::invalid_argument("hivemesh::net::sim: default_backlog must be positive");
        if (config.max_datagram_size == 0 || config.max_datagram_size > (std::size_t{16} << 20))
            throw std::invalid_argument(
                "hivemesh::net::sim: max_datagram_size must be within 1 .. 16 MiB");
        if (config.datagram_queue_bytes == 0)
            throw std::invalid_argument(
                "hivemesh::net::sim: datagram_queue_bytes must be positive");
        if (config.min_retransmission_timeout.count() <= 0 ||
            config.max_retransmission_timeout < config.min_retransmission_timeout)
            throw std::invalid_argument(
                "hivemesh::net::sim: retransmission timeouts must satisfy 0 < min <= max");
        return config;
    }

    std::shared_ptr<detail::network_core> core_;
};

// ---------------------------------------------------------------------------------------
// Implementation.

namespace detail {

inline connection::~connection() {
    // Leave the crash registries; the map entries hold weak references to us.
    for (const auto& e : ends)
        if (e.node < core->nodes.size()) core->nodes[e.node].connections.erase(id);
}

inline void network_core::check_node(node_id node) const {
    if (node >= nodes.size())
        throw std::out_of_range("hivemesh::net::sim: unknown node " + std::to_string(node));
}

inline const link_properties& network_core::link(node_id from, node_id to) const {
    const auto it = link_overrides.find(link_key(from, to));
    return it != link_overrides.end() ? it->second : config.default_link;
}

inline duration network_core::retransmission_timeout(node_id from, node_id to,
                                                     std::uint32_t attempts) const {
    auto rto = std::max(config.min_retransmission_timeout, 2 * round_trip(from, to));
    for (std::uint32_t i = 1; i < attempts && rto < config.max_retransmission_timeout; ++i)
        rto = std::min(config.max_retransmission_timeout, 2 * rto);
    return std::min(rto, config.max_retransmission_timeout);
}

// Size in bytes / rate in bytes per second, rounded up to whole nanoseconds.
inline duration serialisation_time(std::uint64_t size, std::uint64_t rate) noexcept {
    if (rate == 0 || size == 0) return duration::zero();
    // size <= 16 MiB (max_segment_size, max_datagram_size), so size * 1e9 < 2^54: no overflow.
    return duration{static_cast<duration::rep>((size * 1'000'000'000ULL + rate - 1) / rate)};
}

inline void network_core::record(trace_kind kind, std::uint64_t a, std::uint64_t b, std::uint64_t c,
                                 std::uint64_t d) {
    const auto t = static_cast<std::uint64_t>(time.now().time_since_epoch().count());
    const std::uint64_t fields[] = {static_cast<std::uint64_t>(kind), t, a, b, c, d};
    // Little-endian bytes, so the hash does not depend on the host's byte order.
    std::array<unsigned char, sizeof fields> bytes{};
    for (std::size_t i = 0; i < std::size(fields); ++i)
        for (std::size_t j = 0; j < 8; ++j)
            bytes[8 * i + j] = static_cast<unsigned char>(fields[i] >> (8 * j));
    trace_hash = XXH3_64bits_withSeed(bytes.data(), bytes.size(), trace_hash);
    ++stats.events;
    if (config.trace_log_capacity == 0) return;
    const auto since_start = time.now() - created_at;
    const auto ns = since_start.count();
    char line[160];
    std::snprintf(line, sizeof line,
                  "%" PRId64 ".%09" PRId64 " %s %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64,
                  static_cast<std::int64_t>(ns / 1'000'000'000),
                  static_cast<std::int64_t>(ns % 1'000'000'000), to_string(kind), a, b, c, d);
    if (trace_lines.size() == config.trace_log_capacity) trace_lines.pop_front();
    trace_lines.emplace_back(line);
}

inline void network_core::record_segment(trace_kind kind, const connection& c, std::size_t side,
                                         const segment& s) {
    const std::uint64_t flags =
        side | (s.fin ? 2u : 0u) | (static_cast<std::uint64_t>(s.attempts) << 8);
    record(kind, c.id, flags, s.begin, s.end - s.begin);
}

inline stream network_core::make_stream(std::shared_ptr<connection> c, std::size_t side) {
    return stream(executor, std::move(c), side);
}

inline stream network_core::closed_stream() {
    return stream(executor);
}

// ----- byte streams

inline bool network_core::settle_at_once(const connection_end& e, std::size_t bytes,
                                         io_completion& completion) {
    if (closed) {
        completion.post(asio::error::network_down, 0);
    } else if (!e.open) {
        completion.post(asio::error::bad_descriptor, 0);
    } else if (bytes == 0) {
        completion.post({}, 0);
    } else {
        return false;
    }
    return true;
}

inline std::uint64_t network_core::begin_read(connection& c, std::size_t side,
                                              const mutable_buffers& buffers,
                                              io_completion completion) {
    auto& e = c.ends[side];
    if (settle_at_once(e, buffers.total, completion)) return 0;
    if (e.read.completion) {
        completion.post(asio::error::already_started, 0);
        return 0;
    }
    e.read = {std::move(completion), buffers, next_serial++};
    service_read(c, side);
    return e.read.completion ? e.read.serial : 0;
}

inline std::uint64_t network_core::begin_write(connection& c, std::size_t side,
                                               const const_buffers& buffers,
                                               io_completion completion) {
    auto& e = c.ends[side];
    if (settle_at_once(e, buffers.total, completion)) return 0;
    const std::error_code refused = e.reset              ? asio::error::connection_reset
                                    : e.write_shut       ? asio::error::broken_pipe
                                    : e.write.completion ? asio::error::already_started
                                                         : std::error_code{};
    if (refused) {
        completion.post(refused, 0);
        return 0;
    }
    e.write = {std::move(completion), buffers, next_serial++};
    service_write(c, side);
    return e.write.completion ? e.write.serial : 0;
}

template <class Buffer>
void finish_io(pending_io<Buffer>& op, std::error_code ec, std::size_t n) {
    auto completion = std::move(op.completion);
    op = {};
    completion.post(ec, n);
}

// Completes the pending read of ends[side] if it can: bytes, eof or reset.
inline void network_core::service_read(connection& c, std::size_t side) {
    auto& e = c.ends[side];
    if (!e.read.completion) return;
    auto& d = c.dirs[other(side)];
    if (e.reset) return finish_io(e.read, asio::error::connection_reset, 0);
    if (e.read_shut) return finish_io(e.read, asio::error::eof, 0);
    if (const auto readable = d.delivered - d.consumed; readable > 0) {
        const auto n = d.data.pop_into(e.read.buffers, readable);
        d.consumed += n;
        finish_io(e.read, {}, n);
        service_write(c, other(side)); // the peer's writer may have room now
        return;
    }
    if (d.fin_delivered) finish_io(e.read, asio::error::eof, 0);
}

// Completes the pending write of ends[side] if its send buffer has room.
inline void network_core::service_write(connection& c, std::size_t side) {
    auto& e = c.ends[side];
    if (!e.write.completion) return;
    auto& d = c.dirs[side];
    const auto buffered = d.written - d.consumed;
    if (buffered >= config.send_buffer_size) return;
    const auto n =
        std::min<std::uint64_t>(config.send_buffer_size - buffered, e.write.buffers.total);
    d.data.append(e.write.buffers, n);
    d.written += n;
    finish_io(e.write, {}, n);
    pump(c, side);
}

inline void network_core::cancel_io(connection& c, std::size_t side, bool write,
                                    std::uint64_t serial) {
    auto& e = c.ends[side];
    if (write) {
        if (e.write.completion && e.write.serial == serial)
            finish_io(e.write, asio::error::operation_aborted, 0);
    } else if (e.read.completion && e.read.serial == serial) {
        finish_io(e.read, asio::error::operation_aborted, 0);
    }
}

inline void network_core::abort_io(connection& c, std::size_t side, std::error_code ec) {
    auto& e = c.ends[side];
    if (e.read.completion) finish_io(e.read, ec, 0);
    if (e.write.completion) finish_io(e.write, ec, 0);
}

// Drops the bytes of dirs[direction_side] that arrived but were not read, freeing the
// writer's buffer.
inline void network_core::drop_unread(connection& c, std::size_t direction_side) {
    auto& d = c.dirs[direction_side];
    const auto unread = d.delivered - d.consumed;
    if (unread == 0) return;
    d.data.discard(unread);
    d.consumed = d.delivered;
    service_write(c, direction_side);
}

inline void network_core::close_end(connection& c, std::size_t side) {
    auto& e = c.ends[side];
    if (!e.open) return;
    e.open = false;
    record(trace_kind::close, c.id, side);
    abort_io(c, side, asio::error::operation_aborted);
    if (c.aborted || e.reset) return;
    if (!e.write_shut) {
        e.write_shut = true;
        c.dirs[side].fin_queued = true;
        pump(c, side);
    }
    drop_unread(c, other(side));
}

inline void network_core::shutdown_end(connection& c, std::size_t side,
                                       asio::socket_base::shutdown_type what, std::error_code& ec) {
    auto& e = c.ends[side];
    if (closed) {
        ec = asio::error::network_down;
        return;
    }
    if (!e.open) {
        ec = asio::error::bad_descriptor;
        return;
    }
    ec.clear();
    if (what != asio::socket_base::shutdown_receive && !e.write_shut) {
        e.write_shut = true;
        record(trace_kind::shutdown_send, c.id, side);
        if (e.write.completion) finish_io(e.write, asio::error::broken_pipe, 0);
        if (!c.aborted && !e.reset) {
            c.dirs[side].fin_queued = true;
            pump(c, side);
        }
    }
    if (what != asio::socket_base::shutdown_send && !e.read_shut) {
        e.read_shut = true;
        record(trace_kind::shutdown_receive, c.id, side);
        service_read(c, side);
        drop_unread(c, other(side));
    }
}

// ----- stages

// The uplink, then the link (when it has a bandwidth), each first come, first served; the
// link cannot finish before the uplink.
inline departure network_core::send_out(node_id from, node_id to, std::uint64_t size) {
    const auto& path = link(from, to);
    auto& sender = nodes[from];
    auto start = time.now();
    if (sender.upload_bandwidth > 0) start = std::max(start, sender.uplink_free_at);
    const auto uplink_done = start + serialisation_time(size, sender.upload_bandwidth);
    if (sender.upload_bandwidth > 0) sender.uplink_free_at = uplink_done;
    departure out{start, uplink_done};
    if (path.bandwidth > 0) {
        auto& link_free = link_free_at[link_key(from, to)];
        out.first_byte_out = std::max(start, link_free);
        out.last_byte_out =
            std::max(uplink_done, out.first_byte_out + serialisation_time(size, path.bandwidth));
        link_free = out.last_byte_out;
    }
    return out;
}

// Drawn only on lossy links, so that lossless traffic does not shift the sequence.
inline bool network_core::draw_loss(const link_properties& path) {
    return path.loss > 0.0 && random.uniform_real() < path.loss;
}

// The downlink is entered when the first byte arrives, and cannot finish before the last
// byte arrives: arrival = max(last byte out + latency, downlink start + size / rate).
template <class Arrival>
void network_core::propagate(node_id to, std::uint64_t size, const departure& out, duration latency,
                             Arrival arrival) {
    const auto last_byte_arrival = out.last_byte_out + latency;
    if (nodes[to].download_bandwidth == 0) {
        time.call_at(last_byte_arrival, [arrival = std::move(arrival)]() mutable {
            if (arrival.wanted()) arrival.arrive();
        });
        return;
    }
    time.call_at(out.first_byte_out + latency, [core = shared_from_this(), to, size,
                                                last_byte_arrival,
                                                arrival = std::move(arrival)]() mutable {
        if (!arrival.wanted()) return;
        auto& receiver = core->nodes[to];
        const auto start = std::max(core->time.now(), receiver.downlink_free_at);
        const auto done = std::max(last_byte_arrival,
                                   start + serialisation_time(size, receiver.download_bandwidth));
        if (receiver.download_bandwidth > 0) receiver.downlink_free_at = done;
        core->time.call_at(done, [arrival = std::move(arrival)]() mutable {
            if (arrival.wanted()) arrival.arrive();
        });
    });
}

// ----- segments

// Sends what the direction has unsent, one segment at a time on the uplink.
inline void network_core::pump(connection& c, std::size_t side) {
    auto& d = c.dirs[side];
    const auto from = c.ends[side].node;
    const auto to = c.ends[other(side)].node;
    while (!c.aborted && !d.pumping && !d.parked) {
        const auto unsent = d.written - d.sent;
        const bool fin_due = d.fin_queued && !d.fin_sent && unsent <= config.max_segment_size;
        if (unsent == 0 && !fin_due) return;
        if (!reachable(from, to)) {
            park(c, side);
            return;
        }
        const auto size = std::min<std::uint64_t>(unsent, config.max_segment_size);
        auto& s = d.in_flight.emplace_back();
        s.begin = d.sent;
        s.end = d.sent + size;
        s.fin = fin_due;
        d.sent += size;
        d.fin_sent = d.fin_sent || fin_due;
        const auto serialised = transmit(c, side, s);
        if (serialised > time.now()) {
            d.pumping = true;
            time.call_at(serialised, [conn = c.shared_from_this(), side] {
                if (conn->core->closed) return;
                conn->dirs[side].pumping = false;
                conn->core->pump(*conn, side);
            });
        }
    }
}

// Puts one transmission of `s` on the wire; returns when its last byte has left the
// sender (uplink and link), which is when the direction may send its next segment.
inline time_point network_core::transmit(connection& c, std::size_t side, segment& s) {
    const auto from = c.ends[side].node;
    const auto to = c.ends[other(side)].node;
    const auto& path = link(from, to);
    const auto size = s.end - s.begin;
    const auto out = send_out(from, to, size);
    ++s.attempts;
    ++stats.segments_sent;
    record_segment(trace_kind::segment_sent, c, side, s);
    auto conn = c.shared_from_this();
    segment* seg = &s; // stable: in_flight is a deque changed only at its ends
    if (draw_loss(path)) {
        ++stats.segments_lost;
        record_segment(trace_kind::segment_lost, c, side, s);
        time.call_at(out.last_byte_out + retransmission_timeout(from, to, s.attempts),
                     [conn, side, seg] {
                         if (conn->core->closed || conn->aborted) return;
                         conn->core->retransmit(*conn, side, *seg);
                     });
    } else {
        propagate(to, size, out, path.latency, arriving_segment{std::move(conn), side, seg});
    }
    return out.last_byte_out;
}

inline void network_core::retransmit(connection& c, std::size_t side, segment& s) {
    if (!reachable(c.ends[side].node, c.ends[other(side)].node)) return hold(c, side, s);
    transmit(c, side, s);
}

inline void network_core::arrive(connection& c, std::size_t side, segment& s) {
    if (!reachable(c.ends[side].node, c.ends[other(side)].node)) return hold(c, side, s);
    s.arrived = true;
    record_segment(trace_kind::segment_arrived, c, side, s);
    auto& d = c.dirs[side];
    std::uint64_t advanced = 0;
    bool fin = false;
    while (!d.in_flight.empty() && d.in_flight.front().arrived) {
        const auto& front = d.in_flight.front();
        advanced += front.end - front.begin;
        d.delivered = front.end;
        fin = fin || front.fin;
        d.in_flight.pop_front();
    }
    if (advanced == 0 && !fin) return; // waits for an earlier segment
    d.fin_delivered = d.fin_delivered || fin;
    stats.bytes_delivered += advanced;
    const auto reader = other(side);
    const auto& r = c.ends[reader];
    if (!r.open || r.read_shut) {
        drop_unread(c, side);
        if (!r.open && advanced > 0) send_reset(c, reader); // data for a closed end
        return;
    }
    service_read(c, reader);
}

inline void network_core::hold(connection& c, std::size_t side, segment& s) {
    s.held = true;
    ++stats.segments_held;
    record_segment(trace_kind::segment_held, c, side, s);
    park(c, side);
}

inline void network_core::park(connection& c, std::size_t side) {
    auto& d = c.dirs[side];
    if (d.parked) return;
    d.parked = true;
    parked.emplace_back(c.weak_from_this(), side);
}

// After the partition changed: directions and resets that can get through go again.
inline void network_core::resume_parked() {
    auto waiting = std::exchange(parked, {});
    for (auto& [weak, side] : waiting) {
        const auto c = weak.lock();
        if (!c) continue;
        auto& d = c->dirs[side];
        d.parked = false;
        if (c->aborted) continue;
        if (!reachable(c->ends[side].node, c->ends[other(side)].node)) {
            park(*c, side);
            continue;
        }
        for (auto& s : d.in_flight)
            if (s.held) {
                s.held = false;
                transmit(*c, side, s);
            }
        pump(*c, side);
    }
    auto resets = std::exchange(held_resets, {});
    for (auto& [weak, side] : resets) {
        const auto c = weak.lock();
        if (!c) continue;
        const auto from = c->ends[other(side)].node;
        const auto to = c->ends[side].node;
        if (!reachable(from, to)) {
            held_resets.emplace_back(weak, side);
            continue;
        }
        time.call_at(time.now() + link(from, to).latency, [c, side = side] {
            if (!c->core->closed) c->core->reset_arrival(*c, side);
        });
    }
}

// ends[from_side] resets the connection: nothing flows any more, and the other end learns
// it one latency later.
inline void network_core::send_reset(connection& c, std::size_t from_side) {
    if (c.aborted) return;
    c.aborted = true;
    for (auto& d : c.dirs)
        d.in_flight.clear(); // pending events see `aborted` before touching a segment
    ++stats.resets;
    record(trace_kind::reset_sent, c.id, from_side);
    const auto to_side = other(from_side);
    const auto delay = link(c.ends[from_side].node, c.ends[to_side].node).latency;
    time.call_at(time.now() + delay, [conn = c.shared_from_this(), to_side] {
        if (!conn->core->closed) conn->core->reset_arrival(*conn, to_side);
    });
}

inline void network_core::reset_arrival(connection& c, std::size_t side) {
    auto& e = c.ends[side];
    if (!e.open || e.reset) return;
    if (!reachable(c.ends[other(side)].node, e.node)) {
        record(trace_kind::reset_held, c.id, side);
        held_resets.emplace_back(c.weak_from_this(), side);
        return;
    }
    e.reset = true;
    record(trace_kind::reset_received, c.id, side);
    auto& incoming = c.dirs[other(side)];
    incoming.data.discard(incoming.delivered - incoming.consumed);
    incoming.consumed = incoming.delivered;
    abort_io(c, side, asio::error::connection_reset);
}

// ----- listeners and dials

inline std::shared_ptr<listener_state>
network_core::listen(node_id node, std::uint16_t port, std::size_t backlog, std::error_code& ec) {
    auto& n = nodes[node];
    if (closed || !n.up) {
        ec = asio::error::network_down;
        return nullptr;
    }
    if (port == 0) {
        port = n.allocate_port();
        if (port == 0) {
            ec = asio::error::address_in_use;
            return nullptr;
        }
    } else if (n.listeners.contains(port)) {
        ec = asio::error::address_in_use;
        return nullptr;
    }
    ec.clear();
    auto l = std::make_shared<listener_state>();
    l->core = shared_from_this();
    l->node = node;
    l->port = port;
    l->backlog = backlog != 0 ? backlog : config.default_backlog;
    n.listeners.emplace(port, l.get());
    record(trace_kind::listen, node, port);
    return l;
}

inline void network_core::close_listener(listener_state& l) {
    if (!l.open) return;
    l.open = false;
    auto& registry = nodes[l.node].listeners;
    if (const auto it = registry.find(l.port); it != registry.end() && it->second == &l)
        registry.erase(it);
    record(trace_kind::unlisten, l.node, l.port);
    if (l.accept) {
        l.accept_serial = 0;
        std::exchange(l.accept, {}).post(asio::error::operation_aborted, closed_stream());
    }
    auto unaccepted = std::exchange(l.ready, {});
    for (const auto& c : unaccepted) {
        auto& e = c->ends[1];
        if (e.open) {
            e.open = false;
            record(trace_kind::close, c->id, 1);
        }
        send_reset(*c, 1);
    }
}

inline std::uint64_t network_core::begin_accept(listener_state& l, stream_completion completion) {
    if (!l.open) {
        completion.post(asio::error::bad_descriptor, closed_stream());
        return 0;
    }
    if (l.accept) {
        completion.post(asio::error::already_started, closed_stream());
        return 0;
    }
    l.accept = std::move(completion);
    l.accept_serial = next_serial++;
    service_accept(l);
    return l.accept ? l.accept_serial : 0;
}

inline void network_core::service_accept(listener_state& l) {
    if (!l.accept || l.ready.empty()) return;
    auto c = std::move(l.ready.front());
    l.ready.pop_front();
    l.accept_serial = 0;
    std::exchange(l.accept, {}).post({}, make_stream(std::move(c), 1));
}

inline void network_core::cancel_accept(listener_state& l, std::uint64_t serial) {
    if (closed || !l.accept || l.accept_serial != serial) return;
    l.accept_serial = 0;
    std::exchange(l.accept, {}).post(asio::error::operation_aborted, closed_stream());
}

inline std::shared_ptr<dial_state> network_core::begin_dial(node_id from, const endpoint& to,
                                                            duration timeout,
                                                            stream_completion completion) {
    std::error_code ec;
    if (closed)
        ec = asio::error::network_down;
    else if (from >= nodes.size())
        ec = asio::error::invalid_argument;
    else if (!nodes[from].up)
        ec = asio::error::network_down;
    else if (to.node >= nodes.size())
        ec = asio::error::host_unreachable;
    if (ec) {
        completion.post(ec, closed_stream());
        return nullptr;
    }
    auto dial = std::make_shared<dial_state>();
    dial->core = shared_from_this();
    dial->id = next_dial_id++;
    dial->from = from;
    dial->to = to;
    dial->completion = std::move(completion);
    nodes[from].dials.emplace(dial->id, dial);
    record(trace_kind::dial, dial->id, from, to.node, to.port);
    time.call_at(time.now() + link(from, to.node).latency, [dial] {
        if (!dial->core->closed) dial->core->syn_arrival(dial);
    });
    const auto deadline = time.now() + std::max(timeout, duration::zero());
    dial->timeout = time.call_at(deadline, [dial] {
        auto& core = *dial->core;
        if (core.closed || !dial->completion) return;
        ++core.stats.connect_timeouts;
        core.record(trace_kind::connect_timeout, dial->id);
        core.finish_dial(*dial, asio::error::timed_out);
    });
    return dial;
}

// Completes the dial with `c`'s dialer end, or with `ec` and an unconnected stream.
inline void network_core::finish_dial(dial_state& dial, std::error_code ec,
                                      std::shared_ptr<connection> c) {
    nodes[dial.from].dials.erase(dial.id);
    time.cancel(dial.timeout); // so that run() does not idle on to the deadline
    auto result = c ? make_stream(std::move(c), 0) : closed_stream();
    std::exchange(dial.completion, {}).post(ec, std::move(result));
}

inline void network_core::syn_arrival(const std::shared_ptr<dial_state>& dial) {
    if (!dial->completion) return; // finished meanwhile: the SYN is not answered
    const auto target = dial->to;
    auto& n = nodes[target.node];
    if (!n.up || !reachable(dial->from, target.node)) {
        record(trace_kind::syn_dropped, dial->id);
        return; // the dial times out
    }
    const auto it = n.listeners.find(target.port);
    const auto back = link(target.node, dial->from).latency;
    if (it == n.listeners.end() || it->second->ready.size() >= it->second->backlog) {
        record(trace_kind::refused, dial->id);
        time.call_at(time.now() + back, [dial] {
            auto& core = *dial->core;
            if (core.closed || !dial->completion) return;
            if (!core.reachable(dial->to.node, dial->from)) return; // lost: times out
            ++core.stats.connections_refused;
            core.finish_dial(*dial, asio::error::connection_refused);
        });
        return;
    }
    auto& l = *it->second;
    auto c = std::make_shared<connection>(shared_from_this(), next_connection_id++);
    auto& dialer = nodes[dial->from];
    c->ends[0].node = dial->from;
    c->ends[0].port = dialer.allocate_port(); // 0 only if every port is listened on
    c->ends[1].node = target.node;
    c->ends[1].port = target.port;
    dialer.connections.emplace(c->id, c);
    n.connections.emplace(c->id, c);
    record(trace_kind::accepted, c->id, dial->id);
    l.ready.push_back(c);
    service_accept(l);
    time.call_at(time.now() + back, [dial, c] {
        if (!dial->core->closed) dial->core->synack_arrival(*dial, c);
    });
}

inline void network_core::synack_arrival(dial_state& dial, const std::shared_ptr<connection>& c) {
    if (dial.completion && nodes[dial.from].up && reachable(c->ends[1].node, dial.from)) {
        ++stats.connections_established;
        record(trace_kind::established, c->id, dial.id);
        finish_dial(dial, {}, c);
        return;
    }
    // The dialer gave up (or cannot hear the answer): its host resets the connection.
    c->ends[0].open = false;
    send_reset(*c, 0);
}

// ----- datagrams

inline std::shared_ptr<datagram_socket_state>
network_core::open_datagram(node_id node, std::uint16_t port, std::error_code& ec) {
    auto& n = nodes[node];
    if (closed || !n.up) {
        ec = asio::error::network_down;
        return nullptr;
    }
    if (port == 0) {
        port = n.allocate_datagram_port();
        if (port == 0) {
            ec = asio::error::address_in_use;
            return nullptr;
        }
    } else if (n.datagram_sockets.contains(port)) {
        ec = asio::error::address_in_use;
        return nullptr;
    }
    ec.clear();
    auto s = std::make_shared<datagram_socket_state>();
    s->core = shared_from_this();
    s->node = node;
    s->port = port;
    n.datagram_sockets.emplace(port, s.get());
    return s;
}

inline void network_core::close_datagram(datagram_socket_state& s) {
    if (!s.open) return;
    s.open = false;
    auto& registry = nodes[s.node].datagram_sockets;
    if (const auto it = registry.find(s.port); it != registry.end() && it->second == &s)
        registry.erase(it);
    s.queue.clear();
    s.queued_bytes = 0;
    s.notices.clear();
    if (s.receive.completion) {
        s.receive_sender = nullptr;
        finish_io(s.receive, asio::error::operation_aborted, 0);
    }
    if (s.notice_wait) finish_notice_wait(s, asio::error::operation_aborted, {});
}

inline void network_core::close_datagram_sockets(node_state& n) {
    std::vector<datagram_socket_state*> sockets; // close_datagram() erases from the map
    for (auto& [port, s] : n.datagram_sockets)
        sockets.push_back(s);
    for (auto* s : sockets)
        close_datagram(*s);
}

inline std::error_code network_core::refuse_send(const datagram_socket_state& s,
                                                 std::size_t size) const {
    if (closed) return asio::error::network_down;
    if (!s.open) return asio::error::bad_descriptor;
    if (size > config.max_datagram_size) return asio::error::message_size;
    return {};
}

// Requires refuse_send() to have passed. The send completes at once: like UDP's, it does not
// wait for the uplink, which queues what it is given.
inline void network_core::send_datagram(datagram_socket_state& s, byte_buffer bytes,
                                        const endpoint& to, io_completion completion) {
    const auto size = bytes.size();
    const auto id = next_datagram_id++;
    ++stats.datagrams_sent;
    record(trace_kind::datagram_sent, id, s.node, to.node,
           to.port | (static_cast<std::uint64_t>(size) << 16));
    completion.post({}, size);
    // As pump() does for segments, nothing goes out towards a node it cannot reach.
    if (to.node >= nodes.size() || !reachable(s.node, to.node))
        return drop_datagram(id, datagram_drop::unreachable);
    const auto& path = link(s.node, to.node);
    const auto out = send_out(s.node, to.node, size);
    if (draw_loss(path)) return drop_datagram(id, datagram_drop::lost);
    propagate(
        to.node, size, out, path.latency,
        arriving_datagram{shared_from_this(),
                          {id, {s.node, s.port}, to, nodes[s.node].crashes, std::move(bytes)}});
}

inline void network_core::deliver_datagram(datagram d) {
    // A crash stops what its node had in flight, as it does for streams' segments.
    if (nodes[d.from.node].crashes != d.sender_crashes || !nodes[d.to.node].up)
        return drop_datagram(d.id, datagram_drop::crashed);
    if (!reachable(d.from.node, d.to.node)) return drop_datagram(d.id, datagram_drop::unreachable);
    const auto& sockets = nodes[d.to.node].datagram_sockets;
    const auto it = sockets.find(d.to.port);
    if (it == sockets.end()) {
        drop_datagram(d.id, datagram_drop::no_socket);
        if (config.port_unreachable_notices) send_notice(std::move(d));
        return;
    }
    auto& s = *it->second;
    if (s.queued_bytes >= config.datagram_queue_bytes)
        return drop_datagram(d.id, datagram_drop::queue_full);
    ++stats.datagrams_delivered;
    s.queued_bytes += d.bytes.size();
    s.queue.push_back(std::move(d));
    service_receive(s);
}

inline void network_core::drop_datagram(std::uint64_t id, datagram_drop reason) {
    ++stats.datagrams_dropped;
    record(trace_kind::datagram_dropped, id, static_cast<std::uint64_t>(reason));
}

inline void network_core::send_notice(datagram d) {
    const node_id answering = d.to.node;
    d.bytes = {};
    const auto& path = link(answering, d.from.node);
    const auto out = send_out(answering, d.from.node, notice_size);
    if (draw_loss(path)) return;
    const auto crashes = nodes[answering].crashes;
    propagate(d.from.node, notice_size, out, path.latency,
              arriving_notice{shared_from_this(), std::move(d), crashes});
}

inline void network_core::deliver_notice(const datagram& d, std::uint64_t origin_crashes) {
    // Lost with a crash of either end meanwhile, across a partition, or with the socket.
    auto& sender = nodes[d.from.node];
    if (nodes[d.to.node].crashes != origin_crashes || !sender.up ||
        sender.crashes != d.sender_crashes || !reachable(d.to.node, d.from.node))
        return;
    const auto it = sender.datagram_sockets.find(d.from.port);
    if (it == sender.datagram_sockets.end()) return;
    auto& s = *it->second;
    if (s.notices.size() >= max_queued_notices) return;
    ++stats.notices_delivered;
    record(trace_kind::notice_delivered, d.id);
    s.notices.push_back(d.to);
    service_notice_wait(s);
}

inline std::uint64_t network_core::begin_notice_wait(datagram_socket_state& s,
                                                     endpoint* destination,
                                                     notice_completion completion) {
    const std::error_code refused = closed          ? asio::error::network_down
                                    : !s.open       ? asio::error::bad_descriptor
                                    : s.notice_wait ? asio::error::already_started
                                                    : std::error_code{};
    if (refused) {
        completion.post(refused, {});
        return 0;
    }
    s.notice_wait = std::move(completion);
    s.notice_destination = destination;
    s.notice_serial = next_serial++;
    service_notice_wait(s);
    return s.notice_wait ? s.notice_serial : 0;
}

inline void network_core::service_notice_wait(datagram_socket_state& s) {
    if (!s.notice_wait || s.notices.empty()) return;
    *s.notice_destination = s.notices.front();
    s.notices.pop_front();
    finish_notice_wait(s, {}, asio::error::connection_refused);
}

inline void network_core::cancel_notice_wait(datagram_socket_state& s, std::uint64_t serial) {
    if (closed || !s.notice_wait || s.notice_serial != serial) return;
    finish_notice_wait(s, asio::error::operation_aborted, {});
}

inline void network_core::finish_notice_wait(datagram_socket_state& s, std::error_code ec,
                                             std::error_code reported) {
    s.notice_destination = nullptr;
    std::exchange(s.notice_wait, {}).post(ec, reported);
}

inline std::uint64_t network_core::begin_receive(datagram_socket_state& s,
                                                 const mutable_buffers& buffers, endpoint* sender,
                                                 io_completion completion) {
    const std::error_code refused = closed                 ? asio::error::network_down
                                    : !s.open              ? asio::error::bad_descriptor
                                    : s.receive.completion ? asio::error::already_started
                                                           : std::error_code{};
    if (refused) {
        completion.post(refused, 0);
        return 0;
    }
    s.receive = {std::move(completion), buffers, next_serial++};
    s.receive_sender = sender;
    service_receive(s);
    return s.receive.completion ? s.receive.serial : 0;
}

// Completes the pending receive with the first queued datagram, if there is one.
inline void network_core::service_receive(datagram_socket_state& s) {
    if (!s.receive.completion || s.queue.empty()) return;
    const auto d = std::move(s.queue.front());
    s.queue.pop_front();
    s.queued_bytes -= d.bytes.size();
    const auto& into = s.receive.buffers;
    const auto n = std::min<std::size_t>(d.bytes.size(), into.total);
    std::size_t copied = 0;
    for (std::size_t i = 0; copied < n; ++i) {
        const auto take = std::min(into.items[i].size(), n - copied);
        std::memcpy(into.items[i].data(), d.bytes.data() + copied, take);
        copied += take;
    }
    *std::exchange(s.receive_sender, nullptr) = d.from;
    finish_io(s.receive, n < d.bytes.size() ? asio::error::message_size : std::error_code{}, n);
}

inline void network_core::cancel_receive(datagram_socket_state& s, std::uint64_t serial) {
    if (closed || !s.receive.completion || s.receive.serial != serial) return;
    s.receive_sender = nullptr;
    finish_io(s.receive, asio::error::operation_aborted, 0);
}

// ----- faults

inline void network_core::crash(node_id node) {
    auto& n = nodes[node];
    if (!n.up) return;
    n.up = false;
    ++n.crashes;
    record(trace_kind::crash, node);
    auto dials = std::exchange(n.dials, {});
    for (auto& [id, weak] : dials)
        if (const auto d = weak.lock(); d && d->completion) {
            record(trace_kind::dial_aborted, id);
            finish_dial(*d, asio::error::operation_aborted);
        }
    std::vector<listener_state*> listeners;
    for (auto& [port, l] : n.listeners)
        listeners.push_back(l);
    for (auto* l : listeners)
        close_listener(*l);
    close_datagram_sockets(n);
    // Snapshot first: resets and completions must not run into a map being walked.
    std::vector<std::shared_ptr<connection>> connections;
    for (auto& [id, weak] : n.connections)
        if (auto c = weak.lock()) connections.push_back(std::move(c));
    for (const auto& c : connections) {
        std::size_t local_side = 0;
        for (std::size_t side = 0; side < 2; ++side) {
            auto& e = c->ends[side];
            if (e.node != node) continue;
            local_side = side;
            if (e.open) {
                e.open = false;
                abort_io(*c, side, asio::error::operation_aborted);
            }
        }
        const auto& remote = c->ends[other(local_side)];
        if (remote.node == node || !remote.open || remote.reset) {
            c->aborted = true; // nobody to tell: just stop the flows
            for (auto& d : c->dirs)
                d.in_flight.clear();
        } else {
            send_reset(*c, local_side);
        }
    }
}

inline void network_core::restart(node_id node) {
    auto& n = nodes[node];
    if (n.up) return;
    n.up = true;
    record(trace_kind::restart, node);
}

inline void network_core::partition(const std::vector<node_id>& group) {
    const auto side = next_side++;
    for (const auto node : group)
        nodes[node].side = side;
    record(trace_kind::partition, side, group.size());
    resume_parked(); // a regrouping may reunite nodes
}

inline void network_core::heal() {
    for (auto& n : nodes)
        n.side = 0;
    record(trace_kind::heal);
    resume_parked();
}

inline void network_core::close_all() {
    if (closed) return;
    for (auto& n : nodes) {
        std::vector<listener_state*> listeners;
        for (auto& [port, l] : n.listeners)
            listeners.push_back(l);
        for (auto* l : listeners)
            close_listener(*l);
        close_datagram_sockets(n);
    }
    closed = true;
    for (auto& n : nodes) {
        auto dials = std::exchange(n.dials, {});
        for (auto& [id, weak] : dials)
            if (const auto d = weak.lock(); d && d->completion)
                finish_dial(*d, asio::error::operation_aborted);
        std::vector<std::shared_ptr<connection>> connections;
        for (auto& [id, weak] : n.connections)
            if (auto c = weak.lock()) connections.push_back(std::move(c));
        for (const auto& c : connections) {
            c->aborted = true;
            for (auto& d : c->dirs)
                d.in_flight.clear();
            for (std::size_t side = 0; side < 2; ++side)
                abort_io(*c, side, asio::error::operation_aborted);
        }
    }
    parked.clear();
    held_resets.clear();
}

} // namespace detail

} // namespace hivemesh::net::sim
