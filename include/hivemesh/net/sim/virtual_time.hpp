// Virtual time for the simulated network: an Asio service that owns a virtual clock and a
// queue of timed events, and runs a single-threaded io_context by executing every ready
// handler, then jumping the clock to the next due event. `timer` is a drop-in for
// asio::steady_timer on that clock and `clock` is a hivemesh::clock_like reading it.
//
// Contract: an io_context that uses virtual time has no real I/O and is driven only through
// virtual_time's run functions, on one thread. Calling io_context::run() directly would never
// fire a virtual timer, and io_context::stop() is undone by the next run call (they restart
// the context whenever it stops for lack of work); to stop early, use run_until(predicate).
// An exception thrown by a handler or a call_at function propagates out of the run function;
// the loop can be run again afterwards.
#pragma once

#include <hivemesh/core/clock.hpp>

#include <asio.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

namespace hivemesh::net::sim {

namespace detail {

/// A completion handler parked until its operation finishes. Type-erased so that
/// non-template state can hold it; keeps the handler's executor busy (outstanding work)
/// while parked, and delivers the result by posting, never inline.
template <class... Args>
class pending_completion {
public:
    pending_completion() = default;

    template <class Handler, class IoExecutor>
    pending_completion(Handler&& handler, const IoExecutor& io_executor)
        : impl_(make_impl(std::forward<Handler>(handler), io_executor)) {}

    explicit operator bool() const noexcept { return impl_ != nullptr; }

    /// Posts the handler with `args` to its associated executor and leaves this empty.
    /// Requires a parked handler.
    void post(Args... args) {
        auto impl = std::move(impl_); // empty before anything runs, in case posting re-enters
        impl->post(std::move(args)...);
    }

    /// Destroys the handler without invoking it (shutdown).
    void reset() noexcept { impl_.reset(); }

private:
    struct base {
        virtual ~base() = default;
        virtual void post(Args&&... args) = 0;
    };

    template <class Handler, class Executor>
    struct impl final : base {
        impl(Handler&& h, const Executor& ex)
            : handler(std::move(h))
            , work(ex) {}

        void post(Args&&... args) override {
            auto executor = work.get_executor();
            asio::post(executor,
                       [handler = std::move(handler), ... args = std::move(args)]() mutable {
                           std::move(handler)(std::move(args)...);
                       });
            work.reset();
        }

        Handler handler;
        asio::executor_work_guard<Executor> work;
    };

    template <class Handler, class IoExecutor>
    static std::unique_ptr<base> make_impl(Handler&& handler, const IoExecutor& io_executor) {
        using handler_type = std::decay_t<Handler>;
        using executor_type = asio::associated_executor_t<handler_type, IoExecutor>;
        executor_type executor = asio::get_associated_executor(handler, io_executor);
        return std::make_unique<impl<handler_type, executor_type>>(
            handler_type(std::forward<Handler>(handler)), executor);
    }

    std::unique_ptr<base> impl_;
};

/// Something to do at a virtual instant: run(false) when due, run(true) when cancelled.
class timed_action {
public:
    virtual ~timed_action() = default;
    virtual void run(bool cancelled) = 0;
};

template <class F>
class timed_function final : public timed_action {
public:
    explicit timed_function(F f)
        : f_(std::move(f)) {}
    void run(bool cancelled) override {
        if (!cancelled) f_();
    }

private:
    F f_;
};

/// Min-heap of timed actions ordered by (expiry, insertion sequence), with O(log n) removal
/// through handles that stay safe to use after their entry is gone.
class event_queue {
public:
    struct handle {
        std::uint32_t slot = no_slot;
        std::uint32_t generation = 0;
    };

    bool empty() const noexcept { return heap_.empty(); }
    std::size_t size() const noexcept { return heap_.size(); }
    time_point earliest() const noexcept { return entries_[heap_.front()].expiry; }

    handle push(time_point expiry, std::unique_ptr<timed_action> action) {
        std::uint32_t slot;
        if (!free_.empty()) {
            slot = free_.back();
            free_.pop_back();
        } else {
            slot = static_cast<std::uint32_t>(entries_.size());
            entries_.emplace_back();
        }
        auto& e = entries_[slot];
        e.expiry = expiry;
        e.sequence = next_sequence_++;
        e.action = std::move(action);
        e.position = static_cast<std::uint32_t>(heap_.size());
        heap_.push_back(slot);
        sift_up(e.position);
        return {slot, e.generation};
    }

    bool contains(handle h) const noexcept {
        return h.slot < entries_.size() && entries_[h.slot].generation == h.generation &&
               entries_[h.slot].action != nullptr;
    }

    /// Removes the entry if it is still queued; returns its action (null if it was not).
    std::unique_ptr<timed_action> remove(handle h) {
        if (!contains(h)) return nullptr;
        return erase_at(entries_[h.slot].position);
    }

    /// Removes and returns the earliest action. Requires !empty().
    std::unique_ptr<timed_action> pop() { return erase_at(0); }

    /// Empties the queue (shutdown); the caller destroys the actions after the queue is
    /// consistent again, because their destructors may call back into it.
    std::vector<std::unique_ptr<timed_action>> take_all() {
        std::vector<std::unique_ptr<timed_action>> actions;
        actions.reserve(heap_.size());
        while (!heap_.empty())
            actions.push_back(erase_at(heap_.size() - 1));
        return actions;
    }

private:
    static constexpr std::uint32_t no_slot = std::numeric_limits<std::uint32_t>::max();

    struct entry {
        time_point expiry{};
        std::uint64_t sequence = 0;
        std::uint32_t position = 0; // index in heap_
        std::uint32_t generation = 0;
        std::unique_ptr<timed_action> action;
    };

    bool before(std::uint32_t a, std::uint32_t b) const noexcept {
        const auto& x = entries_[a];
        const auto& y = entries_[b];
        return x.expiry != y.expiry ? x.expiry < y.expiry : x.sequence < y.sequence;
    }

    void place(std::size_t position, std::uint32_t slot) noexcept {
        heap_[position] = slot;
        entries_[slot].position = static_cast<std::uint32_t>(position);
    }

    void sift_up(std::size_t position) noexcept {
        const auto slot = heap_[position];
        while (position > 0) {
            const auto parent = (position - 1) / 2;
            if (!before(slot, heap_[parent])) break;
            place(position, heap_[parent]);
            position = parent;
        }
        place(position, slot);
    }

    void sift_down(std::size_t position) noexcept {
        const auto slot = heap_[position];
        for (;;) {
            auto child = 2 * position + 1;
            if (child >= heap_.size()) break;
            if (child + 1 < heap_.size() && before(heap_[child + 1], heap_[child])) ++child;
            if (!before(heap_[child], slot)) break;
            place(position, heap_[child]);
            position = child;
        }
        place(position, slot);
    }

    std::unique_ptr<timed_action> erase_at(std::size_t position) {
        const auto slot = heap_[position];
        const auto last = heap_.back();
        heap_.pop_back();
        if (position < heap_.size()) {
            place(position, last);
            sift_down(position);
            sift_up(entries_[last].position);
        }
        auto& e = entries_[slot];
        auto action = std::move(e.action);
        ++e.generation; // outstanding handles to this entry go stale
        free_.push_back(slot);
        return action;
    }

    std::vector<entry> entries_;
    std::vector<std::uint32_t> free_;
    std::vector<std::uint32_t> heap_;
    std::uint64_t next_sequence_ = 0;
};

} // namespace detail

/// The virtual clock and event loop of one io_context. Obtain it with
/// `asio::use_service<virtual_time>(io_context)` (the clock then starts at `default_epoch`)
/// or create it first with `virtual_time::install(io_context, start)`.
class virtual_time final : public asio::execution_context::service {
public:
    using key_type = virtual_time;
    static inline asio::execution_context::id id;

    /// 2026-01-01T00:00:00Z: a fixed, realistic absolute time, since DHT code compares
    /// absolute expiration times.
    static constexpr time_point default_epoch{std::chrono::seconds{1'767'225'600}};

    explicit virtual_time(asio::io_context& io, time_point start = default_epoch)
        : service(io)
        , io_(&io)
        , now_(start) {}

    /// Used when the service is first requested through a context that is not known to be
    /// an io_context; such a service keeps time but its run functions throw.
    explicit virtual_time(asio::execution_context& context)
        : service(context)
        , now_(default_epoch) {}

    /// Adds the service to `io` with the clock starting at `start`. Throws
    /// asio::service_already_exists if the io_context already has one.
    static virtual_time& install(asio::io_context& io, time_point start) {
        auto service = std::make_unique<virtual_time>(io, start);
        asio::add_service(io, service.get()); // takes ownership only when it succeeds
        return *service.release();
    }

    time_point now() const noexcept { return now_; }

    /// Number of scheduled events (timer waits, simulated packets, calls) not yet due.
    std::size_t pending() const noexcept { return queue_.size(); }

    /// Runs the ready handlers without moving the clock. Returns how many ran.
    std::size_t poll() { return drain(); }

    /// Runs until no handler is ready and no event is scheduled. Returns the number of
    /// handlers run. Never returns while something reschedules itself forever (a periodic
    /// task): use run_for or run_until then.
    std::size_t run() { return run_until_limit(time_point::max(), false); }

    /// Runs everything due within `d` of now, then leaves the clock at now + d.
    std::size_t run_for(duration d) { return run_until(saturating_add(now_, d)); }

    /// Runs everything due up to `t`, then leaves the clock at `t` (if it was earlier).
    std::size_t run_until(time_point t) { return run_until_limit(t, true); }

    /// Runs until `done()` returns true, checked after every handler and every batch of
    /// events, or until `max_virtual` has passed (the clock then stands at the deadline).
    /// Returns whether `done()` became true.
    template <class Predicate>
    bool run_until(Predicate&& done, duration max_virtual) {
        const auto deadline = saturating_add(now_, max_virtual);
        if (done()) return true;
        for (;;) {
            for (;;) {
                restart_if_stopped();
                if (io().poll_one() == 0) break;
                if (done()) return true;
            }
            if (!fire_next(deadline)) break;
            if (done()) return true;
        }
        now_ = std::max(now_, deadline);
        return done();
    }

    /// Identifies a scheduled event; stays safe to use after the event ran or was cancelled.
    using event_handle = detail::event_queue::handle;

    /// Calls `f()` from the run loop at virtual time `t` (at once if `t` has passed), after
    /// the events already scheduled for that instant, without going through the io_context.
    /// For simulation scripts and simulated components. cancel() with the returned handle
    /// drops the call.
    template <class F>
    event_handle call_at(time_point t, F&& f) {
        return schedule(
            t, std::make_unique<detail::timed_function<std::decay_t<F>>>(std::forward<F>(f)));
    }

    template <class F>
    event_handle call_after(duration d, F&& f) {
        return call_at(saturating_add(now_, d), std::forward<F>(f));
    }

    // Low-level queue access for timers: an action scheduled here gets run(true) if it is
    // cancelled. After shutdown nothing is scheduled (the action is destroyed at once).
    event_handle schedule(time_point t, std::unique_ptr<detail::timed_action> action) {
        if (shut_down_) return {};
        return queue_.push(t, std::move(action));
    }

    bool is_scheduled(event_handle h) const noexcept { return queue_.contains(h); }

    /// Cancels a scheduled event: a call_at call is dropped, a timer wait completes with
    /// operation_aborted. Returns whether the event was still scheduled.
    bool cancel(event_handle h) {
        auto action = queue_.remove(h);
        if (!action) return false;
        action->run(true);
        return true;
    }

private:
    void shutdown() override {
        shut_down_ = true;
        auto actions = queue_.take_all();
        actions.clear(); // may destroy coroutine frames, whose timers then find nothing to cancel
    }

    static time_point saturating_add(time_point t, duration d) noexcept {
        if (d.count() <= 0) return t;
        if (d > time_point::max() - t) return time_point::max();
        return t + d;
    }

    asio::io_context& io() const {
        if (io_ == nullptr)
            throw std::logic_error("hivemesh::net::sim::virtual_time: the service was created "
                                   "without an io_context; create it with "
                                   "asio::use_service<virtual_time>(io_context) first");
        return *io_;
    }

    // poll() stops an io_context that has no outstanding work; the next poll needs restart().
    void restart_if_stopped() {
        if (io().stopped()) io().restart();
    }

    std::size_t drain() {
        std::size_t count = 0;
        for (;;) {
            restart_if_stopped();
            const auto n = io().poll();
            if (n == 0) return count;
            count += n;
        }
    }

    /// Moves the clock to the earliest event if it is due by `limit` and runs every event
    /// due at that instant, including ones they schedule for it. Returns false if none was.
    bool fire_next(time_point limit) {
        if (queue_.empty() || queue_.earliest() > limit) return false;
        now_ = std::max(now_, queue_.earliest());
        while (!queue_.empty() && queue_.earliest() <= now_)
            queue_.pop()->run(false);
        return true;
    }

    std::size_t run_until_limit(time_point limit, bool advance_to_limit) {
        std::size_t count = 0;
        for (;;) {
            count += drain();
            if (!fire_next(limit)) break;
        }
        if (advance_to_limit) now_ = std::max(now_, limit);
        return count;
    }

    asio::io_context* io_ = nullptr;
    time_point now_;
    detail::event_queue queue_;
    bool shut_down_ = false;
};

namespace detail {

inline virtual_time& find_virtual_time(const asio::any_io_executor& executor) {
    // An io_context executor (possibly inside a strand) lets the service be created with its
    // io_context, so that it can run; any other executor finds a service that must already
    // exist to be runnable.
    using io_executor = asio::io_context::executor_type;
    if (const auto* e = executor.target<io_executor>())
        return asio::use_service<virtual_time>(e->context());
    if (const auto* s = executor.target<asio::strand<io_executor>>())
        return asio::use_service<virtual_time>(s->get_inner_executor().context());
    if (const auto* s = executor.target<asio::strand<asio::any_io_executor>>())
        return find_virtual_time(s->get_inner_executor());
    return asio::use_service<virtual_time>(asio::query(executor, asio::execution::context));
}

} // namespace detail

/// Reads the virtual clock of an io_context. Satisfies hivemesh::clock_like.
class clock {
public:
    explicit clock(virtual_time& time) noexcept
        : time_(&time) {}
    explicit clock(const asio::any_io_executor& executor)
        : time_(&detail::find_virtual_time(executor)) {}

    time_point now() const noexcept { return time_->now(); }

private:
    virtual_time* time_;
};

static_assert(clock_like<clock>);

/// A waitable timer on virtual time, used like asio::steady_timer. Single-threaded, like
/// the io_context that runs it.
class timer {
public:
    using executor_type = asio::any_io_executor;
    using clock_type = sim::clock;
    using duration = hivemesh::duration;
    using time_point = hivemesh::time_point;

    /// A timer that has expired (expiry at the Unix epoch), like asio's.
    explicit timer(const executor_type& executor)
        : executor_(executor)
        , time_(&detail::find_virtual_time(executor)) {}

    timer(const executor_type& executor, time_point expiry)
        : timer(executor) {
        expiry_ = expiry;
    }

    timer(const executor_type& executor, duration after)
        : timer(executor) {
        expires_after(after);
    }

    template <class ExecutionContext>
    requires std::is_convertible_v<ExecutionContext&, asio::execution_context&>
    explicit timer(ExecutionContext& context)
        : timer(executor_type(context.get_executor())) {}

    /// The moved-from timer keeps its executor and expiry and has no pending waits.
    timer(timer&& other) noexcept
        : executor_(other.executor_)
        , time_(other.time_)
        , expiry_(other.expiry_)
        , waits_(std::move(other.waits_)) {
        other.waits_.clear();
    }

    timer& operator=(timer&& other) noexcept {
        if (this != &other) {
            cancel();
            executor_ = other.executor_;
            time_ = other.time_;
            expiry_ = other.expiry_;
            waits_ = std::move(other.waits_);
            other.waits_.clear();
        }
        return *this;
    }

    timer(const timer&) = delete;
    timer& operator=(const timer&) = delete;

    /// Pending waits complete with asio::error::operation_aborted.
    ~timer() { cancel(); }

    executor_type get_executor() const noexcept { return executor_; }

    time_point expiry() const noexcept { return expiry_; }

    /// Sets the expiry time; cancels pending waits (operation_aborted) and returns how many.
    std::size_t expires_at(time_point t) {
        const auto cancelled = cancel();
        expiry_ = t;
        return cancelled;
    }

    /// Sets the expiry relative to the virtual now; cancels pending waits like expires_at.
    std::size_t expires_after(duration d) {
        const auto now = time_->now();
        const auto t = d.count() > 0 && d > time_point::max() - now ? time_point::max() : now + d;
        return expires_at(t);
    }

    /// Completes every pending wait with operation_aborted (posted, never inline); returns
    /// how many there were.
    std::size_t cancel() {
        std::size_t cancelled = 0;
        auto waits = std::move(waits_);
        waits_.clear();
        for (const auto& h : waits)
            cancelled += time_->cancel(h) ? 1 : 0;
        return cancelled;
    }

    /// Waits until the virtual clock reaches the expiry. Completion: void(std::error_code):
    /// success when the clock reached the expiry, asio::error::operation_aborted if the wait
    /// was cancelled by cancel(), expires_at/after, destruction, or through the handler's
    /// cancellation slot (any cancellation type). An expiry in the past completes at the
    /// current virtual instant, after the ready handlers.
    template <class WaitToken = asio::default_completion_token_t<executor_type>>
    auto async_wait(WaitToken&& token = asio::default_completion_token_t<executor_type>()) {
        return asio::async_initiate<WaitToken, void(std::error_code)>(
            [this](auto&& handler) { this->start_wait(std::forward<decltype(handler)>(handler)); },
            token);
    }

private:
    class wait_action final : public detail::timed_action {
    public:
        explicit wait_action(detail::pending_completion<std::error_code> completion)
            : completion_(std::move(completion)) {}
        void run(bool cancelled) override {
            completion_.post(cancelled ? std::error_code(asio::error::operation_aborted)
                                       : std::error_code());
        }

    private:
        detail::pending_completion<std::error_code> completion_;
    };

    // Installed in the handler's cancellation slot. Holds only a handle, so it is harmless
    // if emitted after the wait finished.
    struct wait_cancellation {
        wait_cancellation(virtual_time* t, detail::event_queue::handle w)
            : time(t)
            , wait(w) {}
        virtual_time* time;
        detail::event_queue::handle wait;
        void operator()(asio::cancellation_type_t type) {
            if (type != asio::cancellation_type::none) time->cancel(wait);
        }
    };

    template <class Handler>
    void start_wait(Handler&& handler) {
        auto slot = asio::get_associated_cancellation_slot(handler);
        auto action = std::make_unique<wait_action>(
            detail::pending_completion<std::error_code>(std::forward<Handler>(handler), executor_));
        const auto h = time_->schedule(expiry_, std::move(action));
        std::erase_if(waits_, [this](const auto& w) { return !time_->is_scheduled(w); });
        waits_.push_back(h);
        if (slot.is_connected()) slot.template emplace<wait_cancellation>(time_, h);
    }

    executor_type executor_;
    virtual_time* time_;
    time_point expiry_{};
    std::vector<detail::event_queue::handle> waits_; // may hold stale handles; pruned
};

} // namespace hivemesh::net::sim
