// compression/float16.hpp's array conversions: F16C where the CPU has it, else bit arithmetic.
#pragma once

#include "hivemesh/compression/cpu_features.hpp"
#include "hivemesh/compression/float16.hpp"

#ifdef HIVEMESH_X86
#include <immintrin.h>
#endif

namespace hivemesh::compression::detail {

#ifdef HIVEMESH_X86
__attribute__((target("avx,f16c"))) HIVEMESH_DECL void
floats_to_halves_f16c(const float* in, std::uint16_t* out, std::size_t n) noexcept {
    const __m256 hi = _mm256_set1_ps(float16_max);
    const __m256 lo = _mm256_set1_ps(-float16_max);
    std::size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        // min/max return their second operand when either is NaN: NaN passes through.
        __m256 v = _mm256_loadu_ps(in + i);
        v = _mm256_max_ps(lo, _mm256_min_ps(hi, v));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                         _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    for (; i < n; ++i)
        out[i] = float_to_half_bits(clamp_to_half_range(in[i]));
}

__attribute__((target("avx,f16c"))) HIVEMESH_DECL void
halves_to_floats_f16c(const std::uint16_t* in, float* out, std::size_t n) noexcept {
    std::size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(
            out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
    for (; i < n; ++i)
        out[i] = half_bits_to_float(in[i]);
}

#endif

HIVEMESH_DECL void floats_to_halves(const float* in, std::uint16_t* out, std::size_t n) noexcept {
#ifdef HIVEMESH_X86
    if (cpu().f16c) return floats_to_halves_f16c(in, out, n);
#endif
    for (std::size_t i = 0; i < n; ++i)
        out[i] = float_to_half_bits(clamp_to_half_range(in[i]));
}

HIVEMESH_DECL void halves_to_floats(const std::uint16_t* in, float* out, std::size_t n) noexcept {
#ifdef HIVEMESH_X86
    if (cpu().f16c) return halves_to_floats_f16c(in, out, n);
#endif
    for (std::size_t i = 0; i < n; ++i)
        out[i] = half_bits_to_float(in[i]);
}

} // namespace hivemesh::compression::detail
