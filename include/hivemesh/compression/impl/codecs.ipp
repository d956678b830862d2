// The non-template functions of compression/codecs.hpp: the encoders, the validating
// decoders and the vector kernels they run.
#pragma once

#include "hivemesh/compression/codecs.hpp"
#include "hivemesh/compression/cpu_features.hpp"

#ifdef HIVEMESH_X86
#include <immintrin.h>
#endif

namespace hivemesh::compression::detail {

HIVEMESH_DECL void bin_means(std::span<const float> values, const std::uint8_t* codes,
                             std::span<float, codebook_size> codebook) {
    std::array<double, codebook_size> sums{};
    std::array<std::uint64_t, codebook_size> counts{};
    for (std::size_t i = 0; i < values.size(); ++i) {
        sums[codes[i]] += values[i];
        ++counts[codes[i]];
    }
    for (std::size_t b = 0; b < codebook_size; ++b)
        codebook[b] =
            counts[b] ? static_cast<float>(sums[b] / static_cast<double>(counts[b])) : 0.0f;
}

HIVEMESH_DECL void encode_meanstd(std::span<const float> in, std::size_t row_length,
                                  std::byte* out) {
    const std::size_t rows = in.size() / row_length;
    std::vector<float> means(rows), stds(rows), scaled(row_length);
    std::vector<std::uint16_t> halves(in.size());
    for (std::size_t r = 0; r < rows; ++r) {
        const auto row = in.subspan(r * row_length, row_length);
        double sum = 0;
        for (float v : row)
            sum += v;
        const double mean = sum / static_cast<double>(row_length);
        double squares = 0;
        for (float v : row)
            squares += (v - mean) * (v - mean);
        const float std_dev =
            std::max(static_cast<float>(std::sqrt(squares / static_cast<double>(row_length))),
                     std::numeric_limits<float>::epsilon());
        means[r] = static_cast<float>(mean);
        stds[r] = std_dev;
        for (std::size_t i = 0; i < row_length; ++i)
            scaled[i] = (row[i] - means[r]) / std_dev;
        floats_to_halves(scaled.data(), halves.data() + r * row_length, row_length);
    }
    const std::uint64_t stored_row_length = row_length;
    copy_bytes(out, &stored_row_length, 8);
    copy_bytes(out + 8, means.data(), 4 * rows);
    copy_bytes(out + 8 + 4 * rows, stds.data(), 4 * rows);
    copy_bytes(out + 8 + 8 * rows, halves.data(), 2 * in.size());
}

HIVEMESH_DECL void encode_uniform_8bit(std::span<const float> in, std::byte* out) {
    const std::size_t n = in.size();
    double sum = 0;
    for (float v : in)
        sum += v;
    const double mean = n ? sum / static_cast<double>(n) : 0.0;
    double squares = 0;
    for (float v : in)
        squares += (v - mean) * (v - mean);
    const double std_dev = n > 1 ? std::sqrt(squares / static_cast<double>(n - 1)) : 0.0;
    const float scale = static_cast<float>(6.0 * std_dev / codebook_size);
    auto* codes = reinterpret_cast<std::uint8_t*>(out + 4 * codebook_size);
    if (std::isnormal(scale)) {
        const auto centre = static_cast<float>(mean);
        for (std::size_t i = 0; i < n; ++i) {
            const float bin = std::nearbyint((in[i] - centre) / scale) + 128.0f;
            codes[i] = static_cast<std::uint8_t>(std::clamp(bin, 0.0f, 255.0f));
        }
    } else {
        std::memset(codes, 128, n); // constant input: one bin holds everything
    }
    std::array<float, codebook_size> codebook{};
    bin_means(in, codes, codebook);
    copy_bytes(out, codebook.data(), 4 * codebook_size);
}

HIVEMESH_DECL void sorted_quantiles(std::span<const float> sorted, std::span<float> quantiles) {
    const std::size_t m = sorted.size();
    for (std::size_t k = 0; k < quantiles.size(); ++k) {
        const double position = static_cast<double>(k) * static_cast<double>(m - 1) /
                                static_cast<double>(quantiles.size() - 1);
        const auto lower = static_cast<std::size_t>(position);
        const std::size_t upper = std::min(lower + 1, m - 1);
        const double fraction = position - static_cast<double>(lower);
        quantiles[k] =
            static_cast<float>(sorted[lower] + fraction * (sorted[upper] - sorted[lower]));
    }
}

HIVEMESH_DECL std::array<float, codebook_size - 1>
approximate_quantile_borders(std::span<const float> in) {
    constexpr std::size_t chunk = std::size_t{1} << 16;
    constexpr std::size_t points = codebook_size + 1;
    const std::size_t chunks = (in.size() + chunk - 1) / chunk;
    std::vector<float> per_chunk(chunks * points), scratch;
    for (std::size_t c = 0; c < chunks; ++c) {
        const auto part = in.subspan(c * chunk, std::min(chunk, in.size() - c * chunk));
        scratch.assign(part.begin(), part.end());
        std::sort(scratch.begin(), scratch.end());
        sorted_quantiles(scratch, std::span(per_chunk).subspan(c * points, points));
    }
    std::sort(per_chunk.begin(), per_chunk.end());
    std::array<float, points> overall{};
    sorted_quantiles(per_chunk, overall);
    std::array<float, codebook_size - 1> borders{};
    std::copy(overall.begin() + 1, overall.end() - 1, borders.begin());
    return borders;
}

HIVEMESH_DECL void encode_quantile_8bit(std::span<const float> in, std::byte* out) {
    auto* codes = reinterpret_cast<std::uint8_t*>(out + 4 * codebook_size);
    if (!in.empty()) {
        const auto borders = approximate_quantile_borders(in);
        for (std::size_t i = 0; i < in.size(); ++i) // code = number of borders below the value
            codes[i] = static_cast<std::uint8_t>(
                std::lower_bound(borders.begin(), borders.end(), in[i]) - borders.begin());
    }
    std::array<float, codebook_size> codebook{};
    bin_means(in, codes, codebook);
    copy_bytes(out, codebook.data(), 4 * codebook_size);
}

#ifdef HIVEMESH_X86
__attribute__((target("avx2"))) HIVEMESH_DECL void
quantize_block_avx2(std::span<const float> block, float absmax, std::uint8_t* codes) noexcept {
    const auto& table = blockwise_magnitudes();
    const auto* const cells = reinterpret_cast<const int*>(table.cells.data());
    const __m256 inverse = _mm256_set1_ps(1.0f / absmax);
    const __m256 magnitude_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    const __m256i low_key = _mm256_set1_epi32(static_cast<int>(table.low_key));
    const __m256i max_key = _mm256_set1_epi32(static_cast<int>(magnitude_table::max_key));
    const __m256i low_byte = _mm256_set1_epi32(0xFF);
    const __m256i low_bits = _mm256_set1_epi32(0xFFFF);
    const __m256i zero_code = _mm256_set1_epi32(127);
    // Gathers bytes 0, 4, 8, 12 of each 128-bit lane into its first four bytes.
    const __m256i pick_low_bytes =
        _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12,
                         -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    std::size_t i = 0;
    for (; i + 8 <= block.size(); i += 8) {
        const __m256 x = _mm256_loadu_ps(block.data() + i);
        const __m256i negative = _mm256_srai_epi32(_mm256_castps_si256(x), 31); // all ones if < 0
        const __m256i y =
            _mm256_castps_si256(_mm256_mul_ps(_mm256_and_ps(x, magnitude_mask), inverse));
        const __m256i key = _mm256_sub_epi32(
            _mm256_max_epu32(_mm256_min_epu32(_mm256_srli_epi32(y, 16), max_key), low_key),
            low_key);
        const __m256i cell = _mm256_i32gather_epi32(cells, key, 4);
        __m256i j = _mm256_and_si256(cell, low_byte);
        const __m256i mid = _mm256_srli_epi32(cell, 8);
        const __m256i below = _mm256_and_si256(y, low_bits);
        const __m256i above = _mm256_cmpgt_epi32(below, mid);
        const __m256i tie = _mm256_cmpeq_epi32(below, mid);
        j = _mm256_sub_epi32(j, _mm256_or_si256(above, _mm256_and_si256(tie, negative)));
        const __m256i positive_code = _mm256_add_epi32(zero_code, j);
        const __m256i negative_code = _mm256_sub_epi32(zero_code, _mm256_min_epu32(j, zero_code));
        const __m256i code = _mm256_shuffle_epi8(
            _mm256_blendv_epi8(positive_code, negative_code, negative), pick_low_bytes);
        const __m128i packed =
            _mm_unpacklo_epi32(_mm256_castsi256_si128(code), _mm256_extracti128_si256(code, 1));
        _mm_storel_epi64(reinterpret_cast<__m128i*>(codes + i), packed);
    }
    quantize_block_scalar<false>(block.subspan(i), absmax, codes + i);
}
#endif

#ifdef HIVEMESH_X86
__attribute__((target("avx2"))) HIVEMESH_DECL float
block_absmax_avx2(std::span<const float> block) noexcept {
    const __m256i magnitude_mask = _mm256_set1_epi32(0x7FFFFFFF);
    __m256i largest = _mm256_setzero_si256();
    std::size_t i = 0;
    for (; i + 8 <= block.size(); i += 8) {
        const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block.data() + i));
        largest = _mm256_max_epu32(largest, _mm256_and_si256(bits, magnitude_mask));
    }
    alignas(32) std::uint32_t lanes[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), largest);
    std::uint32_t result = 0;
    for (std::uint32_t lane : lanes)
        result = std::max(result, lane);
    for (; i < block.size(); ++i)
        result = std::max(result, std::bit_cast<std::uint32_t>(block[i]) & 0x7FFFFFFFu);
    return std::bit_cast<float>(result);
}
#endif

HIVEMESH_DECL void quantize_block(std::span<const float> block, float absmax,
                                  std::uint8_t* codes) noexcept {
    if (!std::isfinite(1.0f / absmax)) // tiny subnormal absmax: the reciprocal overflows
        return quantize_block_scalar<true>(block, absmax, codes);
#ifdef HIVEMESH_X86
    if (cpu().avx2) return quantize_block_avx2(block, absmax, codes);
#endif
    quantize_block_scalar<false>(block, absmax, codes);
}

HIVEMESH_DECL float block_absmax(std::span<const float> block) noexcept {
#ifdef HIVEMESH_X86
    if (cpu().avx2) return block_absmax_avx2(block);
#endif
    std::uint32_t largest = 0;
    for (float v : block)
        largest = std::max(largest, std::bit_cast<std::uint32_t>(v) & 0x7FFFFFFFu);
    return std::bit_cast<float>(largest);
}

#ifdef HIVEMESH_X86
/// All ones in the lanes of the 8 floats at `at` that are NaN or infinite.
__attribute__((target("avx2"))) inline __m256i non_finite_lanes(const __m256i* at) noexcept {
    const __m256i exponent = _mm256_set1_epi32(static_cast<int>(exponent_bits));
    return _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_loadu_si256(at), exponent), exponent);
}

__attribute__((target("avx2"))) HIVEMESH_DECL bool all_finite_avx2(const std::byte* bytes,
                                                                   std::size_t n) noexcept {
    const auto* at = reinterpret_cast<const __m256i*>(bytes);
    // Four accumulators: with one, each OR waits for the last, which halves the rate on
    // data in L1 or L2 (where a received part is checked).
    __m256i bad0 = _mm256_setzero_si256(), bad1 = bad0, bad2 = bad0, bad3 = bad0;
    std::size_t v = 0; // in vectors of 8
    for (; 8 * (v + 4) <= n; v += 4) {
        bad0 = _mm256_or_si256(bad0, non_finite_lanes(at + v));
        bad1 = _mm256_or_si256(bad1, non_finite_lanes(at + v + 1));
        bad2 = _mm256_or_si256(bad2, non_finite_lanes(at + v + 2));
        bad3 = _mm256_or_si256(bad3, non_finite_lanes(at + v + 3));
    }
    for (; 8 * (v + 1) <= n; ++v)
        bad0 = _mm256_or_si256(bad0, non_finite_lanes(at + v));
    const __m256i any = _mm256_or_si256(_mm256_or_si256(bad0, bad1), _mm256_or_si256(bad2, bad3));
    bool finite = _mm256_testz_si256(any, any) != 0;
    for (std::size_t i = 8 * v; i < n; ++i) {
        std::uint32_t bits;
        std::memcpy(&bits, bytes + 4 * i, 4);
        finite &= (bits & exponent_bits) != exponent_bits;
    }
    return finite;
}
#endif

HIVEMESH_DECL bool all_finite_portable(const std::byte* bytes, std::size_t n) noexcept {
    std::uint32_t bad = 0; // branch-free, so it vectorises
    for (std::size_t i = 0; i < n; ++i) {
        std::uint32_t bits;
        std::memcpy(&bits, bytes + 4 * i, 4);
        bad |= static_cast<std::uint32_t>((bits & exponent_bits) == exponent_bits);
    }
    return bad == 0;
}

HIVEMESH_DECL bool all_finite(const std::byte* bytes, std::size_t n) noexcept {
#ifdef HIVEMESH_X86
    if (cpu().avx2) return all_finite_avx2(bytes, n);
#endif
    return all_finite_portable(bytes, n);
}

HIVEMESH_DECL bool all_finite_halves(const std::byte* bytes, std::size_t n) noexcept {
    std::uint16_t bad = 0; // branch-free, so it vectorises
    for (std::size_t i = 0; i < n; ++i) {
        std::uint16_t bits;
        std::memcpy(&bits, bytes + 2 * i, 2);
        bad |= static_cast<std::uint16_t>((bits & 0x7C00u) == 0x7C00u);
    }
    return bad == 0;
}

HIVEMESH_DECL bool encode_blockwise_8bit(std::span<const float> in, std::size_t block_size,
                                         unsigned threads, std::byte* out) {
    const std::size_t blocks = block_count(in.size(), block_size);
    const std::uint32_t stored_block_size = static_cast<std::uint32_t>(block_size);
    copy_bytes(out, &stored_block_size, 4);
    auto* absmax_out = out + 4;
    auto* codes = reinterpret_cast<std::uint8_t*>(out + 4 + 4 * blocks);
    std::atomic<bool> finite{true};
    parallel_ranges(in.size(), block_size, threads, [&](std::size_t begin, std::size_t end) {
        for (std::size_t start = begin; start < end; start += block_size) {
            const auto block = in.subspan(start, std::min(block_size, end - start));
            const float absmax = block_absmax(block);
            copy_bytes(absmax_out + 4 * (start / block_size), &absmax, 4);
            if (std::bit_cast<std::uint32_t>(absmax) >= exponent_bits)
                finite.store(false, std::memory_order_relaxed);
            else if (absmax == 0.0f)
                std::memset(codes + start, 127, block.size());
            else
                quantize_block(block, absmax, codes + start);
        }
    });
    return finite.load(std::memory_order_relaxed);
}

HIVEMESH_DECL std::error_code encode(kind k, std::span<const float> in, const encode_params& p,
                                     std::byte* out) {
    switch (k) {
    case kind::none:
        parallel_ranges(in.size(), 1 << 16, p.threads, [&](std::size_t b, std::size_t e) {
            copy_bytes(out + 4 * b, in.data() + b, 4 * (e - b));
        });
        return {};
    case kind::float16: {
        // `out` may follow an odd-length prefix (compress_into appends): stage when unaligned.
        const bool aligned = reinterpret_cast<std::uintptr_t>(out) % alignof(std::uint16_t) == 0;
        parallel_ranges(in.size(), 1 << 16, p.threads, [&](std::size_t b, std::size_t e) {
            if (aligned) {
                floats_to_halves(in.data() + b, reinterpret_cast<std::uint16_t*>(out) + b, e - b);
                return;
            }
            std::vector<std::uint16_t> staged(e - b);
            floats_to_halves(in.data() + b, staged.data(), e - b);
            copy_bytes(out + 2 * b, staged.data(), 2 * (e - b));
        });
        return {};
    }
    case kind::meanstd_16bit:
        encode_meanstd(in, row_length_for(in.size(), p.row_length), out);
        return {};
    case kind::uniform_8bit:
        encode_uniform_8bit(in, out);
        return {};
    case kind::quantile_8bit:
        encode_quantile_8bit(in, out);
        return {};
    case kind::blockwise_8bit:
        if (!encode_blockwise_8bit(in, p.block_size, p.threads, out)) return errc::non_finite_input;
        return {};
    }
    return errc::unknown_codec;
}

HIVEMESH_DECL bool read_finite_floats(binary_reader& r, std::span<float> out,
                                      bool positive) noexcept {
    const byte_view bytes = r.read_bytes(4 * out.size());
    if (!r.ok()) return false;
    copy_bytes(out.data(), bytes.data(), bytes.size());
    for (float v : out)
        if (!std::isfinite(v) || (positive ? !(v > 0) : false)) return r.fail(errc::corrupt_data);
    return true;
}

HIVEMESH_DECL void decode_blockwise_8bit(binary_reader& r, std::span<float> out, unsigned threads,
                                         std::optional<float> add_scale) {
    const std::size_t n = out.size();
    const auto block_size = r.read<std::uint32_t>();
    if (!r.ok()) return;
    if (block_size < min_block_size || block_size > max_block_size) {
        r.fail(errc::corrupt_data);
        return;
    }
    const std::size_t blocks = block_count(n, block_size);
    const byte_view absmax_bytes = r.read_bytes(4 * blocks);
    const byte_view codes = r.read_bytes(n);
    if (r.finish()) return;
    std::vector<float> absmax(blocks);
    copy_bytes(absmax.data(), absmax_bytes.data(), absmax_bytes.size());
    for (float a : absmax)
        if (!std::isfinite(a) || a < 0) r.fail(errc::corrupt_data);
    if (!r.ok()) return;
    const auto& map = dynamic_map();
    parallel_ranges(n, block_size, threads, [&](std::size_t begin, std::size_t end) {
        std::array<float, 256> scaled;
        for (std::size_t start = begin; start < end; start += block_size) {
            for (std::size_t c = 0; c < 256; ++c)
                scaled[c] = map[c] * absmax[start / block_size];
            const std::size_t stop = std::min(end, start + block_size);
            if (add_scale) {
                for (float& v : scaled)
                    v *= *add_scale;
                for (std::size_t i = start; i < stop; ++i)
                    out[i] += scaled[static_cast<std::uint8_t>(codes[i])];
            } else {
                for (std::size_t i = start; i < stop; ++i)
                    out[i] = scaled[static_cast<std::uint8_t>(codes[i])];
            }
        }
    });
}

HIVEMESH_DECL std::error_code decode(kind k, binary_reader& r, std::span<float> out,
                                     unsigned threads) {
    const std::size_t n = out.size();
    switch (k) {
    case kind::none: {
        const byte_view bytes = r.read_bytes(4 * n);
        if (r.finish()) break;
        parallel_ranges(n, 1 << 16, threads, [&](std::size_t b, std::size_t e) {
            copy_bytes(out.data() + b, bytes.data() + 4 * b, 4 * (e - b));
        });
        break;
    }
    case kind::float16: {
        const byte_view bytes = r.read_bytes(2 * n);
        if (r.finish()) break;
        const auto* halves = reinterpret_cast<const std::uint16_t*>(bytes.data());
        parallel_ranges(n, 1 << 16, threads, [&](std::size_t b, std::size_t e) {
            if (reinterpret_cast<std::uintptr_t>(halves) % alignof(std::uint16_t) == 0) {
                halves_to_floats(halves + b, out.data() + b, e - b);
            } else { // unaligned buffer: stage through an aligned copy
                std::vector<std::uint16_t> staged(e - b);
                copy_bytes(staged.data(), bytes.data() + 2 * b, 2 * (e - b));
                halves_to_floats(staged.data(), out.data() + b, e - b);
            }
        });
        break;
    }
    case kind::meanstd_16bit: {
        const auto row_length = r.read<std::uint64_t>();
        if (!r.ok()) break;
        if (row_length == 0 || (n != 0 && n % row_length != 0) || (n == 0 && row_length != 1)) {
            r.fail(errc::corrupt_data);
            break;
        }
        const std::size_t rows = n / row_length;
        // All rows must be present before the per-row arrays are allocated.
        if (!r.check_count(rows, 8 + 2 * row_length, std::numeric_limits<std::size_t>::max()))
            break;
        std::vector<float> means(rows), stds(rows);
        if (!read_finite_floats(r, means, false) || !read_finite_floats(r, stds, true)) break;
        const byte_view bytes = r.read_bytes(2 * n);
        if (r.finish()) break;
        std::vector<std::uint16_t> halves(n);
        copy_bytes(halves.data(), bytes.data(), bytes.size());
        halves_to_floats(halves.data(), out.data(), n);
        for (std::size_t row = 0; row < rows; ++row)
            for (std::size_t i = row * row_length; i < (row + 1) * row_length; ++i)
                out[i] = out[i] * stds[row] + means[row];
        break;
    }
    case kind::uniform_8bit:
    case kind::quantile_8bit: {
        std::array<float, codebook_size> codebook{};
        if (!read_finite_floats(r, codebook, false)) break;
        const byte_view codes = r.read_bytes(n);
        if (r.finish()) break;
        for (std::size_t i = 0; i < n; ++i)
            out[i] = codebook[static_cast<std::uint8_t>(codes[i])];
        break;
    }
    case kind::blockwise_8bit:
        decode_blockwise_8bit(r, out, threads, std::nullopt);
        break;
    }
    return r.finish();
}

} // namespace hivemesh::compression::detail
