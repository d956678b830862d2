// The codecs: payload layouts, encoders and validating decoders.
//
// Payloads after the 16-byte header (all little-endian):
//   none            f32[count]
//   float16         u16[count]
//   meanstd_16bit   u64 row_length | f32 means[rows] | f32 stds[rows] | u16 values[count]
//   uniform_8bit    f32 codebook[256] | u8 codes[count]
//   quantile_8bit   f32 codebook[256] | u8 codes[count]
//   blockwise_8bit  u32 block_size | f32 absmax[blocks] | u8 codes[count]
#pragma once

#include "hivemesh/compression/cpu_features.hpp"
#include "hivemesh/compression/dynamic_map.hpp"
#include "hivemesh/compression/float16.hpp"
#include "hivemesh/compression/kind.hpp"
#include "hivemesh/core/binary.hpp"
#include "hivemesh/core/config.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <thread>
#include <vector>

namespace hivemesh::compression::detail {

static_assert(std::endian::native == std::endian::little,
              "payload arrays are stored in host order, which must be little-endian");

inline constexpr std::size_t min_block_size = 64;
inline constexpr std::size_t max_block_size = 4096;
inline constexpr std::size_t codebook_size = 256;

struct encode_params {
    std::size_t block_size = max_block_size;
    std::size_t row_length = 0; // 0: the whole tensor is one row
    unsigned threads = 1;
};

/// memcpy that accepts empty ranges, whose pointers may be null (UB for memcpy itself).
inline void copy_bytes(void* destination, const void* source, std::size_t size) noexcept {
    if (size != 0) std::memcpy(destination, source, size);
}

/// Runs fn(begin, end) over [0, n) split into at most `threads` ranges aligned to `grain`.
template <class Fn>
void parallel_ranges(std::size_t n, std::size_t grain, unsigned threads, Fn&& fn) {
    const std::size_t grains = (n + grain - 1) / grain;
    const std::size_t workers = std::min<std::size_t>(std::max(threads, 1u), grains);
    if (workers <= 1) {
        fn(std::size_t{0}, n);
        return;
    }
    const std::size_t per_worker = (grains + workers - 1) / workers * grain;
    std::vector<std::jthread> pool;
    pool.reserve(workers - 1);
    for (std::size_t w = 1; w < workers; ++w) {
        const std::size_t begin = std::min(n, w * per_worker);
        const std::size_t end = std::min(n, begin + per_worker);
        pool.emplace_back([&fn, begin, end] { fn(begin, end); });
    }
    fn(std::size_t{0}, std::min(n, per_worker));
}

inline std::size_t row_length_for(std::size_t n, std::size_t requested) noexcept {
    return requested == 0 ? std::max<std::size_t>(n, 1) : requested;
}

inline std::size_t block_count(std::size_t n, std::size_t block_size) noexcept {
    return (n + block_size - 1) / block_size;
}

/// Bytes after the header for n elements.
inline std::size_t payload_size(kind k, std::size_t n, const encode_params& p) noexcept {
    switch (k) {
    case kind::none:
        return 4 * n;
    case kind::float16:
        return 2 * n;
    case kind::meanstd_16bit:
        return 8 + 8 * (n / row_length_for(n, p.row_length)) + 2 * n;
    case kind::uniform_8bit:
    case kind::quantile_8bit:
        return 4 * codebook_size + n;
    case kind::blockwise_8bit:
        return 4 + 4 * block_count(n, p.block_size) + n;
    }
    return 0;
}

/// Sets codebook[b] to the mean of the values whose code is b (0 for empty bins), so the
/// decoded tensor keeps the sum of the original.
HIVEMESH_DECL void bin_means(std::span<const float> values, const std::uint8_t* codes,
                             std::span<float, codebook_size> codebook);

// ---------------------------------------------------------------- encoders

HIVEMESH_DECL void encode_meanstd(std::span<const float> in, std::size_t row_length,
                                  std::byte* out);

HIVEMESH_DECL void encode_uniform_8bit(std::span<const float> in, std::byte* out);

/// Quantiles at k/(count-1), k = 0..count-1, of sorted data, interpolated linearly.
HIVEMESH_DECL void sorted_quantiles(std::span<const float> sorted, std::span<float> quantiles);

/// Bin borders from quantiles of per-chunk quantiles: sorting fixed-size chunks instead
/// of the whole tensor keeps the cost near-linear, and the fixed chunk size makes the
/// result independent of the thread count.
HIVEMESH_DECL std::array<float, codebook_size - 1>
approximate_quantile_borders(std::span<const float> in);

HIVEMESH_DECL void encode_quantile_8bit(std::span<const float> in, std::byte* out);

template <bool exact_division>
void quantize_block_scalar(std::span<const float> block, float absmax,
                           std::uint8_t* codes) noexcept {
    // Locals, not table members: stores through `codes` (a char type) may alias anything,
    // which would force the compiler to reload the table pointers on every element.
    const auto& table = blockwise_magnitudes();
    const std::uint8_t* const first_index = table.first_index.data();
    const float* const midpoints = table.midpoints.data();
    const float inverse = 1.0f / absmax;
    for (std::size_t i = 0; i < block.size(); ++i) {
        const float x = block[i];
        const float y = exact_division ? std::fabs(x) / absmax : std::fabs(x) * inverse;
        const std::uint32_t negative = std::bit_cast<std::uint32_t>(x) >> 31;
        std::uint32_t j = first_index[magnitude_table::key_of(y)];
        const float mid = midpoints[j];
        // Branch-free: signs are random, so a branch would mispredict half the time.
        j +=
            static_cast<std::uint32_t>(y > mid) | (negative & static_cast<std::uint32_t>(y == mid));
        const std::uint32_t positive_code = 127 + j;
        const std::uint32_t negative_code = 127 - std::min(j, 127u);
        codes[i] = static_cast<std::uint8_t>(negative ? negative_code : positive_code);
    }
}

#ifdef HIVEMESH_X86
/// AVX2 form of quantize_block_scalar<false>, eight elements at a time; same codes. One
/// gather per eight: the cell's midpoint is compared by its low bits (magnitude_table::cells).
__attribute__((target("avx2"))) HIVEMESH_DECL void
quantize_block_avx2(std::span<const float> block, float absmax, std::uint8_t* codes) noexcept;
#endif

#ifdef HIVEMESH_X86
__attribute__((target("avx2"))) HIVEMESH_DECL float
block_absmax_avx2(std::span<const float> block) noexcept;
#endif

/// Codes of one block whose absmax is positive and finite.
HIVEMESH_DECL void quantize_block(std::span<const float> block, float absmax,
                                  std::uint8_t* codes) noexcept;

/// Largest magnitude in the block, found by integer comparison of the magnitude bits (the
/// same order as the floats), which vectorises without fast-math flags.
HIVEMESH_DECL float block_absmax(std::span<const float> block) noexcept;

/// The exponent bits of a float32: all ones exactly for NaN and infinity.
inline constexpr std::uint32_t exponent_bits = 0x7F800000u;

#ifdef HIVEMESH_X86
__attribute__((target("avx2"))) HIVEMESH_DECL bool all_finite_avx2(const std::byte* bytes,
                                                                   std::size_t n) noexcept;
#endif

/// all_finite() without run-time dispatch.
HIVEMESH_DECL bool all_finite_portable(const std::byte* bytes, std::size_t n) noexcept;

/// True when none of the `n` float32 values stored at `bytes` (native byte order, any
/// alignment) is NaN or infinite. One pass of an AND, a compare and an OR per value.
HIVEMESH_DECL bool all_finite(const std::byte* bytes, std::size_t n) noexcept;

/// True when no element is NaN or infinite.
inline bool all_finite(std::span<const float> values) noexcept {
    return all_finite(reinterpret_cast<const std::byte*>(values.data()), values.size());
}

/// True when none of the `n` float16 values at `bytes` (any alignment) is NaN or infinite:
/// those have all five exponent bits set.
HIVEMESH_DECL bool all_finite_halves(const std::byte* bytes, std::size_t n) noexcept;

/// Returns false, with `out` half written, when `in` holds a NaN or infinity: a block's
/// largest magnitude shows it, so the input needs no separate finite pass.
HIVEMESH_DECL bool encode_blockwise_8bit(std::span<const float> in, std::size_t block_size,
                                         unsigned threads, std::byte* out);

/// Writes the payload of `in` encoded with `k` to `out` (payload_size bytes). The caller
/// has checked the parameters and, for the statistical codecs other than blockwise_8bit,
/// that the input is finite; blockwise_8bit finds non-finite input itself and returns
/// non_finite_input, with `out` half written.
HIVEMESH_DECL std::error_code encode(kind k, std::span<const float> in, const encode_params& p,
                                     std::byte* out);

// ---------------------------------------------------------------- decoders

/// Reads `n` floats from the payload that must all be finite (and positive if asked).
HIVEMESH_DECL bool read_finite_floats(binary_reader& r, std::span<float> out,
                                      bool positive) noexcept;

/// Decodes a blockwise_8bit payload into `out` or, given `add_scale`, adds add_scale times
/// each value to `out` (the same roundings as decoding first, without a scratch pass).
/// `out` is written only once every field has been validated.
HIVEMESH_DECL void decode_blockwise_8bit(binary_reader& r, std::span<float> out, unsigned threads,
                                         std::optional<float> add_scale);

/// Decodes the payload that follows a validated header into `out` (size == count). Every
/// field is checked, and the payload must end exactly where the buffer does; `out` is
/// written only once the whole buffer has been validated.
HIVEMESH_DECL std::error_code decode(kind k, binary_reader& r, std::span<float> out,
                                     unsigned threads);

} // namespace hivemesh::compression::detail

#if !defined(HIVEMESH_SEPARATE_COMPILATION)
#include "hivemesh/compression/impl/codecs.ipp"
#endif
