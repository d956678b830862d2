// The metadata that travels with a collaborative optimizer's state download (the tensors are
// the parameters, the averaged buffers, then the optimizer's state): its wire format.
#pragma once

#include "hivemesh/core/binary.hpp"
#include "hivemesh/core/bytes.hpp"
#include "hivemesh/core/error.hpp"

#include <cstddef>
#include <cstdint>
#include <limits>
#include <system_error>
#include <vector>

namespace hivemesh::optim {

/// What travels with a state download besides the float tensors.
struct state_metadata {
    std::uint64_t epoch = 0;
    std::uint64_t step_count = 0; ///< the local optimizer's
    /// The model's integer buffers (model_buffers::carried), in order: exact, never averaged.
    std::vector<std::vector<std::int64_t>> integer_buffers;
    friend bool operator==(const state_metadata&, const state_metadata&) = default;
};

inline constexpr std::uint8_t state_metadata_version = 2;

/// u8 version | u64 epoch | u64 step_count | u32 integer buffer count | per buffer: u64
/// element count, then its elements as i64. Little-endian.
inline byte_buffer encode(const state_metadata& m) {
    std::size_t size = 1 + 8 + 8 + 4;
    for (const auto& b : m.integer_buffers)
        size += 8 + 8 * b.size();
    byte_buffer out;
    out.reserve(size);
    binary_writer w(out);
    w.write(state_metadata_version);
    w.write(m.epoch);
    w.write(m.step_count);
    w.write(static_cast<std::uint32_t>(m.integer_buffers.size()));
    for (const auto& b : m.integer_buffers) {
        w.write(static_cast<std::uint64_t>(b.size()));
        for (const std::int64_t x : b)
            w.write(x);
    }
    return out;
}

/// Decodes `bytes`; on error `out` is unspecified. Errors: truncated_input, trailing_data,
/// unsupported_version. Every count is checked against the bytes left before anything is
/// allocated. Whatever decodes encodes back to the same bytes.
inline std::error_code decode(byte_view bytes, state_metadata& out) {
    binary_reader r(bytes);
    const auto version = r.read<std::uint8_t>();
    if (r.ok() && version != state_metadata_version) r.fail(errc::unsupported_version);
    out.epoch = r.read<std::uint64_t>();
    out.step_count = r.read<std::uint64_t>();
    const auto buffers = r.read<std::uint32_t>();
    out.integer_buffers.clear();
    // Each buffer takes at least its 8-byte count.
    if (r.check_count(buffers, 8, std::numeric_limits<std::uint32_t>::max())) {
        out.integer_buffers.resize(buffers);
        for (auto& b : out.integer_buffers) {
            b.resize(r.read_count(8, std::numeric_limits<std::size_t>::max()));
            for (auto& x : b)
                x = r.read<std::int64_t>();
        }
    }
    return r.finish();
}

} // namespace hivemesh::optim
