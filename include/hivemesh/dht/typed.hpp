// Typed DHT values: turn small structs into the bytes a record stores and back.
//
// `value_codec<T>` is the customisation point. Provided encodings (a value is the whole
// record value, so nothing carries a length prefix):
//   - integers and enums: little-endian, sizeof(T) bytes; bool: one byte, 0 or 1
//   - float and double: their IEEE bit patterns, little-endian
//   - std::string, byte_buffer: the bytes as they are
//   - trivially copyable classes without padding (std::has_unique_object_representations):
//     their object bytes; little-endian hosts only. Every bit pattern of every member must
//     be a valid value (no bool, pointer or enum-with-restricted-values members);
//     specialise value_codec for anything else
//   - std::vector of any fixed-size type above: the elements one after another
// Decoding checks the exact size: too few bytes are truncated_input, too many
// trailing_data; a bool byte other than 0 or 1 is corrupt_data.
//
// Users specialise value_codec for their own types:
//   template <> struct hivemesh::dht::value_codec<my_type> {
//       static byte_buffer encode(const my_type&);
//       static std::error_code decode(byte_view, my_type&);  // never throws
//   };
#pragma once

#include "hivemesh/core/binary.hpp"
#include "hivemesh/core/bytes.hpp"
#include "hivemesh/core/error.hpp"

#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <string>
#include <system_error>
#include <type_traits>
#include <vector>

namespace hivemesh::dht {

/// How values of type T are stored in the DHT; specialise it for your own types.
template <class T>
struct value_codec;

/// Types with a usable value_codec.
template <class T>
concept value_encodable = requires(const T& value, byte_view bytes, T& out) {
    { value_codec<T>::encode(value) } -> std::same_as<byte_buffer>;
    { value_codec<T>::decode(bytes, out) } -> std::same_as<std::error_code>;
};

namespace detail {

template <class T>
concept wire_integer = std::is_integral_v<T> && !std::is_same_v<T, bool>;

template <class T>
concept wire_float = std::is_floating_point_v<T> && std::numeric_limits<T>::is_iec559 &&
    (sizeof(T) == 4 || sizeof(T) == 8); // not long double: it has padding

template <class T>
concept wire_struct = std::is_class_v<T> && std::is_trivially_copyable_v<T> &&
    std::has_unique_object_representations_v<T>;

template <class T>
concept fixed_size_value = wire_integer<T> || wire_float<T> || std::is_same_v<T, bool> ||
    std::is_enum_v<T> || wire_struct<T>;

/// Stores and loads one fixed-size value at a given address.
template <fixed_size_value T>
struct fixed_codec {
    static constexpr std::size_t size = sizeof(T);

    static void store(std::byte* out, const T& value) noexcept {
        if constexpr (std::is_same_v<T, bool>) {
            *out = std::byte{value ? std::uint8_t{1} : std::uint8_t{0}};
        } else if constexpr (std::is_enum_v<T>) {
            fixed_codec<std::underlying_type_t<T>>::store(
                out, static_cast<std::underlying_type_t<T>>(value));
        } else if constexpr (wire_float<T>) {
            using bits = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
            fixed_codec<bits>::store(out, std::bit_cast<bits>(value));
        } else if constexpr (wire_integer<T>) {
            const T le = byteswap_if_big(value);
            std::memcpy(out, &le, sizeof le);
        } else {
            static_assert(std::endian::native == std::endian::little,
                          "value_codec for structs stores object bytes: little-endian hosts only");
            std::memcpy(out, &value, sizeof value);
        }
    }

    /// False if the bytes are not a valid T (a bool other than 0 or 1).
    static bool load(const std::byte* in, T& value) noexcept {
        if constexpr (std::is_same_v<T, bool>) {
            const auto byte = std::to_integer<std::uint8_t>(*in);
            value = byte == 1;
            return byte <= 1;
        } else if constexpr (std::is_enum_v<T>) {
            std::underlying_type_t<T> raw{};
            if (!fixed_codec<std::underlying_type_t<T>>::load(in, raw)) return false;
            value = static_cast<T>(raw);
            return true;
        } else if constexpr (wire_float<T>) {
            using bits = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
            bits raw{};
            fixed_codec<bits>::load(in, raw);
            value = std::bit_cast<T>(raw);
            return true;
        } else if constexpr (wire_integer<T>) {
            T le{};
            std::memcpy(&le, in, sizeof le);
            value = byteswap_if_big(le);
            return true;
        } else {
            std::memcpy(&value, in, sizeof value);
            return true;
        }
    }
};

/// The error for `size` bytes where exactly `expected` were due.
inline std::error_code size_error(std::size_t size, std::size_t expected) noexcept {
    if (size < expected) return errc::truncated_input;
    if (size > expected) return errc::trailing_data;
    return {};
}

} // namespace detail

/// Numbers, enums and padding-free trivially copyable classes: exactly sizeof(T) bytes.
template <class T>
requires detail::fixed_size_value<T>
struct value_codec<T> {
    static byte_buffer encode(const T& value) {
        byte_buffer out(sizeof(T));
        detail::fixed_codec<T>::store(out.data(), value);
        return out;
    }
    static std::error_code decode(byte_view bytes, T& out) noexcept {
        if (const auto ec = detail::size_error(bytes.size(), sizeof(T))) return ec;
        T value{};
        if (!detail::fixed_codec<T>::load(bytes.data(), value)) return errc::corrupt_data;
        out = value;
        return {};
    }
};

/// Text as its bytes (not checked for UTF-8).
template <>
struct value_codec<std::string> {
    static byte_buffer encode(const std::string& value) { return to_buffer(as_bytes(value)); }
    static std::error_code decode(byte_view bytes, std::string& out) noexcept {
        try {
            out.assign(as_string_view(bytes));
        } catch (const std::bad_alloc&) {
            return std::make_error_code(std::errc::not_enough_memory);
        }
        return {};
    }
};

/// Bytes as they are.
template <>
struct value_codec<byte_buffer> {
    static byte_buffer encode(const byte_buffer& value) { return value; }
    static std::error_code decode(byte_view bytes, byte_buffer& out) noexcept {
        try {
            out.assign(bytes.begin(), bytes.end());
        } catch (const std::bad_alloc&) {
            return std::make_error_code(std::errc::not_enough_memory);
        }
        return {};
    }
};

/// Vectors of fixed-size values: the elements back to back, count = size / sizeof(T).
template <class T>
requires detail::fixed_size_value<T>
struct value_codec<std::vector<T>> {
    static byte_buffer encode(const std::vector<T>& values) {
        byte_buffer out(values.size() * sizeof(T));
        for (std::size_t i = 0; i < values.size(); ++i)
            detail::fixed_codec<T>::store(out.data() + i * sizeof(T), values[i]);
        return out;
    }
    static std::error_code decode(byte_view bytes, std::vector<T>& out) noexcept {
        if (bytes.size() % sizeof(T) != 0) return errc::truncated_input; // a cut element
        try {
            std::vector<T> values(bytes.size() / sizeof(T));
            for (std::size_t i = 0; i < values.size(); ++i) {
                T value{};
                if (!detail::fixed_codec<T>::load(bytes.data() + i * sizeof(T), value))
                    return errc::corrupt_data;
                values[i] = value; // through a local: std::vector<bool> has no T&
            }
            out = std::move(values);
        } catch (const std::bad_alloc&) {
            return std::make_error_code(std::errc::not_enough_memory);
        }
        return {};
    }
};

/// The bytes a record stores for `value`.
template <value_encodable T>
byte_buffer encode_value(const T& value) {
    return value_codec<T>::encode(value);
}

/// Decodes a record's value into `out`; on failure `out` is left as it was (for the
/// provided codecs). Errors: truncated_input, trailing_data, corrupt_data, or the custom
/// codec's own.
template <value_encodable T>
std::error_code decode_value(byte_view bytes, T& out) {
    return value_codec<T>::decode(bytes, out);
}

} // namespace hivemesh::dht
