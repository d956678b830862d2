// Bytes for the tests: literal bytes, hex text for messages and exact oracles, and
// reproducible pseudo-random bytes.
#pragma once

#include <hivemesh/core/bytes.hpp>
#include <hivemesh/core/random.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <string_view>

namespace hivemesh::test {

/// The bytes with these values (each 0..255), for exact oracles.
inline byte_buffer bytes_of(std::initializer_list<int> values) {
    byte_buffer out;
    for (const int v : values)
        out.push_back(static_cast<std::byte>(v));
    return out;
}

/// The bytes of `text`.
inline byte_buffer bytes_of(std::string_view text) {
    return to_buffer(as_bytes(text));
}

/// Bytes as space-separated lowercase hex pairs, for messages and exact oracles.
inline std::string hex(byte_view b) {
    std::string out;
    char digits[4];
    for (std::size_t i = 0; i < b.size(); ++i) {
        std::snprintf(digits, sizeof digits, i == 0 ? "%02x" : " %02x",
                      static_cast<unsigned>(b[i]));
        out += digits;
    }
    return out;
}

/// `size` bytes drawn from `rng`, one draw each (its low byte).
inline byte_buffer random_bytes(random_generator& rng, std::size_t size) {
    byte_buffer out(size);
    for (auto& b : out)
        b = static_cast<std::byte>(rng() & 0xFF);
    return out;
}

/// `size` reproducible pseudo-random bytes: the same for the same seed in every run.
inline byte_buffer random_bytes(std::size_t size, std::uint64_t seed) {
    random_generator rng(seed);
    return random_bytes(rng, size);
}

} // namespace hivemesh::test
