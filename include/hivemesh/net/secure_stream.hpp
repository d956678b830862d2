// A secure message stream over any Asio byte stream (TCP socket, simulated stream, Unix
// socket): runs the handshake of crypto/secure_channel.hpp, then carries whole messages as
// sealed records. The layers above (stream multiplexer, RPC) see authenticated peers and
// message boundaries.
//
// Wire: each handshake message is framed as u32 length (little-endian, 1..4096) | message;
// after the handshake the stream is a sequence of records (see secure_channel.hpp).
#pragma once

#include "hivemesh/core/binary.hpp"
#include "hivemesh/core/bytes.hpp"
#include "hivemesh/core/error.hpp"
#include "hivemesh/crypto/identity.hpp"
#include "hivemesh/crypto/peer_id.hpp"
#include "hivemesh/crypto/secure_channel.hpp"

#include <asio/awaitable.hpp>
#include <asio/buffer.hpp>
#include <asio/error.hpp>
#include <asio/redirect_error.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <stdexcept>
#include <system_error>
#include <utility>
#include <vector>

namespace hivemesh::net {

/// A completion condition for asio::async_write that writes everything, like
/// asio::transfer_all(), without its 64 KiB cap per write_some: capped, a bulk transfer
/// costs a syscall and a wake-up of the peer every 64 KiB (4x the sendmsg calls of an
/// all-reduce round); uncapped, one sendmsg takes whatever the kernel's send buffer holds.
struct transfer_all_uncapped {
    std::size_t operator()(const std::error_code& error, std::size_t) const noexcept {
        return error ? 0 : std::numeric_limits<std::size_t>::max();
    }
};

/// Secure session over an owned `Stream`, which must be an Asio AsyncReadStream and
/// AsyncWriteStream with get_executor() and close(std::error_code&).
///
/// Concurrency: one read() may run at the same time as one write() or shutdown(); read()
/// must not overlap another read(), nor write()/shutdown() each other: the caller
/// serialises them (the multiplexer has one reader loop and one writer queue). All calls,
/// close() included, run on the stream's executor (one thread or a strand).
/// Errors after the handshake are sticky per direction.
template <class Stream>
class secure_stream {
public:
    using next_layer_type = Stream;
    using executor_type = typename Stream::executor_type;

    /// Reads happen in chunks of at least this size, so small records share a syscall.
    static constexpr std::size_t read_chunk_size = 2 * 1024;
    /// A connection with nothing to read waits holding no buffer: its first bytes land in a
    /// small array inside the stream (a message that fits takes one read), and the buffer is
    /// allocated when they arrive. A DHT node keeps dozens of mostly idle connections.
    /// Buffers past released_buffer_size (a connection carrying large records) are kept,
    /// since reallocating them for every record would cost more than they save.
    static constexpr std::size_t idle_read_size = 256;
    static constexpr std::size_t released_buffer_size = 16 * 1024;
    /// A connection carrying large records reads into a buffer of about four of them (up
    /// to this size), so one read takes in several and moving a partial record is rare.
    static constexpr std::size_t max_read_buffer_size = 1024 * 1024;

    /// Takes ownership of a connected stream.
    explicit secure_stream(Stream stream)
        : stream_(std::move(stream)) {}

    /// Runs the handshake as `r`, proving `self` (which must outlive the operation) and,
    /// if `expected` is set, requiring the peer to prove that PeerId.
    ///
    /// Completes with: success; the handshake's errors (handshake_failed,
    /// peer_id_mismatch); handshake_failed for a frame longer than
    /// crypto::handshake::max_message_size or empty; connection_closed if the peer closes
    /// the connection before the handshake ends; or the transport's error. There is no
    /// deadline inside: to bound it (or cancel it), call close() from a timer, and the
    /// pending read or write completes with asio::error::operation_aborted. On failure
    /// the stream stays open (close() it) and read()/write() return the same error.
    /// The dialer succeeds once it has sent message 3; should the listener refuse that,
    /// the dialer's next read() reports the connection ending (connection_truncated).
    /// Call once; throws std::logic_error on a second call.
    /// `resume` may let it resume (see crypto::resumption).
    asio::awaitable<std::error_code> handshake(crypto::role r, const crypto::identity& self,
                                               std::optional<crypto::peer_id> expected = {},
                                               crypto::secure_options options = {},
                                               crypto::resumption resume = {}) {
        if (state_ != state::fresh)
            throw std::logic_error("hivemesh::net::secure_stream::handshake called twice");
        state_ = state::handshaking;
        auto ec = co_await run_handshake(r, self, expected, options, std::move(resume));
        if (ec) {
            state_ = state::failed;
            read_error_ = write_error_ = ec;
        } else {
            state_ = state::established;
        }
        co_return ec;
    }

    /// After a successful handshake: who the peer proved to be, and the negotiated cipher.
    const crypto::peer_id& remote_id() const {
        require_established();
        return session_->remote_id;
    }
    const crypto::public_key& remote_key() const {
        require_established();
        return session_->remote_key;
    }
    crypto::cipher cipher() const {
        require_established();
        return session_->suite;
    }
    /// After a successful handshake: whether it resumed a ticket.
    bool resumed() const {
        require_established();
        return session_->resumed;
    }

    /// Sends each message as one record; all records of the call are sealed into one
    /// reusable buffer and go out in a single asio::async_write (batch small messages
    /// here; the buffer grows to the largest batch; in plaintext mode only the records'
    /// prefixes are copied and the messages go out from where they are, in one gather
    /// write). `messages` must stay valid until
    /// completion. Errors: message_too_large (a message over the record limit; nothing is
    /// sent and the stream stays usable), connection_closed (after shutdown()), the
    /// transport's error (sticky: later writes return it). Cancel with close().
    asio::awaitable<std::error_code> write(std::span<const byte_view> messages) {
        co_return co_await write(std::span<const byte_view>(), messages);
    }

    /// As write(messages), where message i is `heads[i]` followed by `bodies[i]` (`heads`
    /// may be empty: no heads). Sealing joins them, so the caller need not copy a header
    /// and a payload together first. Both spans must stay valid until completion.
    asio::awaitable<std::error_code> write(std::span<const byte_view> heads,
                                           std::span<const byte_view> bodies) {
        if (!usable()) co_return write_error_;
        if (write_error_) co_return write_error_;
        if (!heads.empty() && heads.size() != bodies.size())
            throw std::invalid_argument("hivemesh::net::secure_stream::write: one head per body");
        auto& sealer = session_->sealer;
        if (sealer.closed()) co_return errc::connection_closed;
        const auto head = [&](std::size_t i) { return heads.empty() ? byte_view() : heads[i]; };
        std::size_t total = 0;
        for (std::size_t i = 0; i < bodies.size(); ++i) {
            const std::size_t size = head(i).size() + bodies[i].size();
            if (size > sealer.max_payload_size()) co_return errc::message_too_large;
            total += sealer.record_size(size);
        }
        if (total == 0) co_return std::error_code{};
        if (sealer.suite() == crypto::cipher::plaintext)
            co_return co_await write_plaintext(heads, bodies);
        if (write_buffer_.size() < total) write_buffer_.resize(total);
        std::size_t offset = 0;
        for (std::size_t i = 0; i < bodies.size(); ++i) {
            const std::size_t size = sealer.record_size(head(i).size() + bodies[i].size());
            // Cannot fail: sizes and the closed state were checked above.
            throw_if_error(
                sealer.seal(head(i), bodies[i], std::span(write_buffer_).subspan(offset, size)),
                "hivemesh::net::secure_stream::write");
            offset += size;
        }
        co_return co_await send(total);
    }

    /// Sends one message as one record; see write(std::span<const byte_view>).
    asio::awaitable<std::error_code> write(byte_view message) {
        co_return co_await write(std::span<const byte_view>(&message, 1));
    }

    /// Waits for the next message. On success `message` views its payload inside our read
    /// buffer, valid until the next read(). Completes with asio::error::eof once the peer
    /// has sent its close record (after shutdown()), connection_truncated if the byte
    /// stream ends without one, authentication_failed / protocol_violation /
    /// message_too_large for a bad record (refused before anything is allocated for it),
    /// or the transport's error. Every error is sticky. Cancel with close().
    asio::awaitable<std::error_code> read(byte_view& message) {
        message = {};
        if (!usable()) co_return read_error_;
        if (read_error_) co_return read_error_;
        std::size_t record_size = 0;
        auto ec = co_await next_record_size(record_size);
        if (!ec) ec = co_await fill_record(record_size);
        if (ec) co_return fail_read(ec);
        co_return open_buffered(record_size, message);
    }

    /// Waits until bytes of the next message are here, holding no read buffer meanwhile
    /// (unless it has grown past released_buffer_size); read() then takes the message. A
    /// reader that is idle most of the time (a multiplexer) waits here, in one shallow
    /// call, rather than inside read(). Ends the previous message's view. Errors as read().
    asio::awaitable<std::error_code> wait() {
        if (!usable()) co_return read_error_;
        if (read_error_) co_return read_error_;
        if (!release_if_idle()) co_return std::error_code{};
        std::error_code ec;
        take_idle(co_await read_idle(ec), 1);
        if (ec == asio::error::eof) ec = errc::connection_truncated;
        co_return ec ? fail_read(ec) : ec;
    }

    /// As read(), but the payload of a large plaintext record may bypass the read buffer:
    /// when at least min_placed_size bytes of a record are still to come and its first
    /// `head_size` payload bytes are here, `place(head, rest)` is called with them and the
    /// size of the rest of the payload. A span it returns (of exactly `rest` bytes, valid
    /// until completion) receives the rest straight from the stream: `message` then views
    /// the head only, and `placed` is `rest`. Otherwise (an empty span, an encrypted
    /// session, whose records are authenticated whole, or a small or buffered record) this
    /// is read() and `placed` is 0. Errors as read().
    template <class Place>
    asio::awaitable<std::error_code> read(byte_view& message, std::size_t head_size, Place& place,
                                          std::size_t& placed) {
        message = {};
        placed = 0;
        if (!usable()) co_return read_error_;
        if (read_error_) co_return read_error_;
        constexpr std::size_t header_size = crypto::record_opener::header_size;
        auto& opener = session_->opener;
        std::size_t record_size = 0;
        auto ec = co_await next_record_size(record_size);
        if (ec) co_return fail_read(ec);
        const std::size_t prefix_size = header_size + 1 + head_size;
        if (opener.suite() != crypto::cipher::plaintext || record_size <= prefix_size ||
            record_size < buffered().size() + min_placed_size) {
            if (auto error = co_await fill_record(record_size)) co_return fail_read(error);
            co_return open_buffered(record_size, message);
        }
        ec = co_await fill_record(prefix_size);
        if (ec) co_return fail_read(ec);
        crypto::record_type type{};
        std::span<std::byte> head;
        ec = opener.open_prefix(std::span(read_buffer_).subspan(read_begin_, prefix_size),
                                record_size, type, head);
        if (ec) co_return fail_read(ec);
        const std::size_t rest = record_size - prefix_size;
        const std::span<std::byte> target = place(byte_view(head), rest);
        if (target.empty()) { // declined: the record goes through the buffer, opened already
            if (auto error = co_await fill_record(record_size)) co_return fail_read(error);
            message = byte_view(read_buffer_)
                          .subspan(read_begin_ + header_size + 1, record_size - header_size - 1);
            consume(record_size);
            co_return std::error_code{};
        }
        if (target.size() != rest)
            throw std::logic_error("hivemesh::net::secure_stream::read: a placement must span "
                                   "exactly the rest of the payload");
        // What is buffered of the rest moves over. If more is to come, the (small) prefix
        // moves to the front of the buffer and the bytes after this record land behind it,
        // in one scatter read with the rest: a bulk transfer takes one syscall a record.
        std::size_t got = std::min(rest, read_end_ - read_begin_ - prefix_size);
        if (got > 0)
            std::memcpy(target.data(), read_buffer_.data() + read_begin_ + prefix_size, got);
        if (got < rest) {
            std::memmove(read_buffer_.data(), read_buffer_.data() + read_begin_, prefix_size);
            head = std::span(read_buffer_).subspan(header_size + 1, head_size);
            read_begin_ = read_end_ = prefix_size;
        } else {
            read_begin_ += prefix_size + got;
        }
        while (got < rest) {
            const std::array<asio::mutable_buffer, 2> buffers{
                asio::buffer(target.data() + got, rest - got),
                asio::buffer(read_buffer_.data() + read_end_, read_buffer_.size() - read_end_)};
            std::error_code error;
            const std::size_t n = co_await stream_.async_read_some(
                buffers, asio::redirect_error(asio::use_awaitable, error));
            const std::size_t into_target = std::min(n, rest - got);
            got += into_target;
            read_end_ += n - into_target;
            if (error == asio::error::eof) error = errc::connection_truncated;
            if (error) co_return fail_read(error);
        }
        message = head;
        placed = rest;
        co_return std::error_code{};
    }

    /// read() with placement reads records bypassing the buffer only when at least this
    /// many of their bytes are still to come: below it, one buffered read is cheaper.
    static constexpr std::size_t min_placed_size = 16 * 1024;

    /// Sends the close record, after which the peer's read() reports asio::error::eof and
    /// our write() fails with connection_closed. Does not close the stream: call close()
    /// when done reading. A second call does nothing. Errors: the transport's.
    asio::awaitable<std::error_code> shutdown() {
        if (!usable()) co_return write_error_;
        if (write_error_) co_return write_error_;
        auto& sealer = session_->sealer;
        if (sealer.closed()) co_return std::error_code{};
        const std::size_t size = sealer.record_size(0);
        if (write_buffer_.size() < size) write_buffer_.resize(size);
        throw_if_error(sealer.seal_close(std::span(write_buffer_).first(size)),
                       "hivemesh::net::secure_stream::shutdown");
        co_return co_await send(size);
    }

    /// Closes the underlying stream now; pending operations complete with an error.
    void close() noexcept {
        std::error_code ignored;
        stream_.close(ignored);
    }

    Stream& next_layer() noexcept { return stream_; }
    const Stream& next_layer() const noexcept { return stream_; }
    executor_type get_executor() noexcept { return stream_.get_executor(); }

private:
    enum class state { fresh, handshaking, established, failed };

    asio::awaitable<std::error_code> run_handshake(crypto::role r, const crypto::identity& self,
                                                   std::optional<crypto::peer_id> expected,
                                                   const crypto::secure_options& options,
                                                   crypto::resumption resume) {
        crypto::handshake exchange(self, r, options, expected, std::move(resume));
        byte_buffer outgoing;
        auto ec = exchange.start(outgoing);
        if (!ec && !outgoing.empty()) ec = co_await write_frame(outgoing);
        while (!ec && !exchange.done()) {
            byte_view incoming;
            ec = co_await read_frame(incoming);
            if (!ec) ec = exchange.on_message(incoming, outgoing);
            if (!ec && !outgoing.empty()) ec = co_await write_frame(outgoing);
        }
        if (ec == asio::error::eof) ec = errc::connection_closed;
        if (!ec) session_.emplace(exchange.result());
        co_return ec;
    }

    asio::awaitable<std::error_code> write_frame(byte_view message) {
        const std::size_t size = crypto::record_opener::header_size + message.size();
        if (write_buffer_.size() < size) write_buffer_.resize(size);
        store_le32(write_buffer_.data(), static_cast<std::uint32_t>(message.size()));
        std::memcpy(write_buffer_.data() + crypto::record_opener::header_size, message.data(),
                    message.size());
        co_return co_await send(size);
    }

    // The frame's length is checked before anything is read or allocated for it.
    asio::awaitable<std::error_code> read_frame(byte_view& message) {
        constexpr std::size_t header = crypto::record_opener::header_size;
        auto ec = co_await fill(header);
        if (ec) co_return ec;
        const std::uint32_t length = load_le32(read_buffer_.data() + read_begin_);
        if (length == 0 || length > crypto::handshake::max_message_size)
            co_return errc::handshake_failed;
        ec = co_await fill(header + length);
        if (ec) co_return ec;
        message = byte_view(read_buffer_).subspan(read_begin_ + header, length);
        consume(header + length);
        co_return std::error_code{};
    }

    /// Plaintext records need no sealing: only their prefixes and the (small) heads are
    /// copied, the bodies go out from where they are in one gather write.
    asio::awaitable<std::error_code> write_plaintext(std::span<const byte_view> heads,
                                                     std::span<const byte_view> bodies) {
        constexpr std::size_t prefix_size = crypto::record_sealer::payload_offset;
        auto& sealer = session_->sealer;
        std::size_t front_bytes = 0;
        for (std::size_t i = 0; i < bodies.size(); ++i)
            front_bytes += prefix_size + (heads.empty() ? 0 : heads[i].size());
        if (write_buffer_.size() < front_bytes) write_buffer_.resize(front_bytes);
        gather_.clear();
        std::size_t offset = 0;
        for (std::size_t i = 0; i < bodies.size(); ++i) {
            const byte_view head = heads.empty() ? byte_view() : heads[i];
            const auto front = std::span(write_buffer_).subspan(offset, prefix_size + head.size());
            // Cannot fail: sizes and the closed state were checked by write().
            throw_if_error(sealer.seal_plaintext_prefix(head.size() + bodies[i].size(),
                                                        front.first(prefix_size)),
                           "hivemesh::net::secure_stream::write");
            if (!head.empty()) std::memcpy(front.data() + prefix_size, head.data(), head.size());
            gather_.emplace_back(front.data(), front.size());
            if (!bodies[i].empty()) gather_.emplace_back(bodies[i].data(), bodies[i].size());
            offset += front.size();
        }
        co_return co_await send_buffers(gather_);
    }

    asio::awaitable<std::error_code> send(std::size_t size) {
        const auto bytes = asio::buffer(write_buffer_.data(), size); // named: CONTRIBUTING.md
        co_return co_await send_buffers(bytes);
    }

    /// Writes all of `buffers`; a failure sticks. Then a small write buffer is released,
    /// as the read buffer is when idle.
    template <class ConstBufferSequence>
    asio::awaitable<std::error_code> send_buffers(const ConstBufferSequence& buffers) {
        std::error_code ec;
        co_await asio::async_write(stream_, buffers, transfer_all_uncapped{},
                                   asio::redirect_error(asio::use_awaitable, ec));
        if (ec) write_error_ = ec;
        if (write_buffer_.size() <= released_buffer_size) release(write_buffer_);
        co_return ec;
    }

    static void release(byte_buffer& buffer) noexcept { byte_buffer().swap(buffer); }

    /// The size of the next record (header included), reading its header if need be.
    asio::awaitable<std::error_code> next_record_size(std::size_t& record_size) {
        auto& opener = session_->opener;
        auto ec = opener.peek(buffered(), record_size);
        if (!ec && record_size == 0) {
            ec = co_await fill_record(crypto::record_opener::header_size);
            if (!ec) ec = opener.peek(buffered(), record_size);
        }
        co_return ec;
    }

    /// Opens the buffered record of `record_size` bytes at the read position.
    std::error_code open_buffered(std::size_t record_size, byte_view& message) {
        crypto::record_type type{};
        std::span<std::byte> payload;
        const auto ec = session_->opener.open(
            std::span(read_buffer_).subspan(read_begin_, record_size), type, payload);
        if (ec) return fail_read(ec);
        consume(record_size);
        if (type == crypto::record_type::close) return fail_read(asio::error::eof);
        message = payload;
        return {};
    }

    /// fill() for a record: the stream ending inside one is connection_truncated.
    asio::awaitable<std::error_code> fill_record(std::size_t needed) {
        const auto ec = co_await fill(needed);
        co_return ec == asio::error::eof ? make_error_code(errc::connection_truncated) : ec;
    }

    /// Makes at least `needed` unread bytes available, reading as much as the buffer holds.
    asio::awaitable<std::error_code> fill(std::size_t needed) {
        if (read_end_ - read_begin_ >= needed) co_return std::error_code{};
        if (release_if_idle()) {
            std::error_code ec;
            take_idle(co_await read_idle(ec), needed);
            if (ec) co_return ec;
            if (read_end_ >= needed) co_return std::error_code{};
        }
        if (read_buffer_.size() - read_begin_ < needed) {
            // No room behind the unread bytes: move them to the front, grow if still short.
            if (read_end_ > read_begin_)
                std::memmove(read_buffer_.data(), read_buffer_.data() + read_begin_,
                             read_end_ - read_begin_);
            read_end_ -= read_begin_;
            read_begin_ = 0;
            const std::size_t wanted =
                needed > read_chunk_size / 4 ? std::min(4 * needed, max_read_buffer_size) : 0;
            if (read_buffer_.size() < std::max(needed, wanted))
                read_buffer_.resize(std::max({needed, wanted, read_chunk_size}));
        }
        while (read_end_ - read_begin_ < needed) {
            std::error_code ec;
            const std::size_t n = co_await stream_.async_read_some(
                asio::buffer(read_buffer_.data() + read_end_, read_buffer_.size() - read_end_),
                asio::redirect_error(asio::use_awaitable, ec));
            read_end_ += n;
            if (ec) co_return ec;
        }
        co_return std::error_code{};
    }

    /// If nothing is buffered and the buffer is small enough to give back, releases it
    /// (ending the previous message's view, as the next read() may) and returns true.
    bool release_if_idle() noexcept {
        if (read_end_ != read_begin_ || read_buffer_.size() > released_buffer_size) return false;
        release(read_buffer_);
        read_begin_ = read_end_ = 0;
        return true;
    }

    /// A read into idle_bytes_ (an operation to co_await, not a coroutine: no frame).
    auto read_idle(std::error_code& ec) {
        return stream_.async_read_some(asio::buffer(idle_bytes_),
                                       asio::redirect_error(asio::use_awaitable, ec));
    }

    /// The `n` bytes an idle read left in idle_bytes_ move into a new read buffer.
    void take_idle(std::size_t n, std::size_t needed) {
        if (n == 0) return;
        read_buffer_.resize(std::max({needed, n, read_chunk_size}));
        std::memcpy(read_buffer_.data(), idle_bytes_.data(), n);
        read_end_ = n;
    }

    byte_view buffered() const noexcept {
        return byte_view(read_buffer_).subspan(read_begin_, read_end_ - read_begin_);
    }

    // The consumed bytes stay in place until the next fill(), so views into them survive.
    void consume(std::size_t size) noexcept {
        read_begin_ += size;
        if (read_begin_ == read_end_) read_begin_ = read_end_ = 0;
    }

    std::error_code fail_read(std::error_code ec) noexcept {
        read_error_ = ec;
        return ec;
    }

    /// False after a failed handshake (the error is in read_error_ / write_error_);
    /// throws before a handshake.
    bool usable() const {
        if (state_ == state::failed) return false;
        require_established();
        return true;
    }

    void require_established() const {
        if (state_ != state::established)
            throw std::logic_error(
                "hivemesh::net::secure_stream: call handshake() and wait for it to succeed first");
    }

    Stream stream_;
    state state_ = state::fresh;
    std::optional<crypto::secure_session> session_;
    std::array<std::byte, idle_read_size> idle_bytes_;
    byte_buffer read_buffer_;
    std::size_t read_begin_ = 0;
    std::size_t read_end_ = 0;
    byte_buffer write_buffer_;
    std::vector<asio::const_buffer> gather_; ///< a plaintext write's pieces
    std::error_code read_error_;
    std::error_code write_error_;
};

} // namespace hivemesh::net
