// float32 <-> IEEE 754 binary16 conversion: portable bit arithmetic, plus F16C on x86
// CPUs that have it (checked at run time, so no -march flag is needed).
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "hivemesh/core/config.hpp"

namespace hivemesh::compression::detail {

inline constexpr float float16_max = 65504.0f;

/// Round-to-nearest-even conversion; NaN stays NaN, out-of-range values become infinity
/// (callers clamp first to keep them finite).
constexpr std::uint16_t float_to_half_bits(float value) noexcept {
    const std::uint32_t f = std::bit_cast<std::uint32_t>(value);
    const std::uint32_t sign = (f >> 16) & 0x8000u;
    const std::uint32_t abs = f & 0x7FFFFFFFu;
    if (abs >= 0x7F800000u) // inf or NaN (keep a quiet NaN payload bit)
        return static_cast<std::uint16_t>(sign | 0x7C00u | (abs > 0x7F800000u ? 0x200u : 0u));
    if (abs >= 0x477FF000u) // rounds to >= 65520: overflow
        return static_cast<std::uint16_t>(sign | 0x7C00u);
    if (abs < 0x38800000u) { // below the smallest normal half: subnormal or zero
        if (abs < 0x33000000u) return static_cast<std::uint16_t>(sign); // < 2^-25 rounds to 0
        const std::uint32_t exponent = abs >> 23;
        const std::uint32_t mantissa = (abs & 0x7FFFFFu) | 0x800000u;
        const std::uint32_t shift = 126u - exponent; // 14..24
        std::uint32_t half = mantissa >> shift;
        const std::uint32_t rest = mantissa & ((1u << shift) - 1u);
        const std::uint32_t halfway = 1u << (shift - 1u);
        if (rest > halfway || (rest == halfway && (half & 1u))) ++half;
        return static_cast<std::uint16_t>(sign | half);
    }
    std::uint32_t half = ((abs - 0x38000000u) >> 13); // rebias exponent 127 -> 15
    const std::uint32_t rest = abs & 0x1FFFu;
    if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;
    return static_cast<std::uint16_t>(sign | half);
}

constexpr float half_bits_to_float(std::uint16_t h) noexcept {
    const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
    const std::uint32_t exponent = (h >> 10) & 0x1Fu;
    std::uint32_t mantissa = h & 0x3FFu;
    if (exponent == 0x1F) return std::bit_cast<float>(sign | 0x7F800000u | (mantissa << 13));
    if (exponent != 0)
        return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
    if (mantissa == 0) return std::bit_cast<float>(sign);
    // Subnormal half: normalise.
    std::uint32_t e = 113;
    while ((mantissa & 0x400u) == 0) {
        mantissa <<= 1;
        --e;
    }
    return std::bit_cast<float>(sign | (e << 23) | ((mantissa & 0x3FFu) << 13));
}

/// Clamps to +-65504 with NaN passing through unchanged.
constexpr float clamp_to_half_range(float x) noexcept {
    return x > float16_max ? float16_max : (x < -float16_max ? -float16_max : x);
}

/// Converts n floats to clamped halves (F16C where the CPU has it).
HIVEMESH_DECL void floats_to_halves(const float* in, std::uint16_t* out, std::size_t n) noexcept;

/// Converts n halves to floats (F16C where the CPU has it).
HIVEMESH_DECL void halves_to_floats(const std::uint16_t* in, float* out, std::size_t n) noexcept;

} // namespace hivemesh::compression::detail

#if !defined(HIVEMESH_SEPARATE_COMPILATION)
#include "hivemesh/compression/impl/float16.ipp"
#endif
