// How the averaging layer starts its asynchronous operations: a coroutine on the node's
// executor whose result completes the caller's handler, with the handler's cancellation slot
// wired to the operation.
#pragma once

#include "hivemesh/core/error.hpp"

#include <asio/associated_cancellation_slot.hpp>
#include <asio/awaitable.hpp>
#include <asio/bind_cancellation_slot.hpp>
#include <asio/co_spawn.hpp>

#include <exception>
#include <utility>

namespace hivemesh::averaging::detail {

/// Runs `work` on `executor` and completes `handler(error_code, Value)` with its result (an
/// escaped exception becomes remote_error). Emitting the handler's cancellation slot calls
/// `cancel()`, which must make `work` end soon; the slot is cleared before completion.
template <class Value, class Handler, class Cancel>
void launch(const asio::any_io_executor& executor,
            asio::awaitable<std::pair<std::error_code, Value>> work, Handler handler,
            Cancel cancel) {
    auto slot = asio::get_associated_cancellation_slot(handler);
    if (slot.is_connected())
        slot.assign([cancel = std::move(cancel)](asio::cancellation_type) mutable { cancel(); });
    asio::co_spawn(executor, std::move(work),
                   [handler = std::move(handler), slot](
                       std::exception_ptr failure, std::pair<std::error_code, Value> out) mutable {
                       if (slot.is_connected()) slot.clear();
                       if (failure) out = {make_error_code(errc::remote_error), Value{}};
                       std::move(handler)(out.first, std::move(out.second));
                   });
}

/// The same for a coroutine that cancels through what it awaits: the handler's slot becomes
/// the coroutine's, so cancellation reaches the operation it is waiting for.
template <class Value, class Handler>
void launch(const asio::any_io_executor& executor,
            asio::awaitable<std::pair<std::error_code, Value>> work, Handler handler) {
    auto slot = asio::get_associated_cancellation_slot(handler);
    asio::co_spawn(
        executor, std::move(work),
        asio::bind_cancellation_slot(
            slot, [handler = std::move(handler)](std::exception_ptr failure,
                                                 std::pair<std::error_code, Value> out) mutable {
                if (failure) out = {make_error_code(errc::cancelled), Value{}};
                std::move(handler)(out.first, std::move(out.second));
            }));
}

} // namespace hivemesh::averaging::detail
