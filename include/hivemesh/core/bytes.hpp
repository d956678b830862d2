// Byte buffers and views.
#pragma once

#include <cstddef>
#include <cstring>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

namespace hivemesh {

using byte_buffer = std::vector<std::byte>;
using byte_view = std::span<const std::byte>;

/// Views the bytes of a string without copying.
inline byte_view as_bytes(std::string_view s) noexcept {
    return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

/// Views the object representation of a span of trivially copyable values.
template <class T>
requires std::is_trivially_copyable_v<T> byte_view as_bytes(std::span<const T> values)
noexcept {
    return std::as_bytes(values);
}

/// Copies a byte view into an owning buffer.
inline byte_buffer to_buffer(byte_view bytes) {
    return byte_buffer(bytes.begin(), bytes.end());
}

/// Views bytes as characters, e.g. for printing or comparing with string literals.
inline std::string_view as_string_view(byte_view bytes) noexcept {
    return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

} // namespace hivemesh
