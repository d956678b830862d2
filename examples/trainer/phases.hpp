// The phases of a collaborative trainer peer's wall time and how they read in its JSON (the
// worker's "done" event, report.json's "phases" of each peer). Free of libtorch, so that the
// programs that read the reports (tests/integration/trainer_report_check.cpp,
// bench/thesis_matrix.cpp) know the phases from here too.
#pragma once

#include <nlohmann/json.hpp>

#include <array>

namespace hivemesh::examples {

/// Where a peer's wall time went, in seconds. `other` is the rest of `wall`.
struct phase_seconds {
    double data = 0;
    double compute = 0;
    double matchmaking = 0;
    double allreduce = 0;
    double optimizer = 0;
    double state_load = 0;
    double other = 0;

    double named() const {
        return data + compute + matchmaking + allreduce + optimizer + state_load;
    }
};

/// A phase: its name in the reports and its field of phase_seconds.
struct phase_field {
    const char* name;
    double phase_seconds::*seconds;
};

/// Every phase, in report order (`other` last).
inline constexpr std::array<phase_field, 7> phase_fields{{
    {"data", &phase_seconds::data},
    {"compute", &phase_seconds::compute},
    {"matchmaking", &phase_seconds::matchmaking},
    {"allreduce", &phase_seconds::allreduce},
    {"optimizer", &phase_seconds::optimizer},
    {"state_load", &phase_seconds::state_load},
    {"other", &phase_seconds::other},
}};

/// {"data": s, "compute": s, ...}, every phase in report order.
inline nlohmann::ordered_json to_json(const phase_seconds& p) {
    nlohmann::ordered_json out;
    for (const auto& [name, field] : phase_fields)
        out[name] = p.*field;
    return out;
}

/// The phases of a JSON object as to_json writes it; a missing phase is 0. Throws
/// nlohmann::json::type_error if `j` is not an object or a phase is not a number.
inline phase_seconds phase_seconds_from_json(const nlohmann::json& j) {
    phase_seconds p;
    for (const auto& [name, field] : phase_fields)
        p.*field = j.value(name, 0.0);
    return p;
}

} // namespace hivemesh::examples
