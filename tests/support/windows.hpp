// Bytes over sliding windows of time, for the rate-cap tests: the most that any window of a
// given width holds.
#pragma once

#include <hivemesh/core/clock.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace hivemesh::test {

/// Bytes seen at an instant (a message's arrival, a write's start).
struct timed_bytes {
    duration at;
    std::uint64_t bytes;
};

/// The most bytes within any closed window [t, t + width], over `events` in time order.
inline std::uint64_t busiest_window(const std::vector<timed_bytes>& events, duration width) {
    std::uint64_t best = 0, sum = 0;
    std::size_t first = 0;
    for (const auto& e : events) {
        sum += e.bytes;
        while (e.at - events[first].at > width)
            sum -= events[first++].bytes;
        best = std::max(best, sum);
    }
    return best;
}

} // namespace hivemesh::test
