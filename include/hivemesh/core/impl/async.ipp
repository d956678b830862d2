// The non-template functions of core/async.hpp: the exception policy, the io-thread check
// and wakeup's members.
#pragma once

#include "hivemesh/core/async.hpp"

namespace hivemesh {

HIVEMESH_DECL std::error_code escaped_exception_code(const std::exception_ptr& failure,
                                                     const char* operation) {
    try {
        std::rethrow_exception(failure);
    } catch (const std::system_error& e) {
        // A cancelled awaitable throws operation_aborted where it resumes.
        if (e.code() == asio::error::operation_aborted) return make_error_code(errc::cancelled);
        log::error("async", operation, ": internal error: ", e.what());
    } catch (const std::exception& e) {
        log::error("async", operation, ": internal error: ", e.what());
    } catch (...) {
        log::error("async", operation, ": internal error: unknown exception");
    }
    return make_error_code(errc::internal_error);
}

HIVEMESH_DECL bool running_in_this_thread(const asio::any_io_executor& ex) {
    using io = asio::io_context::executor_type;
    using pool = asio::thread_pool::executor_type;
    using io_tracked = detail::tracked_executor_t<io>;
    using pool_tracked = detail::tracked_executor_t<pool>;
    return detail::runs_here_or_on_strand<io>(ex) ||
           detail::runs_here_or_on_strand<io_tracked>(ex) ||
           detail::runs_here_or_on_strand<pool>(ex) ||
           detail::runs_here_or_on_strand<pool_tracked>(ex) ||
           detail::runs_here<asio::strand<asio::any_io_executor>>(ex);
}

HIVEMESH_DECL wakeup::wakeup(const asio::any_io_executor& ex)
    : channel_(ex, 1) {}

HIVEMESH_DECL void wakeup::notify() {
    channel_.try_send(std::error_code{}, true);
}

HIVEMESH_DECL asio::awaitable<std::error_code> wakeup::wait() {
    auto [ec, unused] =
        co_await channel_.async_receive(asio::experimental::as_tuple(asio::use_awaitable));
    co_return ec;
}

} // namespace hivemesh
