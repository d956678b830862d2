// A node's rate caps (node_options::max_upload_rate, max_download_rate): one token bucket a
// direction, shared by all the node's connections, applied to the byte streams under the
// secure sessions. So one implementation covers TCP and the simulated network, and the
// bytes counted are the bytes on the stream (handshakes, record prefixes and tags too).
//
// A bucket holds up to `burst` bytes and refills at `rate` bytes per second. Writes take
// their bytes before they go out and wait until the bucket has them; reads take theirs when
// they complete and hand the bytes on only once the bucket has them, so a capped reader
// leaves data in the transport and its flow control (TCP's window, the simulated send
// buffer) slows the sender. A read or write moves at most `burst` bytes, so the bytes
// written, and the bytes reads hand on, in any window of length T stay within
// rate x T + burst. Waits run on the transport's timer (virtual time on the simulated
// network) and end at once, with operation_aborted, when the stream is closed.
#pragma once

#include "hivemesh/core/clock.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/buffer.hpp>
#include <asio/compose.hpp>
#include <asio/error.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <system_error>
#include <type_traits>
#include <utility>

namespace hivemesh::net {

/// Whether `rate` (bytes per second) can cap a node: 0 (no cap) or a finite number of at
/// least 1 byte per second.
inline bool is_valid_rate_limit(double rate) noexcept {
    return rate == 0 || (std::isfinite(rate) && rate >= 1);
}

/// The burst a cap of `rate` bytes per second allows: 50 ms at the cap, at least 64 KiB
/// (about a TCP window's worth, so slow caps still move data in useful pieces) and at most
/// 64 MiB. The bytes moved in any window of length T stay within rate x T + burst.
inline std::size_t rate_limit_burst(double rate) noexcept {
    constexpr double least = 64 * 1024, most = 64 * 1024 * 1024;
    return static_cast<std::size_t>(std::ceil(std::clamp(rate / 20, least, most)));
}

namespace detail {

/// A token bucket that schedules rather than refuses: take() says when the bytes may be
/// used, and takes are served in the order they come. It is kept as the time at which it
/// would be full again (the generic cell rate algorithm), so it needs no refill ticks.
/// Times are nanoseconds of any monotonic clock. Not thread-safe: a node's connections
/// share one on the node's executor.
class token_bucket {
public:
    /// `rate` in bytes per second (see is_valid_rate_limit; above 0), `burst` in bytes.
    token_bucket(double rate, std::size_t burst)
        : rate_(rate)
        , burst_(burst)
        , burst_time_(cost(burst)) {}

    double rate() const noexcept { return rate_; }
    std::size_t burst() const noexcept { return burst_; }

    /// Takes `bytes` (at most burst()) as of `now` and returns how long the caller must wait
    /// before it uses them. The bucket starts full.
    duration take(duration now, std::size_t bytes) noexcept {
        const duration start = std::max(full_at_, now);
        const duration price = cost(bytes);
        const duration wait = std::max(start + price - burst_time_ - now, duration::zero());
        full_at_ = start + price;
        if (wait > duration::zero()) {
            delayed_bytes_ += bytes;
            delay_ += wait;
        }
        return wait;
    }

    /// Returns what a take() of `taken` bytes did not use: only `used` of them went out
    /// (a partial write, or none when it was cancelled).
    void give_back(std::size_t taken, std::size_t used) noexcept {
        full_at_ -= cost(taken) - cost(std::min(used, taken));
    }

    /// Bytes of the takes that had to wait, and their waits summed.
    std::uint64_t delayed_bytes() const noexcept { return delayed_bytes_; }
    duration delay() const noexcept { return delay_; }

private:
    /// The time `bytes` take at the rate, rounded up so that the cap is never exceeded.
    duration cost(std::size_t bytes) const noexcept {
        return duration(
            static_cast<duration::rep>(std::ceil(static_cast<double>(bytes) * 1e9 / rate_)));
    }

    double rate_;
    std::size_t burst_;
    duration burst_time_;
    duration full_at_{}; ///< the clock's epoch: full from the start
    std::uint64_t delayed_bytes_ = 0;
    duration delay_{};
};

/// The monotonic time of `Timer`'s clock, the buckets' time: virtual on the simulated
/// network (whose clock is made from the executor), steady_clock for Asio's steady_timer.
template <class Timer>
duration timer_now(const asio::any_io_executor& executor) {
    using clock = typename Timer::clock_type;
    if constexpr (std::is_constructible_v<clock, asio::any_io_executor>)
        return clock(executor).now().time_since_epoch();
    else
        return std::chrono::duration_cast<duration>(clock::now().time_since_epoch());
}

/// A bucket for a cap of `rate` bytes per second, or none for 0 (no cap).
inline std::shared_ptr<token_bucket> make_bucket(double rate) {
    if (rate == 0) return nullptr;
    return std::make_shared<token_bucket>(rate, rate_limit_burst(rate));
}

/// The first `limit` bytes of a buffer sequence, in at most 16 buffers (a read_some or a
/// write_some may move less than it is given anyway). Holds its buffers by value, so that
/// the operation it is given to may copy it.
template <class Buffer>
class buffer_prefix {
public:
    template <class Sequence>
    buffer_prefix(const Sequence& sequence, std::size_t limit) {
        const auto end = asio::buffer_sequence_end(sequence);
        for (auto it = asio::buffer_sequence_begin(sequence);
             it != end && count_ < items_.size() && size_ < limit; ++it) {
            const Buffer buffer(*it);
            if (buffer.size() == 0) continue;
            items_[count_++] = Buffer(buffer.data(), std::min(buffer.size(), limit - size_));
            size_ += items_[count_ - 1].size();
        }
    }

    const Buffer* begin() const noexcept { return items_.data(); }
    const Buffer* end() const noexcept { return items_.data() + count_; }
    std::size_t size() const noexcept { return size_; }

private:
    std::array<Buffer, 16> items_{};
    std::size_t count_ = 0;
    std::size_t size_ = 0;
};

/// A byte stream whose writes draw on `upload` and whose reads draw on `download` (either
/// may be null: no cap that way); see the top of this file. Meets what secure_stream asks
/// of its stream. `Timer` is the transport's timer type. Like a socket, it allows one read
/// and one write at a time, and must not move while an operation is pending.
template <class Stream, class Timer>
class throttled_stream {
public:
    using executor_type = typename Stream::executor_type;

    throttled_stream(Stream stream, std::shared_ptr<token_bucket> upload,
                     std::shared_ptr<token_bucket> download)
        : stream_(std::move(stream))
        , upload_(std::move(upload))
        , download_(std::move(download)) {
        if (download_) read_timer_.emplace(stream_.get_executor());
        if (upload_) write_timer_.emplace(stream_.get_executor());
    }

    executor_type get_executor() noexcept { return stream_.get_executor(); }
    /// The stream under the caps.
    Stream& next_layer() noexcept { return stream_; }

    /// Closes the stream; a read or write waiting for the bucket ends with operation_aborted.
    void close(std::error_code& ec) {
        closed_ = true;
        if (read_timer_) read_timer_->cancel();
        if (write_timer_) write_timer_->cancel();
        stream_.close(ec);
    }

    /// As Stream's. With a download cap, reads at most a burst and completes once the
    /// bucket has paid for what it read. Completion: void(std::error_code, std::size_t);
    /// operation_aborted (with the bytes read) when closed or cancelled while it waits.
    template <class MutableBufferSequence, class Token>
    auto async_read_some(const MutableBufferSequence& buffers, Token&& token) {
        return asio::async_initiate<Token, void(std::error_code, std::size_t)>(
            [this](auto handler, const MutableBufferSequence& buffers) {
                if (!download_) {
                    stream_.async_read_some(buffers, std::move(handler));
                    return;
                }
                asio::async_compose<decltype(handler), void(std::error_code, std::size_t)>(
                    read_op(this, download_,
                            buffer_prefix<asio::mutable_buffer>(buffers, download_->burst())),
                    handler, stream_.get_executor());
            },
            token, buffers);
    }

    /// As Stream's. With an upload cap, writes at most a burst, once the bucket has it.
    /// Completion: void(std::error_code, std::size_t); operation_aborted (nothing written)
    /// when closed or cancelled while it waits.
    template <class ConstBufferSequence, class Token>
    auto async_write_some(const ConstBufferSequence& buffers, Token&& token) {
        return asio::async_initiate<Token, void(std::error_code, std::size_t)>(
            [this](auto handler, const ConstBufferSequence& buffers) {
                if (!upload_) {
                    stream_.async_write_some(buffers, std::move(handler));
                    return;
                }
                asio::async_compose<decltype(handler), void(std::error_code, std::size_t)>(
                    write_op(this, upload_,
                             buffer_prefix<asio::const_buffer>(buffers, upload_->burst())),
                    handler, stream_.get_executor());
            },
            token, buffers);
    }

private:
    enum class step { start, moving, paying };

    // An operation keeps its bucket: if the stream went away while it waited (its owner
    // destroyed), it must not reach the bucket through the stream.
    struct read_op {
        read_op(throttled_stream* stream, std::shared_ptr<token_bucket> b,
                buffer_prefix<asio::mutable_buffer> prefix)
            : self(stream)
            , bucket(std::move(b))
            , buffers(prefix) {}

        throttled_stream* self;
        std::shared_ptr<token_bucket> bucket;
        buffer_prefix<asio::mutable_buffer> buffers;
        step at = step::start;
        std::size_t bytes = 0;

        template <class Self>
        void operator()(Self& op, std::error_code ec = {}, std::size_t n = 0) {
            switch (at) {
            case step::start:
                at = step::moving;
                self->stream_.async_read_some(buffers, std::move(op));
                return;
            case step::moving: {
                if (ec || n == 0) return op.complete(ec, n);
                const duration wait = bucket->take(self->now(), n);
                if (wait <= duration::zero()) return op.complete(ec, n);
                at = step::paying;
                bytes = n;
                self->read_timer_->expires_after(wait);
                self->read_timer_->async_wait(std::move(op));
                return;
            }
            case step::paying: {
                // The bytes were read, but a closed or cancelled session will not use them.
                std::error_code result;
                if (ec || self->closed_) result = asio::error::operation_aborted;
                return op.complete(result, bytes);
            }
            }
        }
    };

    struct write_op {
        write_op(throttled_stream* stream, std::shared_ptr<token_bucket> b,
                 buffer_prefix<asio::const_buffer> prefix)
            : self(stream)
            , bucket(std::move(b))
            , buffers(prefix) {}

        throttled_stream* self;
        std::shared_ptr<token_bucket> bucket;
        buffer_prefix<asio::const_buffer> buffers;
        step at = step::start;

        template <class Self>
        void operator()(Self& op, std::error_code ec = {}, std::size_t n = 0) {
            switch (at) {
            case step::start: {
                const duration wait = buffers.size() == 0
                                          ? duration::zero()
                                          : bucket->take(self->now(), buffers.size());
                if (wait > duration::zero()) {
                    at = step::paying;
                    self->write_timer_->expires_after(wait);
                    self->write_timer_->async_wait(std::move(op));
                    return;
                }
                // Not completed here even when closed: never inside the initiation.
                at = step::moving;
                self->stream_.async_write_some(buffers, std::move(op));
                return;
            }
            case step::paying:
                if (ec || self->closed_) {
                    bucket->give_back(buffers.size(), 0);
                    return op.complete(std::error_code(asio::error::operation_aborted),
                                       std::size_t{0});
                }
                at = step::moving;
                self->stream_.async_write_some(buffers, std::move(op));
                return;
            case step::moving:
                bucket->give_back(buffers.size(), n);
                return op.complete(ec, n);
            }
        }
    };

    duration now() { return timer_now<Timer>(asio::any_io_executor(stream_.get_executor())); }

    Stream stream_;
    std::shared_ptr<token_bucket> upload_;
    std::shared_ptr<token_bucket> download_;
    // Only with a cap that way: most nodes have none, and a timer is 120 bytes.
    std::optional<Timer> read_timer_;
    std::optional<Timer> write_timer_;
    bool closed_ = false;
};

} // namespace detail

} // namespace hivemesh::net
