// The bounded little-endian binary reader and writer behind every hivemesh wire format.
//
// The reader never trusts a length: every count is checked against the bytes that remain
// and against a caller-supplied maximum before anything is allocated. Errors are sticky:
// after the first failure every read returns a zero value, so a decoder can parse a whole
// message and check `error()` once.
#pragma once

#include "hivemesh/core/bytes.hpp"
#include "hivemesh/core/error.hpp"

#include <bit>
#include <concepts>
#include <cstdint>
#include <limits>
#include <string>
#include <system_error>

namespace hivemesh {

static_assert(std::endian::native == std::endian::little ||
              std::endian::native == std::endian::big);

/// `value` in little-endian byte order (a no-op on little-endian machines); the same call
/// converts back.
template <std::integral T>
constexpr T byteswap_if_big(T value) noexcept {
    if constexpr (std::endian::native == std::endian::big && sizeof(T) > 1) {
        auto u = static_cast<std::make_unsigned_t<T>>(value);
        std::make_unsigned_t<T> r = 0;
        for (std::size_t i = 0; i < sizeof(T); ++i) {
            r = static_cast<decltype(r)>((r << 8) | (u & 0xFF));
            u = static_cast<decltype(u)>(u >> 8);
        }
        return static_cast<T>(r);
    } else {
        return value;
    }
}

/// Stores `value` as 4 little-endian bytes at `out`.
inline void store_le32(std::byte* out, std::uint32_t value) noexcept {
    for (int i = 0; i < 4; ++i)
        out[i] = static_cast<std::byte>((value >> (8 * i)) & 0xFF);
}

/// Loads 4 little-endian bytes at `in`.
inline std::uint32_t load_le32(const std::byte* in) noexcept {
    std::uint32_t value = 0;
    for (int i = 0; i < 4; ++i)
        value |= static_cast<std::uint32_t>(in[i]) << (8 * i);
    return value;
}

/// Appends little-endian fields to a byte buffer it does not own.
class binary_writer {
public:
    explicit binary_writer(byte_buffer& out) noexcept
        : out_(&out) {}

    template <std::integral T>
    void write(T value) {
        const T le = byteswap_if_big(value);
        append(&le, sizeof le);
    }
    void write_f32(float value) { write(std::bit_cast<std::uint32_t>(value)); }
    void write_f64(double value) { write(std::bit_cast<std::uint64_t>(value)); }

    /// Raw bytes with no length prefix.
    void write_bytes(byte_view bytes) { append(bytes.data(), bytes.size()); }

    /// A u32 length followed by the bytes.
    void write_sized_bytes(byte_view bytes) {
        if (bytes.size() > std::numeric_limits<std::uint32_t>::max())
            throw std::system_error(errc::length_limit_exceeded, "binary_writer: field over 4 GiB");
        write(static_cast<std::uint32_t>(bytes.size()));
        write_bytes(bytes);
    }
    void write_string(std::string_view s) { write_sized_bytes(as_bytes(s)); }
    /// One byte, 0 or 1.
    void write_flag(bool flag) { write(static_cast<std::uint8_t>(flag ? 1 : 0)); }

    /// Reserves `n` bytes at the end and returns a pointer to them, for in-place encoding.
    std::byte* grow(std::size_t n) {
        const std::size_t old = out_->size();
        out_->resize(old + n);
        return out_->data() + old;
    }

    std::size_t size() const noexcept { return out_->size(); }
    byte_buffer& buffer() noexcept { return *out_; }

private:
    void append(const void* data, std::size_t n) {
        if (n == 0) return;
        std::memcpy(grow(n), data, n);
    }
    byte_buffer* out_;
};

/// Reads little-endian fields from a byte view with bounds checks and a sticky error.
class binary_reader {
public:
    explicit binary_reader(byte_view input) noexcept
        : input_(input) {}

    template <std::integral T>
    T read() noexcept {
        T value{};
        if (!take(sizeof value)) return T{};
        std::memcpy(&value, input_.data() + pos_ - sizeof value, sizeof value);
        return byteswap_if_big(value);
    }
    float read_f32() noexcept { return std::bit_cast<float>(read<std::uint32_t>()); }
    double read_f64() noexcept { return std::bit_cast<double>(read<std::uint64_t>()); }

    /// Returns a view of the next `n` bytes, or an empty view and `truncated_input`.
    byte_view read_bytes(std::size_t n) noexcept {
        if (!take(n)) return {};
        return input_.subspan(pos_ - n, n);
    }

    /// Reads a u32 length (at most `max_length`) followed by that many bytes.
    byte_view read_sized_bytes(std::size_t max_length) noexcept {
        const auto n = read<std::uint32_t>();
        if (!check_count(n, 1, max_length)) return {};
        return read_bytes(n);
    }
    std::string read_string(std::size_t max_length) {
        return std::string(as_string_view(read_sized_bytes(max_length)));
    }
    /// One byte, 0 or 1; any other value fails with corrupt_data.
    bool read_flag() noexcept {
        const auto flag = read<std::uint8_t>();
        if (flag > 1) fail(errc::corrupt_data);
        return flag == 1;
    }

    /// Reads a u64 element count and checks, before anything is allocated, that it is at
    /// most `max_count` and that `count * element_size` bytes remain. Returns 0 on failure.
    std::size_t read_count(std::size_t element_size, std::size_t max_count) noexcept {
        const auto n = read<std::uint64_t>();
        if (!check_count(n, element_size, max_count)) return 0;
        return static_cast<std::size_t>(n);
    }

    /// Checks that `count` elements of `element_size` bytes could follow and that `count`
    /// does not exceed `max_count`; sets the error otherwise.
    bool check_count(std::uint64_t count, std::size_t element_size,
                     std::size_t max_count) noexcept {
        if (ec_) return false;
        if (count > max_count) return fail(errc::length_limit_exceeded);
        if (element_size != 0 && count > remaining() / element_size)
            return fail(errc::truncated_input);
        return true;
    }

    /// Marks the input invalid; the first error wins.
    bool fail(std::error_code ec) noexcept {
        if (!ec_) ec_ = ec;
        pos_ = input_.size();
        return false;
    }
    bool fail(errc e) noexcept { return fail(make_error_code(e)); }

    /// Sets `trailing_data` unless the whole input was consumed.
    std::error_code finish() noexcept {
        if (!ec_ && pos_ != input_.size()) fail(errc::trailing_data);
        return ec_;
    }

    std::error_code error() const noexcept { return ec_; }
    bool ok() const noexcept { return !ec_; }
    std::size_t remaining() const noexcept { return input_.size() - pos_; }
    std::size_t position() const noexcept { return pos_; }
    byte_view rest() const noexcept { return input_.subspan(pos_); }

private:
    bool take(std::size_t n) noexcept {
        if (ec_) return false;
        if (n > remaining()) return fail(errc::truncated_input);
        pos_ += n;
        return true;
    }

    byte_view input_;
    std::size_t pos_ = 0;
    std::error_code ec_;
};

} // namespace hivemesh
