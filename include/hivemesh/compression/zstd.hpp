// zstd for non-tensor byte payloads (metadata, serialized state), with a size threshold
// below which the bytes are stored as they are.
//
// Layout: u8 method (0 stored, 1 zstd) | u64 original size | payload
#pragma once

#include "hivemesh/core/binary.hpp"
#include "hivemesh/core/error.hpp"

#include <zstd.h>

#include <cstdint>
#include <system_error>

namespace hivemesh::compression {

struct byte_options {
    /// Payloads shorter than this are stored uncompressed: zstd rarely pays off there.
    std::size_t threshold = 512;
    /// zstd level (1 fastest .. 19 smallest; negative levels trade ratio for speed).
    int level = 3;
};

namespace detail {
enum class byte_method : std::uint8_t { stored = 0, zstd = 1 };
inline constexpr std::size_t byte_header_size = 9;
} // namespace detail

/// Appends the (possibly zstd-compressed) form of `input` to `out`. A payload that zstd
/// does not shrink is stored. Errors: compression_failed. On error `out` is unchanged.
inline std::error_code compress_bytes_into(byte_view input, byte_buffer& out,
                                           const byte_options& opts = {}) {
    const std::size_t start = out.size();
    binary_writer writer(out);
    writer.write(static_cast<std::uint8_t>(detail::byte_method::zstd));
    writer.write(static_cast<std::uint64_t>(input.size()));
    if (input.size() >= opts.threshold) {
        const std::size_t bound = ZSTD_compressBound(input.size());
        std::byte* dst = writer.grow(bound);
        // The frame carries a checksum, so corruption in transit is detected on decode.
        ZSTD_CCtx* context = ZSTD_createCCtx();
        if (!context) {
            out.resize(start);
            return errc::compression_failed;
        }
        ZSTD_CCtx_setParameter(context, ZSTD_c_compressionLevel, opts.level);
        ZSTD_CCtx_setParameter(context, ZSTD_c_checksumFlag, 1);
        const std::size_t written = ZSTD_compress2(context, dst, bound, input.data(), input.size());
        ZSTD_freeCCtx(context);
        if (ZSTD_isError(written)) {
            out.resize(start);
            return errc::compression_failed;
        }
        if (written < input.size()) {
            out.resize(start + detail::byte_header_size + written);
            return {};
        }
        out.resize(start + detail::byte_header_size);
    }
    out[start] = static_cast<std::byte>(detail::byte_method::stored);
    writer.write_bytes(input);
    return {};
}

/// Compresses `input`; throws std::system_error on a zstd failure.
inline byte_buffer compress_bytes(byte_view input, const byte_options& opts = {}) {
    byte_buffer out;
    throw_if_error(compress_bytes_into(input, out, opts), "hivemesh::compression::compress_bytes");
    return out;
}

/// Decodes a buffer made by compress_bytes, refusing to produce more than `max_size` bytes
/// (length_limit_exceeded). Other errors: truncated_input, corrupt_data, trailing_data.
/// Returns an empty buffer on error.
inline byte_buffer decompress_bytes(byte_view input, std::size_t max_size, std::error_code& ec) {
    binary_reader reader(input);
    const auto method = static_cast<detail::byte_method>(reader.read<std::uint8_t>());
    const auto size = reader.read<std::uint64_t>();
    byte_buffer out;
    if (!reader.ok()) {
        ec = reader.error();
    } else if (size > max_size) {
        ec = errc::length_limit_exceeded;
    } else if (method == detail::byte_method::stored) {
        const byte_view bytes = reader.read_bytes(size);
        if (!(ec = reader.finish())) out.assign(bytes.begin(), bytes.end());
    } else if (method == detail::byte_method::zstd) {
        const byte_view frame = reader.rest();
        // The frame must declare exactly the size the header promised, and must be one
        // frame with nothing after it.
        if (ZSTD_getFrameContentSize(frame.data(), frame.size()) != size ||
            ZSTD_findFrameCompressedSize(frame.data(), frame.size()) != frame.size()) {
            ec = errc::corrupt_data;
        } else {
            out.resize(size);
            const std::size_t got =
                ZSTD_decompress(out.data(), out.size(), frame.data(), frame.size());
            if (ZSTD_isError(got) || got != size) {
                ec = errc::corrupt_data;
                out.clear();
            } else {
                ec = {};
            }
        }
    } else {
        ec = errc::corrupt_data;
    }
    return out;
}

/// Throwing form of decompress_bytes.
inline byte_buffer decompress_bytes(byte_view input, std::size_t max_size) {
    std::error_code ec;
    auto out = decompress_bytes(input, max_size, ec);
    throw_if_error(ec, "hivemesh::compression::decompress_bytes");
    return out;
}

} // namespace hivemesh::compression
