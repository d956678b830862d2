// Codec identifiers and names.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

namespace hivemesh::compression {

/// A tensor codec. The numeric value is the codec id written into every buffer.
enum class kind : std::uint8_t {
    none = 0,           ///< float32 as is
    float16 = 1,        ///< IEEE half, clamped to +-65504
    meanstd_16bit = 2,  ///< per row: (x - mean) / std in half precision
    uniform_8bit = 3,   ///< 256 uniform bins of 6 sigma; codebook of bin means
    quantile_8bit = 4,  ///< 256 bins at approximate quantiles; codebook of bin means
    blockwise_8bit = 5, ///< per-block absmax scaling onto the dynamic 8-bit map
};

inline constexpr std::array all_kinds = {kind::none,          kind::float16,
                                         kind::meanstd_16bit, kind::uniform_8bit,
                                         kind::quantile_8bit, kind::blockwise_8bit};

inline constexpr std::string_view to_string(kind k) noexcept {
    switch (k) {
    case kind::none:
        return "none";
    case kind::float16:
        return "float16";
    case kind::meanstd_16bit:
        return "meanstd_16bit";
    case kind::uniform_8bit:
        return "uniform_8bit";
    case kind::quantile_8bit:
        return "quantile_8bit";
    case kind::blockwise_8bit:
        return "blockwise_8bit";
    }
    return "unknown";
}

/// Parses a codec name as printed by to_string; nullopt for anything else.
inline constexpr std::optional<kind> parse_kind(std::string_view name) noexcept {
    for (kind k : all_kinds)
        if (to_string(k) == name) return k;
    return std::nullopt;
}

/// The element type a tensor had before it was compressed; recorded so a receiver can
/// restore it. Every codec itself works on float32 values.
enum class dtype : std::uint8_t { float32 = 0, float16 = 1, bfloat16 = 2 };

inline constexpr bool is_known(dtype d) noexcept {
    return static_cast<std::uint8_t>(d) <= 2;
}
inline constexpr bool is_known(kind k) noexcept {
    return static_cast<std::uint8_t>(k) <= 5;
}

} // namespace hivemesh::compression
