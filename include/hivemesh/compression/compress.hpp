// The public face of tensor compression: float32 values to self-describing bytes and back.
#pragma once

#include "hivemesh/compression/codecs.hpp"
#include "hivemesh/compression/format.hpp"
#include "hivemesh/compression/kind.hpp"
#include "hivemesh/core/binary.hpp"
#include "hivemesh/core/config.hpp"
#include "hivemesh/core/error.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <system_error>
#include <vector>

namespace hivemesh::compression {

/// Encoder settings. Everything a decoder needs is written into the buffer.
struct options {
    /// blockwise_8bit: elements per block, 64..4096.
    std::size_t block_size = detail::max_block_size;
    /// meanstd_16bit: elements per row (each row has its own mean and std); it must divide
    /// the element count. 0 makes the whole tensor one row.
    std::size_t row_length = 0;
    /// none, float16 and blockwise_8bit split large tensors across this many threads.
    unsigned threads = 1;
    /// Recorded in the header for the receiver; the values are always given as float32.
    dtype original = dtype::float32;
};

/// Decoder limits for buffers from untrusted sources.
struct limits {
    /// Largest element count accepted; larger buffers fail with length_limit_exceeded.
    std::uint64_t max_elements = std::uint64_t{1} << 32;
    /// none, float16 and blockwise_8bit decode large tensors on this many threads.
    unsigned threads = 1;
};

/// True for the codecs that cannot represent NaN or infinity and refuse such input (every
/// codec but none and float16).
constexpr bool refuses_non_finite(kind k) noexcept {
    return k != kind::none && k != kind::float16;
}

/// True when no element is NaN or infinite (AVX2 where the CPU has it).
inline bool all_finite(std::span<const float> values) noexcept {
    return detail::all_finite(values);
}

/// Exact size in bytes of `count` elements compressed with `k`.
inline std::size_t compressed_size(kind k, std::size_t count, const options& opts = {}) noexcept {
    return header_size +
           detail::payload_size(k, count, {opts.block_size, opts.row_length, opts.threads});
}

namespace detail {

/// validate() without the finite check.
HIVEMESH_DECL std::error_code check_options(kind k, std::size_t count,
                                            const options& opts) noexcept;

} // namespace detail

/// Checks `opts` and `values` for codec `k`; returns invalid_argument for a bad block size
/// or row length, non_finite_input for NaN or infinity given to a statistical codec.
///
/// Non-finite rule: `none` keeps every bit; `float16` keeps NaN and clamps infinities and
/// out-of-range values to +-65504; the statistical codecs (meanstd_16bit, uniform_8bit,
/// quantile_8bit, blockwise_8bit) refuse non-finite input, because one NaN or infinity
/// would poison the statistics of every other element.
HIVEMESH_DECL std::error_code validate(kind k, std::span<const float> values,
                                       const options& opts) noexcept;

/// Appends the compressed form of `values` to `out`. On error `out` is unchanged.
HIVEMESH_DECL std::error_code compress_into(kind k, std::span<const float> values, byte_buffer& out,
                                            const options& opts = {});

/// Where `none`'s payload is the floats' own bytes (the format is little-endian), so that
/// append_none_header() and the values, sent after it from where they are, make the bytes
/// compress_into(kind::none) would.
inline constexpr bool none_payload_is_native = std::endian::native == std::endian::little;

/// Appends the header of `count` values compressed with `none` to `out`.
inline void append_none_header(std::size_t count, byte_buffer& out,
                               dtype original = dtype::float32) {
    binary_writer writer(out);
    detail::write_header(writer, {kind::none, original, count});
}

/// The value bytes of `buffer` (4·count of them, little-endian float32, not checked for
/// finiteness) if it is a well-formed `none` buffer of `count` elements; nullopt for
/// anything else (another codec or count, a bad header, missing or trailing bytes). For a
/// reader that combines several buffers in one pass over their values.
HIVEMESH_DECL std::optional<byte_view> none_values(byte_view buffer, std::size_t count,
                                                   const limits& lim = {}) noexcept;

/// Compresses `values` with codec `k` into a new self-describing buffer.
/// Throws std::system_error with errc::invalid_argument, unknown_codec or non_finite_input.
HIVEMESH_DECL byte_buffer compress(kind k, std::span<const float> values, const options& opts = {});

/// Reads and validates the header of a compressed buffer without decoding it.
HIVEMESH_DECL std::error_code read_header(byte_view buffer, header& result,
                                          const limits& lim = {}) noexcept;

/// Decodes `buffer` into `out`, whose size must equal the encoded element count
/// (size_mismatch otherwise). Errors: truncated_input, bad_magic, unsupported_version,
/// unknown_codec, corrupt_data, trailing_data, length_limit_exceeded. On error `out` is
/// unchanged.
HIVEMESH_DECL std::error_code decompress_into(byte_view buffer, std::span<float> out,
                                              const limits& lim = {});

namespace detail {

/// Codecs whose decoder can only produce finite values once it has validated the buffer:
/// a finite codebook, or finite block scales times map entries of magnitude at most 1. A
/// value read from their output needs no finite check.
constexpr bool decodes_finite(kind k) noexcept {
    return k == kind::uniform_8bit || k == kind::quantile_8bit || k == kind::blockwise_8bit;
}

/// Decodes `buffer` (which must hold `n` elements), checks every value is finite, then calls
/// apply(begin, count, value_at) over consecutive chunks, where value_at(i) is element
/// begin + i. `none` is read where it is and float16 converted a chunk at a time, so neither
/// needs `scratch`; the other codecs decode into it.
template <class Apply>
std::error_code decode_finite(byte_view buffer, std::size_t n, std::vector<float>& scratch,
                              const limits& lim, Apply&& apply) {
    binary_reader reader(buffer);
    const header h = read_header(reader, lim.max_elements);
    if (!reader.ok()) return reader.error();
    if (h.count != n) return errc::size_mismatch;
    if (h.codec == kind::none) {
        const byte_view bytes = reader.read_bytes(4 * n);
        if (auto ec = reader.finish()) return ec;
        const std::byte* raw = bytes.data();
        if (!all_finite(raw, n)) return errc::non_finite_input;
        apply(0, n, [raw](std::size_t i) {
            float v;
            std::memcpy(&v, raw + 4 * i, sizeof v);
            return v;
        });
        return {};
    }
    if (h.codec == kind::float16) {
        const byte_view bytes = reader.read_bytes(2 * n);
        if (auto ec = reader.finish()) return ec;
        if (!all_finite_halves(bytes.data(), n)) return errc::non_finite_input;
        constexpr std::size_t chunk = 2048; // staged aligned, converted, applied: in L1
        std::array<std::uint16_t, chunk> halves;
        std::array<float, chunk> values;
        for (std::size_t begin = 0; begin < n; begin += chunk) {
            const std::size_t count = std::min(chunk, n - begin);
            std::memcpy(halves.data(), bytes.data() + 2 * begin, 2 * count);
            halves_to_floats(halves.data(), values.data(), count);
            apply(begin, count, [&values](std::size_t i) { return values[i]; });
        }
        return {};
    }
    scratch.resize(n);
    if (auto ec = decode(h.codec, reader, scratch, lim.threads)) return ec;
    if (!decodes_finite(h.codec) && !all_finite(scratch)) return errc::non_finite_input;
    const float* values = scratch.data();
    apply(0, n, [values](std::size_t i) { return values[i]; });
    return {};
}

} // namespace detail

/// As decompress_into, and refuses a buffer holding NaN or infinity (non_finite_input), as
/// values from an untrusted peer must be. On error `out` is unchanged. `scratch` is working
/// memory for meanstd_16bit and uniform/quantile_8bit (`none` and float16 are checked in
/// their encoded form; the 8-bit codecs cannot decode a non-finite value).
HIVEMESH_DECL std::error_code decompress_finite_into(byte_view buffer, std::span<float> out,
                                                     std::vector<float>& scratch,
                                                     const limits& lim = {});

/// Adds `scale` times each decoded value of `buffer` to `sum` (a weighted reduction without
/// a temporary for `none`, float16 and blockwise_8bit). Errors and `scratch` as
/// decompress_finite_into; on error `sum` is unchanged.
HIVEMESH_DECL std::error_code decompress_add(byte_view buffer, std::span<float> sum, float scale,
                                             std::vector<float>& scratch, const limits& lim = {});

/// Validates `buffer` as decompress_finite_into does (it must hold `count` elements, all
/// finite) and sets `norm` to the L2 norm of its values, summed in double precision, without
/// writing them anywhere (a screen for values from an untrusted peer). Errors and `scratch`
/// as decompress_finite_into (blockwise_8bit decodes into `scratch` too); on error `norm`
/// is unchanged.
HIVEMESH_DECL std::error_code decompress_norm(byte_view buffer, std::size_t count, double& norm,
                                              std::vector<float>& scratch, const limits& lim = {});

/// Non-throwing decompress(): returns an empty vector and sets `ec` on error.
HIVEMESH_DECL std::vector<float> decompress(byte_view buffer, std::error_code& ec,
                                            const limits& lim = {});

/// Decodes a buffer made by compress(). Throws std::system_error on malformed input (see
/// decompress_into); never allocates more than the buffer's contents justify.
HIVEMESH_DECL std::vector<float> decompress(byte_view buffer, const limits& lim = {});

} // namespace hivemesh::compression

#if !defined(HIVEMESH_SEPARATE_COMPILATION)
#include "hivemesh/compression/impl/compress.ipp"
#endif
