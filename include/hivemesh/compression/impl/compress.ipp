// The non-template functions of compression/compress.hpp: checking options, compressing
// and decompressing whole buffers.
#pragma once

#include "hivemesh/compression/compress.hpp"

namespace hivemesh::compression {

namespace detail {

HIVEMESH_DECL std::error_code check_options(kind k, std::size_t count,
                                            const options& opts) noexcept {
    if (!is_known(k)) return errc::unknown_codec;
    if (!is_known(opts.original)) return errc::invalid_argument;
    if (k == kind::blockwise_8bit &&
        (opts.block_size < min_block_size || opts.block_size > max_block_size))
        return errc::invalid_argument;
    if (k == kind::meanstd_16bit && opts.row_length != 0 &&
        (count % opts.row_length != 0 || count == 0))
        return errc::invalid_argument;
    return {};
}

} // namespace detail

HIVEMESH_DECL std::error_code validate(kind k, std::span<const float> values,
                                       const options& opts) noexcept {
    if (auto ec = detail::check_options(k, values.size(), opts)) return ec;
    if (refuses_non_finite(k) && !detail::all_finite(values)) return errc::non_finite_input;
    return {};
}

HIVEMESH_DECL std::error_code compress_into(kind k, std::span<const float> values, byte_buffer& out,
                                            const options& opts) {
    if (auto ec = detail::check_options(k, values.size(), opts)) return ec;
    // blockwise_8bit sees a non-finite value in its block scales: no separate pass.
    if (refuses_non_finite(k) && k != kind::blockwise_8bit && !detail::all_finite(values))
        return errc::non_finite_input;
    const detail::encode_params params{opts.block_size, opts.row_length, opts.threads};
    const std::size_t payload = detail::payload_size(k, values.size(), params);
    const std::size_t start = out.size();
    try {
        out.reserve(start + header_size + payload);
        binary_writer writer(out);
        detail::write_header(writer, {k, opts.original, values.size()});
        if (k == kind::none && params.threads <= 1) { // one copy, without zero-filling first
            const auto* bytes = reinterpret_cast<const std::byte*>(values.data());
            out.insert(out.end(), bytes, bytes + payload);
        } else if (auto ec = detail::encode(k, values, params, writer.grow(payload))) {
            out.resize(start);
            return ec;
        }
    } catch (...) {
        out.resize(start);
        throw;
    }
    return {};
}

HIVEMESH_DECL byte_buffer compress(kind k, std::span<const float> values, const options& opts) {
    byte_buffer out;
    throw_if_error(compress_into(k, values, out, opts), "hivemesh::compression::compress");
    return out;
}

HIVEMESH_DECL std::error_code read_header(byte_view buffer, header& result,
                                          const limits& lim) noexcept {
    binary_reader reader(buffer);
    result = detail::read_header(reader, lim.max_elements);
    return reader.error();
}

HIVEMESH_DECL std::optional<byte_view> none_values(byte_view buffer, std::size_t count,
                                                   const limits& lim) noexcept {
    binary_reader reader(buffer);
    const header h = detail::read_header(reader, lim.max_elements);
    if (!reader.ok() || h.codec != kind::none || h.count != count) return std::nullopt;
    const byte_view bytes = reader.read_bytes(4 * count);
    if (reader.finish()) return std::nullopt;
    return bytes;
}

HIVEMESH_DECL std::error_code decompress_into(byte_view buffer, std::span<float> out,
                                              const limits& lim) {
    binary_reader reader(buffer);
    const header h = detail::read_header(reader, lim.max_elements);
    if (!reader.ok()) return reader.error();
    if (h.count != out.size()) return errc::size_mismatch;
    return detail::decode(h.codec, reader, out, lim.threads);
}

HIVEMESH_DECL std::error_code decompress_finite_into(byte_view buffer, std::span<float> out,
                                                     std::vector<float>& scratch,
                                                     const limits& lim) {
    header h;
    if (auto ec = read_header(buffer, h, lim)) return ec;
    // Straight into `out`, which decoders write only once the buffer proved valid.
    if (detail::decodes_finite(h.codec)) return decompress_into(buffer, out, lim);
    return detail::decode_finite(buffer, out.size(), scratch, lim,
                                 [out](std::size_t begin, std::size_t count, auto value_at) {
                                     for (std::size_t i = 0; i < count; ++i)
                                         out[begin + i] = value_at(i);
                                 });
}

HIVEMESH_DECL std::error_code decompress_add(byte_view buffer, std::span<float> sum, float scale,
                                             std::vector<float>& scratch, const limits& lim) {
    binary_reader reader(buffer);
    const header h = detail::read_header(reader, lim.max_elements);
    if (!reader.ok()) return reader.error();
    if (h.codec == kind::blockwise_8bit) { // finite by construction; added as it decodes
        if (h.count != sum.size()) return errc::size_mismatch;
        detail::decode_blockwise_8bit(reader, sum, lim.threads, scale);
        return reader.finish();
    }
    return detail::decode_finite(buffer, sum.size(), scratch, lim,
                                 [sum, scale](std::size_t begin, std::size_t count, auto value_at) {
                                     for (std::size_t i = 0; i < count; ++i)
                                         sum[begin + i] += scale * value_at(i);
                                 });
}

HIVEMESH_DECL std::error_code decompress_norm(byte_view buffer, std::size_t count, double& norm,
                                              std::vector<float>& scratch, const limits& lim) {
    double squares = 0;
    auto add = [&squares](std::size_t, std::size_t n, auto value_at) {
        for (std::size_t i = 0; i < n; ++i) {
            const double v = value_at(i);
            squares += v * v;
        }
    };
    header h;
    if (auto ec = read_header(buffer, h, lim)) return ec;
    if (detail::decodes_finite(h.codec)) {
        if (h.count != count) return errc::size_mismatch;
        scratch.resize(count);
        if (auto ec = decompress_into(buffer, scratch, lim)) return ec;
        add(0, count, [&scratch](std::size_t i) { return scratch[i]; });
    } else if (auto ec = detail::decode_finite(buffer, count, scratch, lim, add)) {
        return ec;
    }
    norm = std::sqrt(squares);
    return {};
}

HIVEMESH_DECL std::vector<float> decompress(byte_view buffer, std::error_code& ec,
                                            const limits& lim) {
    header h;
    ec = read_header(buffer, h, lim);
    // Each element takes at least one payload byte, so the allocation below is bounded by
    // the size of the input.
    if (!ec && h.count > buffer.size()) ec = errc::truncated_input;
    if (ec) return {};
    std::vector<float> values(static_cast<std::size_t>(h.count));
    ec = decompress_into(buffer, values, lim);
    if (ec) values.clear();
    return values;
}

HIVEMESH_DECL std::vector<float> decompress(byte_view buffer, const limits& lim) {
    std::error_code ec;
    auto values = decompress(buffer, ec, lim);
    throw_if_error(ec, "hivemesh::compression::decompress");
    return values;
}

} // namespace hivemesh::compression
