// The self-describing header at the start of every compressed tensor buffer.
//
// Layout (little-endian), 16 bytes:
//   u16 magic 0x4D48 ("HM") | u8 version (1) | u8 codec id | u8 original dtype |
//   u8 flags (0) | u16 reserved (0) | u64 element count
// followed by the codec's own fields and payload (see codecs.hpp).
#pragma once

#include "hivemesh/compression/kind.hpp"
#include "hivemesh/core/binary.hpp"

#include <cstdint>

namespace hivemesh::compression {

/// Bytes of the header every compressed buffer starts with.
inline constexpr std::size_t header_size = 16;

/// What a compressed buffer says about itself.
struct header {
    kind codec = kind::none;
    dtype original = dtype::float32;
    std::uint64_t count = 0; ///< number of elements
};

namespace detail {

inline constexpr std::uint16_t format_magic = 0x4D48;
inline constexpr std::uint8_t format_version = 1;

inline void write_header(binary_writer& w, const header& h) {
    w.write(format_magic);
    w.write(format_version);
    w.write(static_cast<std::uint8_t>(h.codec));
    w.write(static_cast<std::uint8_t>(h.original));
    w.write(std::uint8_t{0});
    w.write(std::uint16_t{0});
    w.write(h.count);
}

/// Reads and validates the header; leaves the reader at the codec fields.
inline header read_header(binary_reader& r, std::uint64_t max_elements) noexcept {
    header h;
    const auto magic = r.read<std::uint16_t>();
    const auto version = r.read<std::uint8_t>();
    const auto codec = r.read<std::uint8_t>();
    const auto original = r.read<std::uint8_t>();
    const auto flags = r.read<std::uint8_t>();
    const auto reserved = r.read<std::uint16_t>();
    h.count = r.read<std::uint64_t>();
    if (!r.ok()) return h;
    if (magic != format_magic)
        r.fail(errc::bad_magic);
    else if (version != format_version)
        r.fail(errc::unsupported_version);
    else if (!is_known(static_cast<kind>(codec)))
        r.fail(errc::unknown_codec);
    else if (!is_known(static_cast<dtype>(original)) || flags != 0 || reserved != 0)
        r.fail(errc::corrupt_data);
    else if (h.count > max_elements)
        r.fail(errc::length_limit_exceeded);
    h.codec = static_cast<kind>(codec);
    h.original = static_cast<dtype>(original);
    return h;
}

} // namespace detail
} // namespace hivemesh::compression
