#include <hivemesh/core/async.hpp>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/bind_executor.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/execution/outstanding_work.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/require.hpp>
#include <asio/steady_timer.hpp>
#include <asio/strand.hpp>
#include <asio/system_executor.hpp>
#include <asio/thread_pool.hpp>
#include <asio/use_future.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <future>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

using hivemesh::errc;
using namespace std::chrono_literals;

namespace {

// Collects error-level log lines while alive; restores the default sink after.
struct captured_errors {
    std::vector<std::string> lines;
    captured_errors() {
        hivemesh::log::set_sink(
            [this](hivemesh::log::level l, std::string_view, std::string_view message) {
                if (l == hivemesh::log::level::error) lines.emplace_back(message);
            });
    }
    ~captured_errors() { hivemesh::log::set_sink({}); }
    captured_errors(const captured_errors&) = delete;
    captured_errors& operator=(const captured_errors&) = delete;
};

asio::awaitable<std::error_code> returns(std::error_code ec) {
    co_return ec;
}

asio::awaitable<std::error_code> throws_runtime_error() {
    throw std::runtime_error("a bug");
    co_return std::error_code{};
}

asio::awaitable<std::error_code> throws_bad_alloc() {
    throw std::bad_alloc();
    co_return std::error_code{};
}

asio::awaitable<std::pair<std::error_code, int>> returns_value(int value) {
    co_return std::pair{std::error_code{}, value};
}

asio::awaitable<std::pair<std::error_code, std::string>> throws_with_value() {
    throw std::logic_error("broken invariant");
    co_return std::pair{std::error_code{}, std::string("never")};
}

// Waits an hour on a timer; cancellation makes the wait throw operation_aborted.
asio::awaitable<std::error_code> waits_an_hour() {
    asio::steady_timer timer(co_await asio::this_coro::executor, 1h);
    co_await timer.async_wait(asio::use_awaitable);
    co_return std::error_code{};
}

} // namespace

TEST_CASE("co_launch passes an operation's own result through unchanged", "[core][async]") {
    captured_errors log;
    asio::io_context io;
    std::vector<std::error_code> seen;
    for (const std::error_code ec :
         {std::error_code{}, make_error_code(errc::timeout), make_error_code(errc::remote_error),
          make_error_code(errc::cancelled), std::make_error_code(std::errc::io_error)})
        hivemesh::co_launch(
            io.get_executor(), returns(ec), [&seen](std::error_code got) { seen.push_back(got); },
            "returns");
    std::optional<std::pair<std::error_code, int>> with_value;
    hivemesh::co_launch(
        io.get_executor(), returns_value(42),
        [&with_value](std::error_code ec, int value) {
            with_value = std::pair{ec, value};
        },
        "returns_value");
    io.run();
    REQUIRE(seen.size() == 5);
    CHECK(seen[0] == std::error_code{});
    CHECK(seen[1] == errc::timeout);
    CHECK(seen[2] == errc::remote_error);
    CHECK(seen[3] == errc::cancelled);
    CHECK(seen[4] == std::errc::io_error);
    REQUIRE(with_value);
    CHECK(with_value->first == std::error_code{});
    CHECK(with_value->second == 42);
    CHECK(log.lines.empty());
}

TEST_CASE("co_launch reports an escaped exception as internal_error and logs it once",
          "[core][async]") {
    captured_errors log;
    asio::io_context io;
    std::vector<std::error_code> seen;
    hivemesh::co_launch(
        io.get_executor(), throws_runtime_error(),
        [&seen](std::error_code ec) { seen.push_back(ec); }, "runtime op");
    hivemesh::co_launch(
        io.get_executor(), throws_bad_alloc(), [&seen](std::error_code ec) { seen.push_back(ec); },
        "alloc op");
    std::optional<std::pair<std::error_code, std::string>> with_value;
    hivemesh::co_launch(
        io.get_executor(), throws_with_value(),
        [&with_value](std::error_code ec, std::string value) {
            with_value = std::pair{ec, std::move(value)};
        },
        "value op");
    io.run();
    REQUIRE(seen.size() == 2);
    CHECK(seen[0] == errc::internal_error);
    CHECK(seen[1] == errc::internal_error);
    REQUIRE(with_value);
    CHECK(with_value->first == errc::internal_error);
    CHECK(with_value->second.empty()); // the value is value-initialised, not half-made
    REQUIRE(log.lines.size() == 3);
    CHECK(log.lines[0].find("runtime op") != std::string::npos);
    CHECK(log.lines[0].find("a bug") != std::string::npos);
    CHECK(log.lines[1].find("alloc op") != std::string::npos);
    CHECK(log.lines[2].find("broken invariant") != std::string::npos);
}

TEST_CASE("co_launch reports cancellation through the handler's slot as cancelled, unlogged",
          "[core][async]") {
    captured_errors log;
    asio::io_context io;
    asio::cancellation_signal signal;
    std::optional<std::error_code> seen;
    hivemesh::co_launch(
        io.get_executor(), waits_an_hour(),
        asio::bind_cancellation_slot(signal.slot(), [&seen](std::error_code ec) { seen = ec; }),
        "waits");
    io.poll(); // all that is ready, with no deadline a slow machine could miss
    CHECK_FALSE(seen);
    signal.emit(asio::cancellation_type::terminal);
    io.run_for(1s);
    REQUIRE(seen);
    CHECK(*seen == errc::cancelled);
    CHECK(log.lines.empty());
}

TEST_CASE("co_launch with on_cancel calls it when the slot is emitted and clears the slot",
          "[core][async]") {
    captured_errors log;
    asio::io_context io;
    asio::cancellation_signal signal;
    hivemesh::wakeup stop(io.get_executor());
    int cancels = 0;
    auto work = [&stop]() -> asio::awaitable<std::pair<std::error_code, int>> {
        co_await stop.wait();
        co_return std::pair{make_error_code(errc::cancelled), 7};
    };
    std::optional<std::pair<std::error_code, int>> seen;
    hivemesh::co_launch(io.get_executor(), work(),
                        asio::bind_cancellation_slot(signal.slot(),
                                                     [&seen](std::error_code ec, int value) {
                                                         seen = std::pair{ec, value};
                                                     }),
                        "stoppable", [&cancels, &stop] {
                            ++cancels;
                            stop.notify();
                        });
    io.poll();
    CHECK_FALSE(seen);
    signal.emit(asio::cancellation_type::terminal);
    io.run_for(1s);
    REQUIRE(seen);
    CHECK(seen->first == errc::cancelled); // the operation's own report
    CHECK(seen->second == 7);
    CHECK(cancels == 1);
    CHECK_FALSE(signal.slot().has_handler()); // cleared before completion
    signal.emit(asio::cancellation_type::terminal);
    CHECK(cancels == 1);
    CHECK(log.lines.empty());
}

TEST_CASE("erased_handler keeps the held handler's executor busy and completes on it",
          "[core][async]") {
    using handler_type = hivemesh::erased_handler<void(std::error_code, int)>;
    asio::io_context io;
    asio::io_context handler_io; // the held handler's own executor
    std::optional<std::pair<std::error_code, int>> seen;
    bool on_handler_io = false;
    handler_type erased(
        asio::bind_executor(handler_io.get_executor(),
                            [&](std::error_code ec, int value) {
                                on_handler_io = handler_io.get_executor().running_in_this_thread();
                                seen = std::pair{ec, value};
                            }),
        io.get_executor());
    handler_io.poll();
    CHECK_FALSE(handler_io.stopped()); // outstanding work until the handler has run
    hivemesh::co_launch(io.get_executor(), returns_value(42), std::move(erased), "erased");
    io.run();
    CHECK_FALSE(seen); // posted to handler_io, not run on io
    handler_io.run();
    REQUIRE(seen);
    CHECK(seen->first == std::error_code{});
    CHECK(seen->second == 42);
    CHECK(on_handler_io);

    // Destroyed without being invoked, it releases the work and never calls the handler.
    asio::io_context idle_io;
    bool called = false;
    {
        handler_type dropped(asio::bind_executor(idle_io.get_executor(),
                                                 [&](std::error_code, int) { called = true; }),
                             io.get_executor());
    }
    idle_io.poll();
    CHECK(idle_io.stopped());
    CHECK_FALSE(called);
}

TEST_CASE("erased_handler carries the held handler's cancellation slot and works with use_future",
          "[core][async]") {
    captured_errors log;
    asio::io_context io;
    asio::cancellation_signal signal;
    std::optional<std::error_code> seen;
    hivemesh::erased_handler<void(std::error_code)> erased(
        asio::bind_cancellation_slot(signal.slot(), [&seen](std::error_code ec) { seen = ec; }),
        io.get_executor());
    CHECK(erased.get_cancellation_slot() == signal.slot());
    hivemesh::co_launch(io.get_executor(), waits_an_hour(), std::move(erased), "waits");
    io.poll();
    CHECK_FALSE(seen);
    signal.emit(asio::cancellation_type::terminal);
    io.run_for(1s);
    REQUIRE(seen);
    CHECK(*seen == errc::cancelled);

    // use_future's handler, whose associated executor runs it in place.
    io.restart();
    auto value = asio::async_initiate<decltype(asio::use_future), void(std::error_code, int)>(
        [&io](auto handler) {
            hivemesh::co_launch(io.get_executor(), returns_value(7),
                                hivemesh::erased_handler<void(std::error_code, int)>(
                                    std::move(handler), io.get_executor()),
                                "future");
        },
        asio::use_future);
    io.run();
    CHECK(value.get() == 7);
    CHECK(log.lines.empty());
}

TEST_CASE("running_in_this_thread knows io_context and thread_pool executors and their strands",
          "[core][async]") {
    asio::io_context io;
    asio::thread_pool pool(1);
    const asio::any_io_executor io_plain = io.get_executor();
    const asio::any_io_executor io_tracked =
        asio::require(io.get_executor(), asio::execution::outstanding_work.tracked);
    const asio::any_io_executor io_strand = asio::make_strand(io.get_executor());
    const asio::any_io_executor any_strand = asio::make_strand(io_plain);
    const asio::any_io_executor pool_plain = pool.get_executor();
    const asio::any_io_executor pool_tracked =
        asio::require(pool.get_executor(), asio::execution::outstanding_work.tracked);
    const asio::any_io_executor pool_strand = asio::make_strand(pool.get_executor());
    const std::vector<asio::any_io_executor> all = {
        io_plain, io_tracked, io_strand, any_strand, pool_plain, pool_tracked, pool_strand};

    // Outside every one of them.
    for (const auto& ex : all)
        CHECK_FALSE(hivemesh::running_in_this_thread(ex));

    // Inside each: true for itself (and, for a strand, nothing says the others run).
    for (std::size_t i = 0; i < all.size(); ++i) {
        std::promise<bool> inside;
        asio::post(all[i], [&] { inside.set_value(hivemesh::running_in_this_thread(all[i])); });
        if (i < 4) { // the tracked executor keeps run() from returning: run one handler
            io.restart();
            io.run_one();
        }
        INFO("executor " << i);
        CHECK(inside.get_future().get());
    }

    // An io thread is not a pool thread, and the other way round.
    std::promise<bool> pool_seen_from_io;
    asio::post(io_plain,
               [&] { pool_seen_from_io.set_value(hivemesh::running_in_this_thread(pool_plain)); });
    io.restart();
    io.run_one();
    CHECK_FALSE(pool_seen_from_io.get_future().get());
    std::promise<bool> io_seen_from_pool;
    asio::post(pool_plain,
               [&] { io_seen_from_pool.set_value(hivemesh::running_in_this_thread(io_plain)); });
    CHECK_FALSE(io_seen_from_pool.get_future().get());

    // An executor it cannot ask.
    CHECK_FALSE(hivemesh::running_in_this_thread(asio::any_io_executor(asio::system_executor())));
    pool.stop(); // the tracked executor would keep join() waiting
    pool.join();
}

TEST_CASE("wakeup keeps one notification made while nobody waits", "[core][async]") {
    asio::io_context io;
    hivemesh::wakeup wake(io.get_executor());
    wake.notify();
    wake.notify(); // kept once, not twice
    int woken = 0;
    auto waiter = [&]() -> asio::awaitable<void> {
        const auto first = co_await wake.wait();
        if (!first) ++woken;
        const auto second = co_await wake.wait(); // nothing kept: waits for the next notify
        if (!second) ++woken;
    };
    asio::co_spawn(io, waiter(), asio::detached);
    io.poll();
    CHECK(woken == 1);
    wake.notify();
    io.restart();
    io.poll();
    CHECK(woken == 2);
}
