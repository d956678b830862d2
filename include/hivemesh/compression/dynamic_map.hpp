// The signed dynamic 8-bit map of blockwise quantization, and the lookup table that finds
// the nearest map entry of a value without a search.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace hivemesh::compression::detail {

/// The 127 positive decade values: for i = 0..6, j = 0..2^i-1,
/// 10^(i-6) * (0.1 + 0.9 * (2j+1) / 2^(i+1)), ascending.
inline std::array<float, 127> dynamic_map_decade_values() {
    std::array<double, 127> values{};
    std::size_t n = 0;
    for (int i = 0; i <= 6; ++i) {
        const double scale = std::pow(10.0, i - 6);
        const double steps = std::ldexp(1.0, i + 1);
        for (int j = 0; j < (1 << i); ++j)
            values[n++] = scale * (0.1 + 0.9 * (2 * j + 1) / steps);
    }
    std::sort(values.begin(), values.end());
    std::array<float, 127> result{};
    std::transform(values.begin(), values.end(), result.begin(),
                   [](double v) { return static_cast<float>(v); });
    return result;
}

/// The 256-entry map sorted ascending: 127 negated decade values, 0 at index 127, the 127
/// positive decade values and 1.0 at index 255.
inline const std::array<float, 256>& dynamic_map() {
    static const std::array<float, 256> map = [] {
        const auto decade = dynamic_map_decade_values();
        std::array<float, 256> m{};
        for (std::size_t k = 0; k < 127; ++k) {
            m[126 - k] = -decade[k];
            m[128 + k] = decade[k];
        }
        m[127] = 0.0f;
        m[255] = 1.0f;
        return m;
    }();
    return map;
}

/// Finds the nearest map entry of a magnitude y in [0, 1] in O(1).
///
/// Magnitudes are the 129 values m_0 = 0 < m_1 < ... < m_128 = 1 (the non-negative half of
/// the map). With a midpoint mid_j between m_j and m_(j+1), the nearest index is the number
/// of midpoints below y. The table is indexed by the top 16 bits of y's float encoding
/// (exponent and 7 mantissa bits); each such cell holds at most one midpoint, so one
/// comparison finishes the job. Ties go to the lower map index: for positive values that
/// is the smaller magnitude (y > mid), for negative values the larger one (y >= mid).
struct magnitude_table {
    static constexpr std::uint32_t max_key = 0x3F80; // key of 1.0f
    std::array<float, 129> magnitudes{};
    std::array<float, 129> midpoints{};    // midpoints[128] = +inf
    std::vector<std::uint8_t> first_index; // per key: number of midpoints below the cell

    /// The same for a vector unit, in one gather: per key from `low_key` (smaller keys
    /// are clamped to it: its cell and all below hold no midpoint), the number of
    /// midpoints below the cell | (the low 16 bits of the midpoint inside the cell, or
    /// no_midpoint) << 8. Within a cell the low bits order values as the floats do.
    static constexpr std::uint32_t no_midpoint = 0x10000; // above every low-16-bit value
    std::uint32_t low_key = 0;
    std::vector<std::uint32_t> cells;

    static std::uint32_t key_of(float y) noexcept {
        return std::min(std::bit_cast<std::uint32_t>(y) >> 16, max_key);
    }

    /// Index into `magnitudes` of the entry nearest to y (y >= 0, finite, at most ~1).
    template <bool negative>
    std::uint32_t nearest(float y) const noexcept {
        const std::uint32_t j = first_index[key_of(y)];
        const float mid = midpoints[j];
        return j + static_cast<std::uint32_t>(negative ? y >= mid : y > mid);
    }

    /// True when every key cell holds at most one midpoint, the property nearest() relies on.
    bool cells_hold_at_most_one_midpoint() const {
        for (std::uint32_t key = 0; key <= max_key; ++key) {
            const float lo = std::bit_cast<float>(key << 16);
            const float hi = std::bit_cast<float>((key + 1) << 16);
            int inside = 0;
            for (float m : midpoints)
                inside += (m >= lo && m < hi) ? 1 : 0;
            if (inside > 1) return false;
        }
        return true;
    }
};

inline const magnitude_table& blockwise_magnitudes() {
    static const magnitude_table table = [] {
        magnitude_table t;
        const auto& map = dynamic_map();
        for (std::size_t j = 0; j < 129; ++j)
            t.magnitudes[j] = map[127 + j];
        for (std::size_t j = 0; j < 128; ++j)
            t.midpoints[j] = (t.magnitudes[j] + t.magnitudes[j + 1]) * 0.5f;
        t.midpoints[128] = std::numeric_limits<float>::infinity();
        // Three bytes of padding let a 32-bit gather read any entry.
        t.first_index.resize(magnitude_table::max_key + 1 + 3);
        std::uint32_t below = 0;
        for (std::uint32_t key = 0; key <= magnitude_table::max_key; ++key) {
            const float lo = std::bit_cast<float>(key << 16);
            while (below < 128 && t.midpoints[below] < lo)
                ++below;
            t.first_index[key] = static_cast<std::uint8_t>(below);
        }
        t.low_key = (std::bit_cast<std::uint32_t>(t.midpoints[0]) >> 16) - 1;
        for (std::uint32_t key = t.low_key; key <= magnitude_table::max_key; ++key) {
            const std::uint32_t below = t.first_index[key];
            const std::uint32_t mid = std::bit_cast<std::uint32_t>(t.midpoints[below]);
            const std::uint32_t low_bits =
                (mid >> 16) == key ? mid & 0xFFFFu : magnitude_table::no_midpoint;
            t.cells.push_back(below | (low_bits << 8));
        }
        return t;
    }();
    return table;
}

} // namespace hivemesh::compression::detail
