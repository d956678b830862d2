// Fixed instants for the tests, named by their unit.
#pragma once

#include <hivemesh/core/clock.hpp>

#include <chrono>
#include <cstdint>

namespace hivemesh::test {

/// The instant `seconds` after the epoch.
inline time_point at_seconds(std::int64_t seconds) {
    return time_point{std::chrono::seconds(seconds)};
}

/// The instant `nanoseconds` after the epoch.
inline time_point at_nanoseconds(std::int64_t nanoseconds) {
    return time_point{std::chrono::nanoseconds(nanoseconds)};
}

} // namespace hivemesh::test
