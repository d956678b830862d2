// Clocks. Components take a clock as a template parameter so swarm tests can run on
// virtual time. Both clocks report absolute time since the Unix epoch, because DHT
// expirations are compared across machines.
#pragma once

#include <atomic>
#include <chrono>
#include <concepts>

namespace hivemesh {

using time_point = std::chrono::time_point<std::chrono::system_clock, std::chrono::nanoseconds>;
using duration = std::chrono::nanoseconds;

/// A clock is anything with `now()` returning hivemesh::time_point.
template <class C>
concept clock_like = requires(const C& c) {
    { c.now() } -> std::same_as<time_point>;
};

/// Real time from the system clock.
struct wall_clock {
    time_point now() const noexcept {
        return std::chrono::time_point_cast<duration>(std::chrono::system_clock::now());
    }
};

/// Virtual time that moves only when told to. Thread-safe; copies share nothing.
class simulated_clock {
public:
    explicit simulated_clock(time_point start = time_point{}) noexcept
        : ns_(start.time_since_epoch().count()) {}

    time_point now() const noexcept {
        return time_point{duration{ns_.load(std::memory_order_acquire)}};
    }

    /// Moves time forward by `d` (negative durations are ignored: time never runs back).
    void advance(duration d) noexcept {
        if (d.count() > 0) ns_.fetch_add(d.count(), std::memory_order_acq_rel);
    }

    /// Jumps to `t` if it is later than now.
    void advance_to(time_point t) noexcept {
        auto current = ns_.load(std::memory_order_acquire);
        const auto target = t.time_since_epoch().count();
        while (current < target &&
               !ns_.compare_exchange_weak(current, target, std::memory_order_acq_rel)) {
        }
    }

private:
    std::atomic<std::int64_t> ns_;
};

static_assert(clock_like<wall_clock>);
static_assert(clock_like<simulated_clock>);

/// Seconds since the Unix epoch as a double, the unit of DHT expiration times.
inline double to_seconds(time_point t) noexcept {
    return std::chrono::duration<double>(t.time_since_epoch()).count();
}

} // namespace hivemesh
