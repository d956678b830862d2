// How hivemesh starts its asynchronous operations, their default completion token, and the
// executor questions every layer asks. One policy for every operation started with co_launch():
//   - cancellation through the completion handler's slot is reported as errc::cancelled;
//   - an exception escaping the operation (a bug, std::bad_alloc) is logged once and
//     reported as errc::internal_error;
//   - every other result is passed through as the operation returned it.
#pragma once

#include "hivemesh/core/config.hpp"
#include "hivemesh/core/error.hpp"
#include "hivemesh/core/fifo.hpp"
#include "hivemesh/core/log.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/associated_cancellation_slot.hpp>
#include <asio/associated_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/awaitable.hpp>
#include <asio/bind_cancellation_slot.hpp>
#include <asio/co_spawn.hpp>
#include <asio/dispatch.hpp>
#include <asio/error.hpp>
#include <asio/execution/outstanding_work.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/channel.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/require.hpp>
#include <asio/strand.hpp>
#include <asio/thread_pool.hpp>
#include <asio/use_awaitable.hpp>

#include <exception>
#include <memory>
#include <optional>
#include <system_error>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>

namespace hivemesh {

/// The completion token of every hivemesh operation called without one: inside a
/// coroutine, `auto [ec, value] = co_await op(args...)`, the error returned as a value and
/// never thrown. Any other Asio token (a callback, asio::use_future, asio::deferred) may be
/// passed instead.
using default_token_t = asio::experimental::as_tuple_t<asio::use_awaitable_t<>>;

/// The error code an exception that escaped `operation` becomes under the policy above:
/// errc::cancelled for a cancellation (operation_aborted), else errc::internal_error, with
/// the exception logged.
HIVEMESH_DECL std::error_code escaped_exception_code(const std::exception_ptr& failure,
                                                     const char* operation);

/// The result of an operation that failed with `ec`: `ec` itself for a Result of
/// std::error_code; for a pair or tuple whose first member is the error code, `ec` and
/// value-initialised values.
template <class Result>
Result failed_result(std::error_code ec) {
    if constexpr (std::is_same_v<Result, std::error_code>)
        return ec;
    else {
        Result out{};
        std::get<0>(out) = ec;
        return out;
    }
}

namespace detail {

/// Calls `handler` with the operation's result: an error_code alone, or the members of a
/// pair or tuple whose first member is the error code.
template <class Handler, class Result>
void complete_with(Handler& handler, Result&& result) {
    if constexpr (std::is_same_v<std::decay_t<Result>, std::error_code>)
        std::move(handler)(result);
    else
        std::apply([&](auto&&... values) { std::move(handler)(std::move(values)...); },
                   std::forward<Result>(result));
}

/// Completes `handler` with what the coroutine gave: its result, or under the policy above
/// the code of the exception that escaped it.
template <class Handler, class Result>
void complete_launch(Handler& handler, std::exception_ptr failure, Result result,
                     const char* operation) {
    if (failure) result = failed_result<Result>(escaped_exception_code(failure, operation));
    complete_with(handler, std::move(result));
}

} // namespace detail

/// Runs the coroutine `work` on `executor` and completes `handler` with its result:
/// `handler(ec)` for an awaitable<std::error_code>, `handler(ec, values...)` for an
/// awaitable of a std::pair or std::tuple whose first member is the error code.
/// The handler's cancellation slot becomes the coroutine's, so emitting it cancels what the
/// coroutine awaits. An exception escaping `work` follows the policy at the top of this
/// file; `operation` names it in the log.
template <class Result, class Handler>
void co_launch(const asio::any_io_executor& executor, asio::awaitable<Result> work, Handler handler,
               const char* operation) {
    auto slot = asio::get_associated_cancellation_slot(handler);
    asio::co_spawn(
        executor, std::move(work),
        asio::bind_cancellation_slot(slot, [handler = std::move(handler), operation](
                                               std::exception_ptr failure, Result result) mutable {
            detail::complete_launch(handler, failure, std::move(result), operation);
        }));
}

/// The same for an operation that stops through its own means: emitting the handler's
/// cancellation slot calls `on_cancel()`, which must make `work` end soon (reporting
/// errc::cancelled itself); the slot is cleared before the handler runs.
template <class Result, class Handler, class OnCancel>
void co_launch(const asio::any_io_executor& executor, asio::awaitable<Result> work, Handler handler,
               const char* operation, OnCancel on_cancel) {
    auto slot = asio::get_associated_cancellation_slot(handler);
    if (slot.is_connected())
        slot.assign(
            [on_cancel = std::move(on_cancel)](asio::cancellation_type) mutable { on_cancel(); });
    asio::co_spawn(executor, std::move(work),
                   [handler = std::move(handler), slot, operation](std::exception_ptr failure,
                                                                   Result result) mutable {
                       if (slot.is_connected()) slot.clear();
                       detail::complete_launch(handler, failure, std::move(result), operation);
                   });
}

namespace detail {

/// `Executor` with outstanding work tracked, as any_io_executor may hold it.
template <class Executor>
using tracked_executor_t = std::decay_t<decltype(asio::require(
    std::declval<Executor>(), asio::execution::outstanding_work.tracked))>;

template <class Executor>
bool runs_here(const asio::any_io_executor& ex) {
#if !defined(ASIO_NO_TYPEID)
    // Asio 1.22's target<T>() casts without comparing types: compare them first.
    if (ex.target_type() != typeid(Executor)) return false;
    return ex.target<Executor>()->running_in_this_thread();
#else
    return false; // without RTTI the executor's type cannot be told
#endif
}

template <class Executor>
bool runs_here_or_on_strand(const asio::any_io_executor& ex) {
    return runs_here<Executor>(ex) || runs_here<asio::strand<Executor>>(ex);
}

} // namespace detail

/// True if the calling thread is running `ex`: an io_context or thread_pool executor (with
/// or without outstanding work tracking), a strand of one, or a strand of an
/// any_io_executor. False for any other kind of executor, which cannot be asked, and
/// always false without RTTI (ASIO_NO_TYPEID).
HIVEMESH_DECL bool running_in_this_thread(const asio::any_io_executor& ex);

/// Wakes one waiting coroutine; a notification while nobody waits is kept (once).
class wakeup {
public:
    HIVEMESH_DECL explicit wakeup(const asio::any_io_executor& ex);
    HIVEMESH_DECL void notify();
    /// Completes on notify(); with an error if the awaiting operation was cancelled.
    HIVEMESH_DECL asio::awaitable<std::error_code> wait();

private:
    /// The channel's traits with a buffer that allocates nothing until used: Asio's default
    /// (std::deque) allocates about 600 bytes per channel, and every connection and call
    /// stream holds wakeups.
    template <class... Signatures>
    struct traits : asio::experimental::channel_traits<Signatures...> {
        template <class... Others>
        struct rebind {
            using other = traits<Others...>;
        };
        template <class Element>
        struct container {
            using type = fifo<Element>;
        };
    };
    // Asio 1.22's channel needs a value besides the error code.
    asio::experimental::basic_channel<asio::any_io_executor, traits<>, void(std::error_code, bool)>
        channel_;
};

template <class Signature>
class erased_handler;

/// A move-only completion handler that holds any handler of the signature void(Args...), so
/// that the code which starts an operation need not be a template on the handler type and
/// can be compiled once (the compiled mode). It keeps what Asio associates with the handler
/// it holds: the cancellation slot is this handler's own, and the held handler runs on its
/// associated executor (the `fallback` given at construction if it has none), which is kept
/// busy until then. The associated allocator is not kept: the holder is allocated with new.
/// Invoking an empty erased_handler (moved from) is undefined.
template <class... Args>
class erased_handler<void(Args...)> {
public:
    using cancellation_slot_type = asio::cancellation_slot;

    template <class Handler>
    erased_handler(Handler handler, const asio::any_io_executor& fallback)
        : slot_(asio::get_associated_cancellation_slot(handler))
        , held_(std::make_unique<holder<Handler>>(std::move(handler), fallback)) {}

    erased_handler(erased_handler&&) noexcept = default;
    erased_handler& operator=(erased_handler&&) noexcept = default;

    cancellation_slot_type get_cancellation_slot() const noexcept { return slot_; }

    void operator()(Args... args) {
        auto held = std::move(held_);
        held->complete(std::move(args)...);
    }

private:
    struct base {
        virtual ~base() = default;
        virtual void complete(Args... args) = 0;
    };

    template <class Handler>
    struct holder final : base {
        holder(Handler h, const asio::any_io_executor& fallback)
            : work(asio::make_work_guard(asio::get_associated_executor(h, fallback)))
            , handler(std::move(h)) {}

        void complete(Args... args) override {
            auto ex = work.get_executor();
            asio::dispatch(ex, [work = std::move(work), handler = std::move(handler),
                                ... args = std::move(args)]() mutable {
                std::move(handler)(std::move(args)...);
            });
        }

        asio::executor_work_guard<asio::associated_executor_t<Handler, asio::any_io_executor>> work;
        Handler handler;
    };

    asio::cancellation_slot slot_;
    std::unique_ptr<base> held_;
};

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

} // namespace hivemesh

#if !defined(HIVEMESH_SEPARATE_COMPILATION)
#include "hivemesh/core/impl/async.ipp"
#endif
