// The faults of the all-reduce fault matrix: what one member of a group does wrong. Shared by
// tests/averaging/allreduce_test.cpp (simulated network and loopback TCP in one process) and
// tests/integration/allreduce_faults.cpp (one OS process a member).
#pragma once

#include <optional>
#include <string_view>

namespace hivemesh::test {

enum class fault {
    fail_before,   ///< dies before the round starts
    fail_sending,  ///< dies while sending its parts
    slow_sending,  ///< sends its parts late
    fail_reducing, ///< dies while reducing its span
    slow_reducing, ///< reduces its span late
    cancel,        ///< cancels its round
};

inline constexpr fault all_faults[] = {fault::fail_before,   fault::fail_sending,
                                       fault::slow_sending,  fault::fail_reducing,
                                       fault::slow_reducing, fault::cancel};

/// The fault's name, as spelled in the enumeration (for messages and command lines).
inline const char* to_string(fault f) {
    switch (f) {
    case fault::fail_before:
        return "fail_before";
    case fault::fail_sending:
        return "fail_sending";
    case fault::slow_sending:
        return "slow_sending";
    case fault::fail_reducing:
        return "fail_reducing";
    case fault::slow_reducing:
        return "slow_reducing";
    case fault::cancel:
        return "cancel";
    }
    return "?";
}

/// The fault with this to_string(), if any.
inline std::optional<fault> fault_named(std::string_view text) {
    for (const auto f : all_faults)
        if (text == to_string(f)) return f;
    return std::nullopt;
}

} // namespace hivemesh::test
