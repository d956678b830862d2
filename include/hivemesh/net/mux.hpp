// The stream multiplexer: many concurrent, flow-controlled message streams over one secure
// connection, so a small request is never stuck behind a 100 MB transfer.
//
// Fairness: the writer takes at most `frame_payload` bytes (and no more than a batch) from
// a stream before moving on to the next ready stream (round robin), and control frames go
// first.
// Backpressure: each stream has a receive window. The receiver credits bytes back once the
// application consumed the messages they belong to; bytes of a message still being
// assembled are credited at once while nothing is queued ahead of it (so messages larger
// than the window still flow), up to a per-connection budget. A window doubles while its
// stream moves more than half of it per round trip of the link (see max_window), up to a
// second per-connection budget. Memory per connection is therefore bounded by
// max_streams x initial_window + max_window_growth + max_buffered_bytes.
//
// Threading: a connection and its streams live on one executor (a strand, or the single
// thread of a simulated network); every member is called on it.
#pragma once

#include "hivemesh/core/async.hpp"
#include "hivemesh/core/bytes.hpp"
#include "hivemesh/core/clock.hpp"
#include "hivemesh/core/config.hpp"
#include "hivemesh/core/error.hpp"
#include "hivemesh/core/fifo.hpp"
#include "hivemesh/core/log.hpp"
#include "hivemesh/crypto/peer_id.hpp"
#include "hivemesh/net/frame.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/error.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/channel.hpp>
#include <asio/use_awaitable.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <unordered_map>
#include <utility>
#include <vector>

namespace hivemesh::net {

/// Limits and tuning of one multiplexed connection.
struct mux_options {
    /// Bytes a peer may send on one stream before we credit them back.
    std::uint32_t initial_window = 2u << 20;
    /// The most a stream's window grows to. A window doubles while the stream moves more
    /// than half of it in one round trip of the link (as the transport measures it; the
    /// simulated network's and TCP's do): on a long, fast link the window and not the link
    /// would limit it (2 MiB a 100 ms round trip is 21 MB/s). A stream on the move gets at
    /// once the widest window the connection's streams reached. initial_window or less
    /// keeps every window at initial_window.
    std::uint32_t max_window = 16u << 20;
    /// Bytes by which the windows of one connection's streams may together exceed
    /// initial_window; a stream that finishes gives its share back.
    std::size_t max_window_growth = 32u << 20;
    /// Streams a peer may have open towards us at once; more are refused.
    std::uint32_t max_streams = 128;
    /// Largest message we accept on a stream.
    std::uint32_t max_message_size = 16u << 20;
    /// Bytes of partially received messages credited ahead of the application, per
    /// connection; past it, large messages wait for the application like small ones.
    std::size_t max_buffered_bytes = 64u << 20;
    /// Largest data frame payload, sent and accepted: the unit of round-robin fairness.
    /// Plaintext sessions read large frames straight into their message, so the larger
    /// the fewer syscalls (256 KiB: RPC bulk at raw TCP speed, 64 KiB: 70% of it).
    std::size_t frame_payload = 256u << 10;
    /// frame_payload for encrypted sessions (the node picks by the negotiated cipher): a
    /// frame is one sealed record, so the larger the fewer records to seal, open and
    /// account (1 MiB: encrypted RPC bulk 1.1-1.4x that of 64 KiB).
    std::size_t encrypted_frame_payload = 1024u << 10;
    /// Bytes gathered into one write to the secure channel; no frame sent is larger (the
    /// node lowers it to a burst under an upload cap, so a small call waits for one burst).
    std::size_t max_batch_bytes = 1024u << 10;
};

/// A message for mux_stream::send, sent without copying its body: a short lead (the RPC
/// layer's reply tag, a part's header), copied into the frame headers, followed by a body
/// that is owned, shared with other sends (one buffer to many streams) or borrowed from
/// the caller.
struct mux_message {
    static constexpr std::size_t max_lead = 32;

    byte_buffer body;
    std::shared_ptr<const byte_buffer> shared_body; ///< sent instead of `body` when set
    /// Sent instead of `body` when not empty (and shared_body is not set): memory the
    /// caller keeps valid and unchanged until send() completes. Once send() completed,
    /// however it ended, the connection reads it no more (see mux_stream::send).
    byte_view borrowed_body;

    /// Appends `bytes` to the lead; throws std::length_error past max_lead bytes in all.
    void add_lead(byte_view bytes) {
        if (bytes.size() > max_lead - lead_size_)
            throw std::length_error("hivemesh::net::mux_message: lead too long");
        std::copy(bytes.begin(), bytes.end(), lead_.begin() + lead_size_);
        lead_size_ += static_cast<std::uint8_t>(bytes.size());
    }
    byte_view lead() const noexcept { return byte_view(lead_).first(lead_size_); }
    byte_view body_view() const noexcept {
        if (shared_body) return *shared_body;
        return borrowed_body.empty() ? byte_view(body) : borrowed_body;
    }
    bool borrowed() const noexcept { return !shared_body && !borrowed_body.empty(); }
    std::size_t size() const noexcept { return lead_size_ + body_view().size(); }

private:
    std::array<std::byte, max_lead> lead_{};
    std::uint8_t lead_size_ = 0;
};

/// Counters of one connection, for monitoring, tests and benchmarks.
struct mux_statistics {
    std::uint64_t payload_sent = 0;     ///< message bytes written
    std::uint64_t payload_received = 0; ///< message bytes read from the peer
    std::uint64_t streams_opened = 0;   ///< by either side
    std::size_t peak_buffered = 0;      ///< most payload bytes held for the application at once
    std::uint64_t landings_reused = 0;  ///< messages landed in the storage of one read before
    std::uint64_t streams_refused = 0;  ///< opened by the peer past our max_streams (reset)
    std::uint32_t widest_window = 0;    ///< largest window a stream of ours had (max_window)
    std::size_t peak_window_growth = 0; ///< most the windows exceeded initial_window by at once
};

namespace detail {

/// Records in, records out: what the multiplexer needs from the secure session.
class record_channel {
public:
    virtual ~record_channel() = default;
    /// Sends record i = `heads[i]` followed by `bodies[i]`, all in one write; not called
    /// concurrently. The views stay valid until completion.
    virtual asio::awaitable<std::error_code> write(std::span<const byte_view> heads,
                                                   std::span<const byte_view> bodies) = 0;
    /// The next record, valid until the next read.
    virtual asio::awaitable<std::error_code> read(byte_view& record) = 0;
    /// Where the rest of a large record's payload may go, given its first bytes and the
    /// size of the rest: a span of exactly that size, or an empty span (read it whole).
    using placement = std::function<std::span<std::byte>(byte_view head, std::size_t rest)>;
    /// As read(), but a channel that can may hand `place` a large record's first
    /// `head_size` bytes and read the rest of it straight into the span `place` returns;
    /// `record` then views the head only and `placed` is the size of the rest (else 0).
    /// The default reads whole records.
    HIVEMESH_DECL virtual asio::awaitable<std::error_code> read_placed(byte_view& record,
                                                                       std::size_t /*head_size*/,
                                                                       const placement& /*place*/,
                                                                       std::size_t& placed);
    /// Waits until the next record begins to arrive, holding what memory the channel can
    /// spare meanwhile: an idle connection's reader waits here rather than in read(). Ends
    /// the previous record's view. The default returns at once.
    virtual asio::awaitable<std::error_code> wait() { co_return std::error_code{}; }
    /// Closes at once; pending reads and writes fail and read their views no more.
    virtual void close() noexcept = 0;
    /// Whether write() may still read `bodies` after it first suspends (a gather write
    /// straight from them), rather than only before (sealing them into its own buffer).
    virtual bool reads_bodies_while_pending() const noexcept { return true; }
    /// The link's round-trip time as the transport knows it; zero if it does not, and then
    /// the streams' windows stay at their initial size.
    virtual duration round_trip_time() noexcept { return duration::zero(); }
    /// The time on the transport's clock (virtual on the simulated network); read only
    /// while round_trip_time() is not zero.
    virtual time_point now() noexcept { return {}; }
};

/// The protocol's initial window and stream count until the peer's settings arrive.
inline constexpr std::uint32_t default_peer_window = 64u << 10;
inline constexpr std::uint32_t default_peer_streams = 8;
inline constexpr std::uint32_t default_peer_message_size = 64u << 10;

struct stream_state {
    stream_state(const asio::any_io_executor& ex, std::uint32_t stream_id, std::int64_t peer_window,
                 std::uint32_t our_window)
        : id(stream_id)
        , window(our_window)
        , send_window(peer_window)
        , readable(ex)
        , writable(ex)
        , finished_signal(ex) {}

    std::uint32_t id;

    // Receiving.
    hivemesh::fifo<byte_buffer> inbox; ///< complete messages for the application
    std::size_t inbox_bytes = 0;
    byte_buffer partial;    ///< the message being assembled ...
    std::size_t filled = 0; ///< ... in its first `filled` bytes (the rest is stale)
    void drop_partial() noexcept {
        partial.clear();
        filled = 0;
    }
    std::size_t last_size = 0;         ///< of the last message that took several frames
    std::uint64_t received = 0;        ///< payload bytes received
    std::uint64_t credited = 0;        ///< ... of which credited back to the sender
    std::uint32_t window;              ///< the most received may exceed credited by
    time_point sample_start{};         ///< the window's growth: when the rate sample began ...
    std::uint64_t sample_credited = 0; ///< ... and `credited` then
    bool remote_ended = false;

    // Sending.
    struct outgoing {
        mux_message message;
        std::size_t offset = 0; ///< bytes of the message (prefix included) already framed
        bool end_stream = false;
        bool bare = false; ///< no message: only ends the stream
    };
    hivemesh::fifo<outgoing> outbox;
    std::int64_t send_window;
    std::uint64_t messages_queued = 0;
    std::uint64_t messages_written = 0;
    bool open_sent = false;
    bool local_ended = false;
    bool borrowed_in_write = false; ///< a frame of a borrowed body is in the write under way
    bool in_ready_list = false;

    std::error_code failure;      ///< reset by either side, or the connection failed
    std::error_code send_failure; ///< the peer finished cleanly before our sends went out
    bool finished = false;        ///< removed from the connection
    wakeup readable;
    wakeup writable;
    wakeup finished_signal;
};

} // namespace detail

class mux_connection;

/// One stream of a multiplexed connection: ordered messages both ways. Move-only; dropping
/// a stream that has not ended both ways resets it (the peer sees errc::cancelled).
class mux_stream {
public:
    mux_stream() = default;
    mux_stream(std::shared_ptr<mux_connection> connection,
               std::shared_ptr<detail::stream_state> state) noexcept
        : connection_(std::move(connection))
        , state_(std::move(state)) {}
    mux_stream(mux_stream&&) noexcept = default;
    HIVEMESH_DECL mux_stream& operator=(mux_stream&& other) noexcept;
    ~mux_stream() { abandon(); }

    explicit operator bool() const noexcept { return state_ != nullptr; }
    std::uint32_t id() const noexcept { return state_->id; }
    HIVEMESH_DECL const crypto::peer_id& remote() const noexcept;

    /// Sends one message; with `end_stream` it is the last. Completes once the message has
    /// been handed to the secure channel. Errors: message_too_large (over the peer's
    /// limit), connection_closed, the peer's reset code, invalid_argument after the end;
    /// cancellation of the awaiting coroutine resets the stream (errc::cancelled).
    /// A borrowed body is read no more once this completes: should the stream fail while
    /// a write that reads it is under way, the connection is closed.
    HIVEMESH_DECL asio::awaitable<std::error_code> send(byte_buffer message,
                                                        bool end_stream = false);
    /// The same for a message with a lead, or a shared or borrowed body (see mux_message).
    HIVEMESH_DECL asio::awaitable<std::error_code> send(mux_message message,
                                                        bool end_stream = false);

    /// Ends our side without a message. Errors as send().
    HIVEMESH_DECL asio::awaitable<std::error_code> end();

    /// Receives the next message. Errors: asio::error::eof once the peer ended the stream,
    /// the peer's reset code, connection_closed; cancellation resets the stream.
    HIVEMESH_DECL asio::awaitable<std::error_code> receive(byte_buffer& message);
    /// Whether receive() would complete at once: a message, the end or a failure waits.
    bool ready() const noexcept {
        return !state_ || !state_->inbox.empty() || state_->failure || state_->remote_ended;
    }

    /// Aborts both directions and tells the peer `code`.
    HIVEMESH_DECL void reset(errc code = errc::cancelled);

    /// Observes a stream without owning it: dropping a watcher never resets the stream.
    class watcher {
    public:
        /// Completes when the stream has ended both ways or was reset. One waiter at a time.
        HIVEMESH_DECL asio::awaitable<void> until_finished();
        HIVEMESH_DECL void reset(errc code);

    private:
        friend class mux_stream;
        std::shared_ptr<mux_connection> connection_;
        std::shared_ptr<detail::stream_state> state_;
    };
    watcher watch() const {
        watcher w;
        w.connection_ = connection_;
        w.state_ = state_;
        return w;
    }

private:
    HIVEMESH_DECL void abandon() noexcept;

    std::shared_ptr<mux_connection> connection_;
    std::shared_ptr<detail::stream_state> state_;
};

/// A multiplexed connection over a secure record channel. Create with std::make_shared,
/// then start(); it runs until close() or a failure.
class mux_connection : public std::enable_shared_from_this<mux_connection> {
public:
    /// Called for every stream the peer opens.
    using incoming_handler = std::function<void(mux_stream)>;
    /// Called once when the connection ends, with the reason.
    using closed_handler = std::function<void(std::error_code)>;

    HIVEMESH_DECL mux_connection(asio::any_io_executor ex,
                                 std::unique_ptr<detail::record_channel> channel,
                                 crypto::peer_id remote, bool we_dialed, mux_options options);

    mux_connection(const mux_connection&) = delete;
    mux_connection& operator=(const mux_connection&) = delete;

    /// Sends our settings (with `hello`, e.g. listen addresses) and starts reading and
    /// writing.
    HIVEMESH_DECL void start(byte_buffer hello, incoming_handler on_incoming,
                             closed_handler on_closed);

    /// Opens a stream, waiting while the peer's stream limit is reached. Errors:
    /// connection_closed (also after either side's goaway); cancellation of the awaiting coroutine
    /// gives errc::cancelled.
    HIVEMESH_DECL asio::awaitable<std::error_code> open(mux_stream& out);

    /// Ends every stream with connection_closed and closes the channel.
    void close() { fail(errc::connection_closed); }

    /// Tells the peer we open and accept no more streams (a goaway frame); the streams
    /// under way go on. Streams the peer opens from now on are refused (errc::refused).
    /// Idempotent.
    HIVEMESH_DECL void go_away();

    /// Completes once no stream is open (at once if none is) or the connection closed;
    /// cancellation of the awaiting coroutine ends the wait early.
    HIVEMESH_DECL asio::awaitable<void> until_idle();

    bool is_open() const noexcept { return !closed_; }
    /// Open, and neither side said goaway: new streams may go here.
    bool accepts_streams() const noexcept { return !closed_ && !goaway_sent_ && !goaway_received_; }
    std::error_code close_reason() const noexcept { return close_reason_; }
    const crypto::peer_id& remote() const noexcept { return remote_; }
    /// Whether this end dialed the connection (its streams have odd ids).
    bool we_dialed() const noexcept { return (next_local_id_ & 1u) == 1u; }
    /// The peer's settings hello (empty until its settings frame arrived).
    const byte_buffer& remote_hello() const noexcept { return peer_.hello; }
    std::size_t stream_count() const noexcept { return streams_.size(); }
    /// Changes whenever a stream opens or finishes: lets an idle sweep tell a connection
    /// that stayed idle from one that was busy in between.
    std::uint64_t activity() const noexcept { return activity_; }
    const asio::any_io_executor& get_executor() const noexcept { return ex_; }
    const mux_statistics& statistics() const noexcept { return stats_; }

private:
    friend class mux_stream;
    friend class mux_stream::watcher;
    using stream_ptr = std::shared_ptr<detail::stream_state>;

    // ---- sending -------------------------------------------------------------------

    HIVEMESH_DECL asio::awaitable<std::error_code> send(const stream_ptr& s, mux_message message,
                                                        bool end_stream, bool bare = false);

    HIVEMESH_DECL void make_ready(const stream_ptr& s);

    /// Starts the write loop unless it runs. It runs while frames are queued and ends
    /// when none are, so that an idle connection holds no writer's coroutine frames.
    HIVEMESH_DECL void wake_writer();
    HIVEMESH_DECL asio::awaitable<void> write_loop();

    /// Cuts the next data frame from `s`: its header into `heads`, a view of the message
    /// into `bodies`. Returns the frame's size.
    HIVEMESH_DECL std::size_t take_frame(const stream_ptr& s, std::vector<byte_buffer>& heads,
                                         std::vector<byte_view>& bodies,
                                         std::vector<stream_ptr>& completed);

    HIVEMESH_DECL void queue_control(byte_buffer frame);

    // ---- receiving -----------------------------------------------------------------

    HIVEMESH_DECL asio::awaitable<void> read_loop();

    HIVEMESH_DECL std::error_code dispatch(frame& f);

    HIVEMESH_DECL std::error_code on_settings(mux_settings& settings);

    HIVEMESH_DECL std::error_code on_data(const frame& f);

    /// The read loop's placement: the payload of a data frame for a stream that has a
    /// message under way, or whose message is not its first frame, goes straight to the
    /// end of that message. Declines (the frame then takes the usual path, which refuses
    /// it if it must) whatever on_data would not simply append.
    HIVEMESH_DECL std::span<std::byte> place(byte_view head, std::size_t rest);

    /// The next `n` bytes of `s`'s message, to be written. Storage reused from an earlier
    /// message is written over, not zero-filled first: only growth past it is.
    HIVEMESH_DECL static std::span<std::byte> extend(const stream_ptr& s, std::size_t n);

    /// A message in several frames is probably as large as the last such one (a bulk
    /// transfer's parts): room for it at once saves regrowing copies. At most a window,
    /// so a stream never holds more than its window ahead.
    HIVEMESH_DECL void make_room(const stream_ptr& s, std::uint8_t flags, std::size_t frame_size);

    /// Keeps the storage of the message the application read before (at most a window of
    /// it) to land a later one in, on any stream of the connection: a bulk transfer's parts
    /// would otherwise each take a fresh allocation, which glibc may map and page-fault in
    /// anew. Its bytes stay (see extend()).
    HIVEMESH_DECL void keep_spare(byte_buffer& previous);

    HIVEMESH_DECL void count_buffered(std::size_t bytes);

    /// After a data frame's `frame_size` payload bytes were appended to `s->partial`.
    HIVEMESH_DECL std::error_code end_frame(const stream_ptr& s, std::uint8_t flags,
                                            std::size_t frame_size);

    /// Credits back what the application consumed and, while nothing waits ahead of it,
    /// the message being assembled.
    HIVEMESH_DECL void credit(const stream_ptr& s);

    /// Called as `s` is credited: brings its window to the widest one the connection's
    /// streams reached and, from there, once a round trip has passed since the last sample,
    /// doubles it if the stream moved more than half of it per round trip meanwhile.
    /// Returns the growth, which the credit adds.
    HIVEMESH_DECL std::uint32_t widen(const stream_ptr& s);

    HIVEMESH_DECL asio::awaitable<std::error_code> receive(const stream_ptr& s,
                                                           byte_buffer& message);

    // ---- stream and connection lifetime --------------------------------------------

    /// Whether we opened stream `id`: ours all share the parity of next_local_id_.
    bool is_ours(std::uint32_t id) const noexcept { return (id & 1u) == (next_local_id_ & 1u); }

    HIVEMESH_DECL stream_ptr find(std::uint32_t id) const;

    /// A stream both sides ended leaves the connection.
    HIVEMESH_DECL void maybe_finish(const stream_ptr& s);

    /// Our side has sent everything and wants nothing more: the peer keeps what it
    /// received (a reset with code 0) and the stream leaves both sides.
    HIVEMESH_DECL void stop(const stream_ptr& s);

    HIVEMESH_DECL void queue_reset(std::uint32_t id, errc code);

    HIVEMESH_DECL void reset(const stream_ptr& s, errc code);

    /// Removes `s` from the connection; a set `failure` ends it for the application too.
    HIVEMESH_DECL void finish(const stream_ptr& s, std::error_code failure);

    /// Waits in `waiters` until notified; errc::cancelled (and out of the queue) if the
    /// awaiting coroutine is cancelled first.
    HIVEMESH_DECL asio::awaitable<std::error_code>
    wait_in(hivemesh::fifo<std::shared_ptr<hivemesh::wakeup>>& waiters);

    HIVEMESH_DECL static void wake_all(hivemesh::fifo<std::shared_ptr<hivemesh::wakeup>>& waiters);

    HIVEMESH_DECL void wake_openers();

    HIVEMESH_DECL void fail(std::error_code reason);

    /// After the peer's goaway: closes the connection once it has no stream left.
    HIVEMESH_DECL void close_soon();

    asio::any_io_executor ex_;
    std::unique_ptr<detail::record_channel> channel_;
    crypto::peer_id remote_;
    mux_options options_;
    mux_settings peer_{detail::default_peer_window,
                       detail::default_peer_streams,
                       detail::default_peer_message_size,
                       {}};
    bool settings_received_ = false;

    std::unordered_map<std::uint32_t, stream_ptr> streams_;
    std::uint32_t next_local_id_;
    std::uint32_t local_streams_ = 0;
    std::uint32_t remote_streams_ = 0;
    std::size_t buffered_ = 0;      ///< payload bytes held for the application, all streams
    std::size_t window_growth_ = 0; ///< what the streams' windows exceed initial_window by
    static constexpr std::size_t max_spares = 4;
    std::vector<byte_buffer> spares_; ///< landing buffers to reuse, at most a window each
    std::uint64_t activity_ = 0;
    mux_statistics stats_;

    hivemesh::fifo<byte_buffer> control_;
    std::vector<mux_message> retired_;  ///< messages out of their outbox, viewed by the write
    std::vector<stream_ptr> borrowing_; ///< streams with borrowed_in_write set
    hivemesh::fifo<stream_ptr> ready_;
    hivemesh::fifo<std::shared_ptr<hivemesh::wakeup>> open_waiters_;
    hivemesh::fifo<std::shared_ptr<hivemesh::wakeup>> settings_waiters_;
    hivemesh::fifo<std::shared_ptr<hivemesh::wakeup>> idle_waiters_;
    bool writing_ = false; ///< the write loop runs

    bool closed_ = false;
    bool goaway_sent_ = false;
    bool goaway_received_ = false;
    std::error_code close_reason_;
    incoming_handler on_incoming_;
    closed_handler on_closed_;
    detail::record_channel::placement placement_; ///< place(), for the read loop
    stream_ptr landing_; ///< the stream a read is placing payload into, if any
};

} // namespace hivemesh::net

#if !defined(HIVEMESH_SEPARATE_COMPILATION)
#include "hivemesh/net/impl/mux.ipp"
#endif
