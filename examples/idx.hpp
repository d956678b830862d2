// Reader for the IDX files of MNIST and Fashion-MNIST, plain or gzip-compressed.
//
// IDX layout: u8 0 | u8 0 | u8 element type | u8 rank | u32 big-endian dims[rank] | data.
// Every length is checked against the bytes present; a malformed or missing file raises
// idx_error with a message naming the file and the problem, never undefined behaviour.
// Examples only (needs zlib); the collaborative trainer example reuses it.
#pragma once

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

namespace hivemesh::examples {

/// A missing, unreadable or malformed dataset file; what() says which and why.
class idx_error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

/// A dataset file that does not exist under any of the accepted names.
class idx_missing_file : public idx_error {
public:
    using idx_error::idx_error;
};

/// Element type 0x08 of the IDX format; the only one MNIST-style datasets use.
inline constexpr std::uint8_t idx_unsigned_byte = 0x08;

/// Files larger than this (after decompression) are refused: Fashion-MNIST's largest is
/// 47 MB, and the cap keeps a corrupt or hostile .gz from exhausting memory.
inline constexpr std::size_t max_idx_file_bytes = std::size_t{1} << 30;

/// An IDX array of unsigned bytes in row-major order.
struct idx_array {
    std::vector<std::uint32_t> dims;
    std::vector<std::uint8_t> values; ///< product(dims) elements
};

namespace detail {

struct gz_closer {
    void operator()(gzFile file) const noexcept { gzclose(file); }
};

[[noreturn]] inline void throw_malformed(const std::string& name, const std::string& problem) {
    throw idx_error(name + ": " + problem);
}

/// zlib's messages start with "<path>: "; the caller adds the path itself.
inline std::string without_prefix(const std::string& message, const std::string& path) {
    const std::string prefix = path + ": ";
    return message.starts_with(prefix) ? message.substr(prefix.size()) : message;
}

inline std::string hex_byte(std::uint8_t value) {
    char text[8];
    std::snprintf(text, sizeof text, "0x%02x", static_cast<unsigned>(value));
    return text;
}

} // namespace detail

/// Reads a whole file, inflating it if it is gzip-compressed; zlib passes any other file
/// through unchanged, so `name.gz` and an uncompressed `name` both work.
inline std::vector<std::uint8_t> read_maybe_gzip(const std::filesystem::path& path,
                                                 std::size_t max_bytes = max_idx_file_bytes) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec))
        throw idx_error(path.string() + ": not found or not a regular file");
    errno = 0;
    const std::unique_ptr<gzFile_s, detail::gz_closer> file(gzopen(path.c_str(), "rb"));
    if (!file)
        throw idx_error(path.string() +
                        ": cannot open: " + (errno ? std::strerror(errno) : "out of memory"));
    gzbuffer(file.get(), 1u << 17); // fewer read() calls than the 8 KiB default

    std::vector<std::uint8_t> bytes;
    constexpr std::size_t chunk = std::size_t{1} << 20;
    for (;;) {
        // Read at most one byte past the limit, enough to tell that the limit was passed.
        const std::size_t want = std::min(chunk, max_bytes + 1 - bytes.size());
        const std::size_t old_size = bytes.size();
        bytes.resize(old_size + want);
        const int got = gzread(file.get(), bytes.data() + old_size, static_cast<unsigned>(want));
        if (got < 0) {
            int code = Z_OK;
            const std::string message = gzerror(file.get(), &code);
            throw idx_error(path.string() + ": read failed: " +
                            (code == Z_ERRNO ? std::strerror(errno)
                                             : detail::without_prefix(message, path.string())));
        }
        bytes.resize(old_size + static_cast<std::size_t>(got));
        if (bytes.size() > max_bytes)
            throw idx_error(path.string() + ": larger than " + std::to_string(max_bytes) +
                            " bytes once decompressed");
        if (got == 0) break;
    }
    // A truncated .gz ends with a short read and the error recorded here.
    int code = Z_OK;
    const std::string message = gzerror(file.get(), &code);
    if (code != Z_OK)
        throw idx_error(path.string() +
                        ": corrupt gzip data: " + detail::without_prefix(message, path.string()));
    return bytes;
}

/// Parses IDX bytes holding unsigned bytes with exactly `expected_rank` dimensions.
/// `name` (usually the path) prefixes every error message.
inline idx_array parse_idx(std::span<const std::uint8_t> bytes, std::size_t expected_rank,
                           const std::string& name) {
    if (bytes.size() < 4)
        detail::throw_malformed(name, "too short for an IDX header (" +
                                          std::to_string(bytes.size()) + " bytes)");
    if (bytes[0] != 0 || bytes[1] != 0)
        detail::throw_malformed(name, "not an IDX file (first bytes " + detail::hex_byte(bytes[0]) +
                                          " " + detail::hex_byte(bytes[1]) +
                                          ", expected 0x00 0x00)");
    if (bytes[2] != idx_unsigned_byte)
        detail::throw_malformed(name, "element type " + detail::hex_byte(bytes[2]) +
                                          " is not supported (expected 0x08, unsigned byte)");
    const std::size_t rank = bytes[3];
    if (rank != expected_rank)
        detail::throw_malformed(name, "has " + std::to_string(rank) + " dimensions, expected " +
                                          std::to_string(expected_rank));
    const std::size_t header = 4 + 4 * rank;
    if (bytes.size() < header)
        detail::throw_malformed(name, "header truncated: " + std::to_string(bytes.size()) +
                                          " bytes, the " + std::to_string(rank) +
                                          " dimensions need " + std::to_string(header));

    idx_array result;
    result.dims.resize(rank);
    const std::size_t available = bytes.size() - header;
    std::size_t count = 1;
    std::string shape;
    for (std::size_t d = 0; d < rank; ++d) {
        const std::uint8_t* p = bytes.data() + 4 + 4 * d;
        const std::uint32_t dim = (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) |
                                  (std::uint32_t{p[2]} << 8) | std::uint32_t{p[3]};
        result.dims[d] = dim;
        shape += (d ? " x " : "") + std::to_string(dim);
        // Dividing instead of multiplying first keeps the product from overflowing.
        if (dim != 0 && count > available / dim)
            count = available + 1;
        else
            count *= dim;
    }
    if (count != available)
        detail::throw_malformed(
            name, "dimensions " + shape + " do not match the " + std::to_string(available) +
                      " data bytes present (" +
                      (count > available ? "file truncated" : "trailing bytes") + ")");
    result.values.assign(bytes.begin() + static_cast<std::ptrdiff_t>(header), bytes.end());
    return result;
}

/// Reads and parses one IDX file (see read_maybe_gzip and parse_idx).
inline idx_array read_idx(const std::filesystem::path& path, std::size_t expected_rank) {
    const std::vector<std::uint8_t> bytes = read_maybe_gzip(path);
    return parse_idx(bytes, expected_rank, path.string());
}

/// `directory/stem` if it exists, else `directory/stem.gz`; idx_missing_file naming both if
/// neither does.
inline std::filesystem::path find_idx_file(const std::filesystem::path& directory,
                                           const std::string& stem) {
    const std::filesystem::path plain = directory / stem;
    std::filesystem::path gzipped = plain;
    gzipped += ".gz";
    std::error_code ec;
    if (std::filesystem::exists(plain, ec)) return plain;
    if (std::filesystem::exists(gzipped, ec)) return gzipped;
    throw idx_missing_file("missing data file: neither " + plain.string() + " nor " +
                           gzipped.string() + " exists");
}

/// MNIST-style labelled images: `count` images of rows x cols bytes, one label each.
struct labelled_images {
    std::size_t count = 0;
    std::size_t rows = 0;
    std::size_t cols = 0;
    std::vector<std::uint8_t> pixels; ///< count * rows * cols, image after image
    std::vector<std::uint8_t> labels; ///< count, each below `classes`
    std::filesystem::path image_file;
    std::filesystem::path label_file;
    static constexpr std::size_t classes = 10;

    std::size_t pixels_per_image() const noexcept { return rows * cols; }
};

/// Loads split `prefix` ("train" or "t10k") of Fashion-MNIST or MNIST from `directory`:
/// `<prefix>-images-idx3-ubyte[.gz]` and `<prefix>-labels-idx1-ubyte[.gz]`. Checks that the
/// images are 28 x 28, that both files agree on the count and that every label is 0..9.
/// `limit` keeps only the first images; asking for more than the file holds is an error.
inline labelled_images load_mnist_style(const std::filesystem::path& directory,
                                        const std::string& prefix,
                                        std::optional<std::size_t> limit = std::nullopt) {
    labelled_images data;
    data.image_file = find_idx_file(directory, prefix + "-images-idx3-ubyte");
    data.label_file = find_idx_file(directory, prefix + "-labels-idx1-ubyte");
    idx_array images = read_idx(data.image_file, 3);
    idx_array labels = read_idx(data.label_file, 1);
    const std::string image_name = data.image_file.string();
    if (images.dims[1] != 28 || images.dims[2] != 28)
        throw idx_error(image_name + ": images are " + std::to_string(images.dims[1]) + " x " +
                        std::to_string(images.dims[2]) + ", expected 28 x 28");
    if (images.dims[0] != labels.dims[0])
        throw idx_error(image_name + " holds " + std::to_string(images.dims[0]) + " images but " +
                        data.label_file.string() + " holds " + std::to_string(labels.dims[0]) +
                        " labels");
    if (images.dims[0] == 0) throw idx_error(image_name + ": holds no images");
    for (std::size_t i = 0; i < labels.values.size(); ++i)
        if (labels.values[i] >= labelled_images::classes)
            throw idx_error(data.label_file.string() + ": label " +
                            std::to_string(labels.values[i]) + " at index " + std::to_string(i) +
                            " is not a class 0..9");
    data.rows = images.dims[1];
    data.cols = images.dims[2];
    data.count = images.dims[0];
    if (limit) {
        if (*limit == 0 || *limit > data.count)
            throw idx_error("asked for " + std::to_string(*limit) + " images; " + image_name +
                            " holds " + std::to_string(data.count));
        data.count = *limit;
    }
    images.values.resize(data.count * data.pixels_per_image());
    labels.values.resize(data.count);
    data.pixels = std::move(images.values);
    data.labels = std::move(labels.values);
    return data;
}

} // namespace hivemesh::examples
