// The metadata that travels with a collaborative optimizer's state download (the tensors are
// the parameters, then the optimizer's state): its wire format, 17 bytes.
#pragma once

#include "hivemesh/core/binary.hpp"
#include "hivemesh/core/bytes.hpp"
#include "hivemesh/core/error.hpp"

#include <cstddef>
#include <cstdint>
#include <system_error>

namespace hivemesh::optim {

/// What travels with a state download besides the tensors.
struct state_metadata {
    std::uint64_t epoch = 0;
    std::uint64_t step_count = 0; ///< the local optimizer's
    friend bool operator==(const state_metadata&, const state_metadata&) = default;
};

inline constexpr std::uint8_t state_metadata_version = 1;
inline constexpr std::size_t state_metadata_size = 17;

inline byte_buffer encode(const state_metadata& m) {
    byte_buffer out;
    out.reserve(state_metadata_size);
    binary_writer w(out);
    w.write(state_metadata_version);
    w.write(m.epoch);
    w.write(m.step_count);
    return out;
}

/// Decodes `bytes`; on error `out` is unspecified. Errors: truncated_input, trailing_data,
/// unsupported_version. Whatever decodes encodes back to the same bytes.
inline std::error_code decode(byte_view bytes, state_metadata& out) {
    binary_reader r(bytes);
    const auto version = r.read<std::uint8_t>();
    if (r.ok() && version != state_metadata_version) r.fail(errc::unsupported_version);
    out.epoch = r.read<std::uint64_t>();
    out.step_count = r.read<std::uint64_t>();
    return r.finish();
}

} // namespace hivemesh::optim
