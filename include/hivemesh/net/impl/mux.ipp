// net/mux.hpp's non-template function bodies: streams, the connection's writer and reader.
#pragma once

#include "hivemesh/net/mux.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/error.hpp>
#include <asio/post.hpp>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

namespace hivemesh::net {

namespace detail {

HIVEMESH_DECL asio::awaitable<std::error_code>
record_channel::read_placed(byte_view& record, std::size_t /*head_size*/,
                            const placement& /*place*/, std::size_t& placed) {
    placed = 0;
    co_return co_await read(record);
}

} // namespace detail

HIVEMESH_DECL mux_stream& mux_stream::operator=(mux_stream&& other) noexcept {
    if (this != &other) {
        abandon();
        connection_ = std::move(other.connection_);
        state_ = std::move(other.state_);
    }
    return *this;
}

HIVEMESH_DECL const crypto::peer_id& mux_stream::remote() const noexcept {
    return connection_->remote();
}

HIVEMESH_DECL asio::awaitable<std::error_code> mux_stream::send(byte_buffer message,
                                                                bool end_stream) {
    mux_message whole; // named: see CONTRIBUTING.md
    whole.body = std::move(message);
    co_return co_await send(std::move(whole), end_stream);
}

HIVEMESH_DECL asio::awaitable<std::error_code> mux_stream::send(mux_message message,
                                                                bool end_stream) {
    if (!state_) co_return errc::invalid_argument;
    co_return co_await connection_->send(state_, std::move(message), end_stream);
}

HIVEMESH_DECL asio::awaitable<std::error_code> mux_stream::receive(byte_buffer& message) {
    if (!state_) co_return errc::invalid_argument;
    co_return co_await connection_->receive(state_, message);
}

HIVEMESH_DECL asio::awaitable<std::error_code> mux_stream::end() {
    if (!state_) co_return errc::invalid_argument;
    mux_message nothing;
    co_return co_await connection_->send(state_, std::move(nothing), true, true);
}

HIVEMESH_DECL void mux_stream::reset(errc code) {
    if (state_) connection_->reset(state_, code);
}

HIVEMESH_DECL asio::awaitable<void> mux_stream::watcher::until_finished() {
    while (!state_->finished) {
        const std::error_code cancelled = co_await state_->finished_signal.wait();
        if (cancelled) co_return;
    }
}

HIVEMESH_DECL void mux_stream::watcher::reset(errc code) {
    connection_->reset(state_, code);
}

HIVEMESH_DECL void mux_stream::abandon() noexcept {
    if (!state_) return;
    if (!state_->finished) {
        try {
            // Everything sent: stop quietly, so the peer still reads what we sent.
            if (state_->local_ended && state_->outbox.empty())
                connection_->stop(state_);
            else
                connection_->reset(state_, errc::cancelled);
        } catch (...) { // a failed allocation for the reset frame: the peer times out
        }
    }
    state_.reset();
    connection_.reset();
}

HIVEMESH_DECL mux_connection::mux_connection(asio::any_io_executor ex,
                                             std::unique_ptr<detail::record_channel> channel,
                                             crypto::peer_id remote, bool we_dialed,
                                             mux_options options)
    : ex_(std::move(ex))
    , channel_(std::move(channel))
    , remote_(remote)
    , options_(options)
    , next_local_id_(we_dialed ? 1 : 2)
    , placement_([this](byte_view head, std::size_t rest) { return place(head, rest); }) {
    stats_.widest_window = options_.initial_window;
}

HIVEMESH_DECL void mux_connection::start(byte_buffer hello, incoming_handler on_incoming,
                                         closed_handler on_closed) {
    on_incoming_ = std::move(on_incoming);
    on_closed_ = std::move(on_closed);
    byte_buffer frame;
    binary_writer w(frame);
    write_settings_frame(w, {options_.initial_window, options_.max_streams,
                             options_.max_message_size, std::move(hello)});
    control_.push_back(std::move(frame));
    auto self = shared_from_this();
    asio::co_spawn(
        ex_, [self]() { return self->read_loop(); }, asio::detached);
    wake_writer();
}

HIVEMESH_DECL void mux_connection::wake_writer() {
    if (writing_ || closed_) return;
    writing_ = true;
    // Posted, not started here: the caller may be in the middle of a send or a frame.
    asio::post(ex_, [self = shared_from_this()] {
        asio::co_spawn(
            self->ex_, [self]() { return self->write_loop(); }, asio::detached);
    });
}

HIVEMESH_DECL asio::awaitable<std::error_code> mux_connection::open(mux_stream& out) {
    while (accepts_streams() && local_streams_ >= peer_.max_streams) {
        const std::error_code cancelled = co_await wait_in(open_waiters_);
        if (cancelled) co_return cancelled;
    }
    if (!accepts_streams()) co_return errc::connection_closed;
    const std::uint32_t id = next_local_id_;
    next_local_id_ += 2;
    auto state = std::make_shared<detail::stream_state>(ex_, id, peer_.initial_window,
                                                        options_.initial_window);
    streams_.emplace(id, state);
    ++local_streams_;
    ++activity_;
    ++stats_.streams_opened;
    out = mux_stream(shared_from_this(), std::move(state));
    co_return std::error_code{};
}

HIVEMESH_DECL asio::awaitable<std::error_code>
mux_connection::send(const stream_ptr& s, mux_message message, bool end_stream, bool bare) {
    // After the peer's clean end it reads nothing more: a send can only be cancelled.
    if (s->finished && !s->failure && !s->send_failure) s->send_failure = errc::cancelled;
    if (s->failure) co_return s->failure;
    if (s->send_failure) co_return s->send_failure;
    if (s->local_ended) co_return errc::invalid_argument;
    // The peer's real limit comes with its settings; only a message above the protocol
    // default has to wait for them.
    while (!settings_received_ && !closed_ && message.size() > peer_.max_message_size) {
        const std::error_code cancelled = co_await wait_in(settings_waiters_);
        if (cancelled) co_return cancelled;
    }
    if (s->failure) co_return s->failure;
    if (message.size() > peer_.max_message_size) co_return errc::message_too_large;
    s->local_ended = end_stream;
    s->outbox.push_back({std::move(message), 0, end_stream, bare});
    const std::uint64_t mine = ++s->messages_queued;
    make_ready(s);
    while (!s->failure && !s->send_failure && s->messages_written < mine) {
        const std::error_code cancelled = co_await s->writable.wait();
        if (cancelled) {
            reset(s, errc::cancelled);
            co_return errc::cancelled;
        }
    }
    if (s->messages_written >= mine) co_return std::error_code{};
    co_return s->failure ? s->failure : s->send_failure;
}

HIVEMESH_DECL void mux_connection::make_ready(const stream_ptr& s) {
    if (s->in_ready_list || s->outbox.empty() || s->failure) return;
    // A zero-length message needs no window; anything else waits for credit.
    const auto& front = s->outbox.front();
    if (s->send_window <= 0 && front.offset < front.message.size()) return;
    s->in_ready_list = true;
    ready_.push_back(s);
    wake_writer();
}

HIVEMESH_DECL asio::awaitable<void> mux_connection::write_loop() {
    auto self = shared_from_this(); // keeps the connection while the loop runs
    std::vector<byte_buffer> heads; // control frames whole, data frame headers
    std::vector<byte_view> head_views, bodies;
    std::vector<stream_ptr> completed;
    while (!closed_ && !(control_.empty() && ready_.empty())) {
        heads.clear();
        bodies.clear();
        completed.clear();
        std::size_t batch = 0;
        while (!control_.empty()) {
            batch += control_.front().size();
            heads.push_back(std::move(control_.front()));
            bodies.emplace_back();
            control_.pop_front();
        }
        while (!ready_.empty() && batch < options_.max_batch_bytes) {
            stream_ptr s = std::move(ready_.front());
            ready_.pop_front();
            s->in_ready_list = false;
            if (s->failure || s->outbox.empty()) continue;
            batch += take_frame(s, heads, bodies, completed);
            make_ready(s);
        }
        head_views.assign(heads.begin(), heads.end());
        const std::error_code ec = co_await channel_->write(head_views, bodies);
        retired_.clear(); // the write no longer views them
        for (const auto& s : borrowing_)
            s->borrowed_in_write = false;
        borrowing_.clear();
        if (ec) {
            fail(ec);
            break;
        }
        for (const auto& s : completed) {
            ++s->messages_written;
            s->writable.notify();
        }
    }
    writing_ = false;
}

HIVEMESH_DECL std::size_t mux_connection::take_frame(const stream_ptr& s,
                                                     std::vector<byte_buffer>& heads,
                                                     std::vector<byte_view>& bodies,
                                                     std::vector<stream_ptr>& completed) {
    auto& out = s->outbox.front();
    const byte_view lead = out.message.lead();
    const std::size_t remaining = out.message.size() - out.offset;
    // No larger than a batch: under an upload cap batches shrink to a burst, and a frame is
    // written whole (the receiver accepts up to frame_payload, so smaller is always fine).
    const std::size_t chunk = std::min<std::size_t>(
        {remaining, options_.frame_payload, options_.max_batch_bytes,
         static_cast<std::size_t>(std::max<std::int64_t>(s->send_window, 0))});
    const bool last = chunk == remaining;
    std::uint8_t flags = 0;
    if (!s->open_sent) flags |= frame_flags::open;
    if (last && !out.bare) flags |= frame_flags::end_message;
    if (last && out.end_stream) flags |= frame_flags::end_stream;
    s->open_sent = true;

    byte_buffer head;
    head.reserve(detail::data_header_size + lead.size());
    binary_writer w(head);
    write_data_header(w, s->id, flags);
    // The frame carries bytes [offset, offset + chunk) of lead + body: the lead travels
    // in the head.
    const std::size_t end = out.offset + chunk;
    std::size_t from = out.offset;
    if (from < lead.size()) {
        const byte_view part = lead.subspan(from, std::min(end, lead.size()) - from);
        head.insert(head.end(), part.begin(), part.end());
        from += part.size();
    }
    heads.push_back(std::move(head));
    bodies.push_back(out.message.body_view().subspan(from - lead.size(), end - from));
    if (out.message.borrowed() && end > from && !s->borrowed_in_write) {
        s->borrowed_in_write = true;
        borrowing_.push_back(s);
    }
    out.offset += chunk;
    s->send_window -= static_cast<std::int64_t>(chunk);
    stats_.payload_sent += chunk;
    if (last) {
        const bool ended = out.end_stream;
        retired_.push_back(std::move(out.message)); // viewed until the write completes
        s->outbox.pop_front();
        completed.push_back(s);
        if (ended) maybe_finish(s);
    }
    return detail::data_header_size + chunk;
}

HIVEMESH_DECL void mux_connection::queue_control(byte_buffer frame) {
    control_.push_back(std::move(frame));
    wake_writer();
}

HIVEMESH_DECL asio::awaitable<void> mux_connection::read_loop() {
    auto self = shared_from_this();
    frame f;
    while (!closed_) {
        byte_view record;
        std::size_t placed = 0;
        auto read = co_await channel_->wait();
        if (!read)
            read = co_await channel_->read_placed(record, detail::data_header_size, placement_,
                                                  placed);
        // place() may have chosen a stream whose message the read was filling.
        const stream_ptr landed = std::exchange(landing_, nullptr);
        if (landed && landed->finished) landed->drop_partial();
        if (read) {
            fail(read == asio::error::eof ? make_error_code(errc::connection_closed) : read);
            break;
        }
        if (closed_) break;
        if (auto ec = decode_frame(record, f, options_.frame_payload)) {
            log::warning("mux", "protocol violation from ", remote_.short_string(), ": ",
                         ec.message());
            fail(ec);
            break;
        }
        // A placed frame's payload is in its stream already (unless the stream ended).
        auto ec = placed == 0        ? dispatch(f)
                  : landed->finished ? std::error_code{}
                                     : end_frame(landed, f.flags, placed);
        if (ec) {
            log::warning("mux", "protocol violation from ", remote_.short_string(), ": ",
                         ec.message());
            fail(ec);
            break;
        }
    }
}

HIVEMESH_DECL std::error_code mux_connection::dispatch(frame& f) {
    switch (f.type) {
    case frame_type::settings:
        return on_settings(f.settings);
    case frame_type::data:
        return on_data(f);
    case frame_type::window:
        if (auto s = find(f.stream)) {
            s->send_window += f.value;
            if (s->send_window > std::int64_t{1} << 32) return errc::protocol_violation;
            make_ready(s);
        }
        return {};
    case frame_type::reset:
        if (auto s = find(f.stream)) {
            if (f.value == 0) { // the peer is done: it reads nothing more, sends nothing more
                if (s->filled != 0) return errc::protocol_violation;
                s->remote_ended = true;
                finish(s, {});
                return {};
            }
            const auto code = static_cast<errc>(f.value);
            const bool known =
                f.value >= 1 && f.value <= static_cast<std::uint32_t>(errc::remote_error);
            finish(s, known ? make_error_code(code) : make_error_code(errc::remote_error));
        }
        return {};
    case frame_type::ping: {
        byte_buffer pong;
        binary_writer w(pong);
        write_ping_frame(w, frame_type::pong, f.token);
        queue_control(std::move(pong));
        return {};
    }
    case frame_type::goaway:
        // The peer opens and accepts nothing more: the streams under way finish, then the
        // connection has no use left.
        goaway_received_ = true;
        wake_all(open_waiters_);
        if (streams_.empty()) close_soon();
        return {};
    case frame_type::pong:
        return {};
    }
    return errc::protocol_violation;
}

HIVEMESH_DECL std::error_code mux_connection::on_settings(mux_settings& settings) {
    if (settings_received_) return errc::protocol_violation;
    if (settings.initial_window == 0 || settings.max_streams == 0 || settings.max_message_size == 0)
        return errc::protocol_violation;
    settings_received_ = true;
    const std::int64_t delta = std::int64_t{settings.initial_window} - peer_.initial_window;
    peer_ = std::move(settings);
    for (auto& [id, s] : streams_) { // their windows started from the default
        s->send_window += delta;
        make_ready(s);
    }
    wake_openers();
    wake_all(settings_waiters_);
    return {};
}

HIVEMESH_DECL std::error_code mux_connection::on_data(const frame& f) {
    stream_ptr s = find(f.stream);
    bool opened = false;
    if (!s) {
        if (is_ours(f.stream)) // a stream we opened and already finished, or never opened
            return f.stream < next_local_id_ ? std::error_code{} : errc::protocol_violation;
        // Streams need not open in id order (a stream's first frame may wait for
        // window or settings): without the open flag this is late data for a stream
        // that already finished here, and is dropped.
        if ((f.flags & frame_flags::open) == 0) return {};
        if (remote_streams_ >= options_.max_streams || goaway_sent_) {
            if (remote_streams_ >= options_.max_streams) ++stats_.streams_refused;
            queue_reset(f.stream, errc::refused);
            return {};
        }
        s = std::make_shared<detail::stream_state>(ex_, f.stream, peer_.initial_window,
                                                   options_.initial_window);
        s->open_sent = true; // the peer opened it: our frames carry no open flag
        streams_.emplace(f.stream, s);
        ++remote_streams_;
        ++activity_;
        ++stats_.streams_opened;
        opened = true;
    } else if (f.flags & frame_flags::open) {
        return errc::protocol_violation;
    }
    if (s->remote_ended) return errc::protocol_violation;

    s->received += f.payload.size();
    if (s->received - s->credited > s->window) return errc::protocol_violation;
    if (s->filled + f.payload.size() > options_.max_message_size) {
        reset(s, errc::message_too_large);
    } else {
        make_room(s, f.flags, f.payload.size());
        const auto room = extend(s, f.payload.size());
        std::copy(f.payload.begin(), f.payload.end(), room.begin());
        count_buffered(f.payload.size());
        if (auto ec = end_frame(s, f.flags, f.payload.size())) return ec;
    }
    // Told after its first frame is in, so a handler started at once finds that message.
    if (opened && on_incoming_) on_incoming_(mux_stream(shared_from_this(), s));
    return {};
}

HIVEMESH_DECL std::span<std::byte> mux_connection::place(byte_view head, std::size_t rest) {
    frame f;
    if (closed_ || landing_ || decode_frame(head, f, options_.frame_payload) ||
        f.type != frame_type::data || (f.flags & frame_flags::open) != 0 ||
        rest > options_.frame_payload)
        return {};
    const stream_ptr s = find(f.stream);
    if (!s || s->remote_ended || s->received + rest - s->credited > s->window ||
        s->filled + rest > options_.max_message_size)
        return {};
    // Counted as received and buffered from now on, as on_data does after its copy.
    s->received += rest;
    make_room(s, f.flags, rest);
    count_buffered(rest);
    landing_ = s;
    return extend(s, rest);
}

HIVEMESH_DECL std::span<std::byte> mux_connection::extend(const stream_ptr& s, std::size_t n) {
    const std::size_t offset = s->filled;
    if (s->partial.size() < offset + n) s->partial.resize(offset + n);
    s->filled += n;
    return std::span(s->partial).subspan(offset, n);
}

HIVEMESH_DECL void mux_connection::make_room(const stream_ptr& s, std::uint8_t flags,
                                             std::size_t frame_size) {
    if (s->filled != 0 || (flags & frame_flags::end_message) != 0) return;
    const std::size_t size =
        std::clamp<std::size_t>(s->last_size, frame_size, options_.initial_window);
    const auto fits = std::find_if(spares_.begin(), spares_.end(),
                                   [size](const byte_buffer& b) { return b.capacity() >= size; });
    if (fits != spares_.end()) {
        s->partial = std::move(*fits);
        spares_.erase(fits);
        ++stats_.landings_reused;
    }
    s->partial.reserve(size);
}

HIVEMESH_DECL void mux_connection::keep_spare(byte_buffer& previous) {
    if (previous.capacity() < options_.frame_payload ||
        previous.capacity() > options_.initial_window)
        return;
    if (spares_.size() == max_spares) spares_.erase(spares_.begin()); // the oldest
    spares_.push_back(std::move(previous));
}

HIVEMESH_DECL void mux_connection::count_buffered(std::size_t bytes) {
    buffered_ += bytes;
    stats_.payload_received += bytes;
    stats_.peak_buffered = std::max(stats_.peak_buffered, buffered_);
}

HIVEMESH_DECL std::error_code mux_connection::end_frame(const stream_ptr& s, std::uint8_t flags,
                                                        std::size_t frame_size) {
    if (flags & frame_flags::end_message) {
        s->partial.resize(s->filled); // drops stale bytes; never writes
        if (s->partial.size() > frame_size) {
            s->last_size = s->partial.size();
            // A smaller message than guessed gives the room back rather than hold it.
            if (s->partial.capacity() > 2 * s->partial.size()) s->partial.shrink_to_fit();
        }
        s->inbox_bytes += s->partial.size();
        s->inbox.push_back(std::move(s->partial));
        s->partial = {};
        s->filled = 0;
    }
    if (flags & frame_flags::end_stream) {
        if (s->filled != 0) return errc::protocol_violation; // ended mid-message
        s->remote_ended = true;
        maybe_finish(s);
    }
    s->readable.notify();
    credit(s);
    return {};
}

HIVEMESH_DECL void mux_connection::credit(const stream_ptr& s) {
    if (s->remote_ended || s->failure) return;
    const std::uint64_t uncredited = s->received - s->credited;
    std::uint64_t hold = s->inbox_bytes;
    if (!s->inbox.empty() || buffered_ > options_.max_buffered_bytes) hold += s->filled;
    if (uncredited <= hold) return;
    const std::uint64_t amount = uncredited - hold;
    // Small credits are batched; a stalled sender always gets at least a quarter window.
    if (amount < s->window / 4 && uncredited < s->window) return;
    s->credited += amount;
    const std::uint32_t growth = widen(s);
    byte_buffer frame;
    binary_writer w(frame);
    write_window_frame(w, s->id, static_cast<std::uint32_t>(amount + growth));
    queue_control(std::move(frame));
}

HIVEMESH_DECL std::uint32_t mux_connection::widen(const stream_ptr& s) {
    if (s->window >= options_.max_window || window_growth_ >= options_.max_window_growth) return 0;
    // A stream on the move gets at once the widest window the connection's streams needed
    // before: each round of a bulk protocol (the all-reduce's) opens new ones.
    std::uint64_t wanted = stats_.widest_window;
    if (wanted <= s->window) {
        const duration round_trip = channel_->round_trip_time();
        if (round_trip <= duration::zero()) return 0;
        const time_point now = channel_->now();
        const duration elapsed = now - s->sample_start;
        const bool stepped_back = elapsed < duration::zero(); // TCP's clock is the wall clock
        if (!stepped_back && elapsed < round_trip) return 0;  // a sample spans a round trip
        const auto moved = static_cast<double>(s->credited - s->sample_credited);
        s->sample_start = now;
        s->sample_credited = s->credited;
        // Under half the window a round trip: what limits the stream is not its window (so
        // says a stream's first sample too, which begins at the epoch).
        if (stepped_back || moved * static_cast<double>(round_trip.count()) <
                                0.5 * s->window * static_cast<double>(elapsed.count()))
            return 0;
        wanted = 2 * std::uint64_t{s->window};
    }
    const auto growth = static_cast<std::uint32_t>(
        std::min({wanted - s->window, std::uint64_t{options_.max_window - s->window},
                  std::uint64_t{options_.max_window_growth - window_growth_}}));
    s->window += growth;
    window_growth_ += growth;
    stats_.widest_window = std::max(stats_.widest_window, s->window);
    stats_.peak_window_growth = std::max(stats_.peak_window_growth, window_growth_);
    return growth;
}

HIVEMESH_DECL asio::awaitable<std::error_code> mux_connection::receive(const stream_ptr& s,
                                                                       byte_buffer& message) {
    while (s->inbox.empty()) {
        if (s->failure) co_return s->failure;
        if (s->remote_ended) co_return asio::error::eof;
        const std::error_code cancelled = co_await s->readable.wait();
        if (cancelled) {
            reset(s, errc::cancelled);
            co_return errc::cancelled;
        }
    }
    keep_spare(message);
    message = std::move(s->inbox.front());
    s->inbox.pop_front();
    s->inbox_bytes -= message.size();
    buffered_ -= message.size();
    credit(s);
    co_return std::error_code{};
}

HIVEMESH_DECL mux_connection::stream_ptr mux_connection::find(std::uint32_t id) const {
    const auto it = streams_.find(id);
    return it == streams_.end() ? nullptr : it->second;
}

HIVEMESH_DECL void mux_connection::maybe_finish(const stream_ptr& s) {
    if (s->local_ended && s->outbox.empty() && s->remote_ended) finish(s, {});
}

HIVEMESH_DECL void mux_connection::stop(const stream_ptr& s) {
    if (s->finished) return;
    if (!closed_) queue_reset(s->id, errc{});
    finish(s, {});
}

HIVEMESH_DECL void mux_connection::queue_reset(std::uint32_t id, errc code) {
    byte_buffer frame;
    binary_writer w(frame);
    write_reset_frame(w, id, static_cast<std::uint16_t>(code));
    queue_control(std::move(frame));
}

HIVEMESH_DECL void mux_connection::reset(const stream_ptr& s, errc code) {
    if (s->finished) return;
    if (!closed_) queue_reset(s->id, code);
    finish(s, code);
}

HIVEMESH_DECL void mux_connection::finish(const stream_ptr& s, std::error_code failure) {
    if (s->finished) return;
    s->finished = true;
    window_growth_ -= s->window - options_.initial_window;
    if (failure && !s->failure) s->failure = failure;
    // Unsent messages are cancelled; received ones stay readable after a clean finish
    // (the peer may end while our own end-of-stream is still queued).
    if (!s->failure && !s->outbox.empty()) s->send_failure = errc::cancelled;
    buffered_ -= s->filled;
    if (s->failure) {
        buffered_ -= s->inbox_bytes;
        s->inbox.clear();
        s->inbox_bytes = 0;
    }
    for (auto& out : s->outbox) // a write in flight may view the one being sent
        retired_.push_back(std::move(out.message));
    s->outbox.clear();
    if (s != landing_) s->drop_partial(); // else a read is filling it: the loop drops it
    streams_.erase(s->id);
    ++activity_;
    if (is_ours(s->id)) {
        --local_streams_;
        wake_openers();
    } else {
        --remote_streams_;
    }
    s->readable.notify();
    s->writable.notify();
    s->finished_signal.notify();
    if (streams_.empty()) {
        wake_all(idle_waiters_);
        if (goaway_received_) close_soon();
    }
    // The failed send returns now, so its borrowed body must not be read any more.
    if (s->failure && s->borrowed_in_write && channel_->reads_bodies_while_pending())
        fail(errc::connection_closed);
}

HIVEMESH_DECL void mux_connection::go_away() {
    if (closed_ || goaway_sent_) return;
    goaway_sent_ = true;
    byte_buffer frame;
    binary_writer w(frame);
    write_frame_header(w, frame_type::goaway, 0);
    queue_control(std::move(frame));
    wake_all(open_waiters_);
}

HIVEMESH_DECL asio::awaitable<void> mux_connection::until_idle() {
    if (!closed_ && !streams_.empty()) co_await wait_in(idle_waiters_);
}

HIVEMESH_DECL void mux_connection::close_soon() {
    // Posted: finish() and dispatch() run inside the read loop and the streams' callers.
    asio::post(ex_, [self = shared_from_this()] {
        if (self->streams_.empty()) self->close();
    });
}

HIVEMESH_DECL asio::awaitable<std::error_code>
mux_connection::wait_in(hivemesh::fifo<std::shared_ptr<hivemesh::wakeup>>& waiters) {
    auto waiter = std::make_shared<hivemesh::wakeup>(ex_);
    waiters.push_back(waiter);
    const std::error_code cancelled = co_await waiter->wait();
    if (!cancelled) co_return std::error_code{};
    waiters.erase(waiter);
    co_return errc::cancelled;
}

HIVEMESH_DECL void
mux_connection::wake_all(hivemesh::fifo<std::shared_ptr<hivemesh::wakeup>>& waiters) {
    for (auto& waiter : waiters)
        waiter->notify();
    waiters.clear();
}

HIVEMESH_DECL void mux_connection::wake_openers() {
    std::uint32_t free =
        peer_.max_streams > local_streams_ ? peer_.max_streams - local_streams_ : 0;
    while (free-- > 0 && !open_waiters_.empty()) {
        open_waiters_.front()->notify();
        open_waiters_.pop_front();
    }
}

HIVEMESH_DECL void mux_connection::fail(std::error_code reason) {
    if (closed_) return;
    closed_ = true;
    close_reason_ = reason;
    const std::error_code stream_error =
        reason == errc::connection_closed ? reason : make_error_code(errc::connection_closed);
    for (auto streams = streams_; auto& [id, s] : streams)
        finish(s, stream_error);
    ready_.clear();
    control_.clear();
    wake_all(open_waiters_);
    wake_all(settings_waiters_);
    wake_all(idle_waiters_);
    channel_->close();
    if (on_closed_) {
        auto handler = std::move(on_closed_);
        handler(reason);
    }
    on_incoming_ = nullptr;
}

} // namespace hivemesh::net
