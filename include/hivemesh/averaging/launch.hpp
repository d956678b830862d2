// How the averaging layer starts its asynchronous operations: a coroutine on the node's
// executor whose result completes the caller's handler, with the handler's cancellation slot
// wired to the operation; and how it moves CPU-heavy work off that executor.
#pragma once

#include "hivemesh/core/error.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/associated_cancellation_slot.hpp>
#include <asio/associated_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/awaitable.hpp>
#include <asio/bind_cancellation_slot.hpp>
#include <asio/co_spawn.hpp>
#include <asio/dispatch.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/post.hpp>
#include <asio/use_awaitable.hpp>

#include <exception>
#include <optional>
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

/// Runs `work` on `executor` and resumes on the awaiting coroutine's executor; without an
/// executor runs it inline. Rethrows what `work` throws.
template <class Work>
asio::awaitable<void> offload(const std::optional<asio::any_io_executor>& executor, Work& work) {
    if (!executor) {
        work();
        co_return;
    }
    std::exception_ptr failure;
    // A named initiation: g++ 12 destroys a lambda temporary with captures inside a co_await
    // expression twice (see CONTRIBUTING.md).
    auto initiation = [&work, &failure, ex = *executor](auto handler) {
        auto guard = asio::make_work_guard(asio::get_associated_executor(handler));
        asio::post(ex, [&work, &failure, handler = std::move(handler),
                        guard = std::move(guard)]() mutable {
            try {
                work();
            } catch (...) {
                failure = std::current_exception();
            }
            auto resume = guard.get_executor();
            asio::dispatch(resume, std::move(handler));
        });
    };
    co_await asio::async_initiate<decltype(asio::use_awaitable), void()>(initiation,
                                                                         asio::use_awaitable);
    if (failure) std::rethrow_exception(failure);
}

} // namespace hivemesh::averaging::detail
