// The metadata that travels with a collaborative optimizer's state download (the tensors are
// the parameters, the averaged buffers, then the optimizer's state): its wire format.
#pragma once

#include "hivemesh/core/binary.hpp"
#include "hivemesh/core/bytes.hpp"
#include "hivemesh/core/error.hpp"

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <system_error>
#include <type_traits>
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

namespace detail {

/// The bytes write_tensor_list writes for `list`.
template <class T>
std::size_t tensor_list_size(const std::vector<std::vector<T>>& list) {
    std::size_t size = 4;
    for (const auto& t : list)
        size += 8 + sizeof(T) * t.size();
    return size;
}

/// Writes a list of tensors: u32 tensor count | per tensor: u64 element count, then its
/// elements (float32 or int64, little-endian). The state metadata and checkpoints use it.
template <class T>
void write_tensor_list(binary_writer& w, const std::vector<std::vector<T>>& list) {
    w.write(static_cast<std::uint32_t>(list.size()));
    for (const auto& t : list) {
        w.write(static_cast<std::uint64_t>(t.size()));
        if constexpr (std::endian::native == std::endian::little) {
            w.write_bytes(as_bytes(std::span(t)));
        } else {
            for (const T x : t)
                if constexpr (std::is_same_v<T, float>)
                    w.write_f32(x);
                else
                    w.write(x);
        }
    }
}

/// Reads what write_tensor_list wrote, every count checked against the bytes left before
/// anything is allocated; on error the reader's error is set.
template <class T>
std::vector<std::vector<T>> read_tensor_list(binary_reader& r) {
    std::vector<std::vector<T>> list;
    const auto count = r.read<std::uint32_t>();
    // Each tensor takes at least its 8-byte element count.
    if (!r.check_count(count, 8, std::numeric_limits<std::uint32_t>::max())) return list;
    list.resize(count);
    for (auto& t : list) {
        t.resize(r.read_count(sizeof(T), std::numeric_limits<std::size_t>::max()));
        if constexpr (std::endian::native == std::endian::little) {
            const byte_view bytes = r.read_bytes(t.size() * sizeof(T));
            if (!bytes.empty()) std::memcpy(t.data(), bytes.data(), bytes.size());
        } else {
            for (auto& x : t)
                if constexpr (std::is_same_v<T, float>)
                    x = r.read_f32();
                else
                    x = r.read<T>();
        }
    }
    return list;
}

} // namespace detail

/// u8 version | u64 epoch | u64 step_count | u32 integer buffer count | per buffer: u64
/// element count, then its elements as i64. Little-endian.
inline byte_buffer encode(const state_metadata& m) {
    byte_buffer out;
    out.reserve(1 + 8 + 8 + detail::tensor_list_size(m.integer_buffers));
    binary_writer w(out);
    w.write(state_metadata_version);
    w.write(m.epoch);
    w.write(m.step_count);
    detail::write_tensor_list(w, m.integer_buffers);
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
    out.integer_buffers = detail::read_tensor_list<std::int64_t>(r);
    return r.finish();
}

} // namespace hivemesh::optim
