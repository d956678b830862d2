// An in-memory record channel pair for multiplexer tests: records written on one end are
// read, in order, on the other. Everything runs on one io_context thread.
#pragma once

#include <hivemesh/net/mux.hpp>

#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <algorithm>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

namespace hivemesh::test {

class memory_channel final : public net::detail::record_channel {
public:
    struct shared_state {
        explicit shared_state(const asio::any_io_executor& ex)
            : wake{wakeup(ex), wakeup(ex)} {}
        std::deque<byte_buffer> queues[2]; ///< records waiting to be read by side i
        wakeup wake[2];
        bool closed = false;
        std::size_t bytes_written[2] = {0, 0}; ///< by side i
    };

    memory_channel(std::shared_ptr<shared_state> state, int side)
        : state_(std::move(state))
        , side_(side) {}

    /// Two connected ends.
    static std::pair<std::unique_ptr<memory_channel>, std::unique_ptr<memory_channel>>
    make_pair(const asio::any_io_executor& ex) {
        auto state = std::make_shared<shared_state>(ex);
        return {std::make_unique<memory_channel>(state, 0),
                std::make_unique<memory_channel>(state, 1)};
    }

    asio::awaitable<std::error_code> write(std::span<const byte_view> heads,
                                           std::span<const byte_view> bodies) override {
        if (state_->closed) co_return make_error_code(errc::connection_closed);
        std::vector<byte_buffer> records;
        const auto copy = [&] {
            for (std::size_t i = 0; i < bodies.size(); ++i) {
                byte_buffer record(heads[i].begin(), heads[i].end());
                record.insert(record.end(), bodies[i].begin(), bodies[i].end());
                records.push_back(std::move(record));
            }
        };
        if (!gather_writes) copy();
        if (holding) {
            ++writes_held;
            const auto executor = co_await asio::this_coro::executor;
            while (holding && !state_->closed) {
                asio::steady_timer pause(executor, std::chrono::microseconds(100));
                co_await pause.async_wait(asio::use_awaitable);
            }
            if (state_->closed) co_return make_error_code(errc::connection_closed);
        }
        if (gather_writes) copy();
        for (auto& record : records) {
            state_->bytes_written[side_] += record.size();
            state_->queues[1 - side_].push_back(std::move(record));
        }
        state_->wake[1 - side_].notify();
        co_return std::error_code{};
    }

    /// Writes wait while `holding` is set (as a socket write waits for room), reading the
    /// bodies only once it is cleared when `gather_writes` is set (as a gather write
    /// straight from them does), else before they wait (as sealing into a buffer does).
    bool holding = false;
    bool gather_writes = false;
    std::size_t writes_held = 0; ///< writes that had to wait
    bool reads_bodies_while_pending() const noexcept override { return gather_writes; }

    asio::awaitable<std::error_code> read(byte_view& record) override {
        auto& queue = state_->queues[side_];
        while (queue.empty()) {
            if (state_->closed) co_return make_error_code(errc::connection_closed);
            if (auto ec = co_await state_->wake[side_].wait()) co_return ec;
        }
        current_ = std::move(queue.front());
        queue.pop_front();
        record = current_;
        co_return std::error_code{};
    }

    /// With `placing` set, every record longer than the head is offered to `place`, as a
    /// plaintext secure stream offers large ones; the rest is copied into the span it
    /// returns after a turn of the event loop, as a socket read would complete later.
    asio::awaitable<std::error_code> read_placed(byte_view& record, std::size_t head_size,
                                                 const placement& place,
                                                 std::size_t& placed) override {
        placed = 0;
        if (auto ec = co_await read(record)) co_return ec;
        if (!placing || record.size() <= head_size) co_return std::error_code{};
        const std::size_t rest = record.size() - head_size;
        const std::span<std::byte> target = place(record.first(head_size), rest);
        if (target.empty()) co_return std::error_code{};
        ++placements;
        if (on_placed) on_placed();
        const auto executor = co_await asio::this_coro::executor;
        co_await asio::post(executor, asio::use_awaitable);
        if (state_->closed) co_return make_error_code(errc::connection_closed);
        std::copy(record.begin() + static_cast<std::ptrdiff_t>(head_size), record.end(),
                  target.begin());
        record = record.first(head_size);
        placed = rest;
        co_return std::error_code{};
    }

    bool placing = false;            ///< offer records to read_placed()'s placement
    std::size_t placements = 0;      ///< records whose rest went to a placement
    std::function<void()> on_placed; ///< called when a placement is taken, before the copy

    /// What the multiplexer's window growth reads (a zero round trip keeps windows fixed).
    duration round_trip{};
    time_point clock{};
    duration round_trip_time() noexcept override { return round_trip; }
    time_point now() noexcept override { return clock; }

    void close() noexcept override {
        state_->closed = true;
        state_->wake[0].notify();
        state_->wake[1].notify();
    }

    std::shared_ptr<shared_state> state() const { return state_; }

private:
    std::shared_ptr<shared_state> state_;
    int side_;
    byte_buffer current_;
};

} // namespace hivemesh::test
