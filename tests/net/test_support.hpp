// Helpers shared by the net tests.
#pragma once

#include <hivemesh/core/random.hpp>
#include <hivemesh/crypto/identity.hpp>

#include <array>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <string_view>

namespace hivemesh::test {

/// `size` reproducible pseudo-random bytes.
inline byte_buffer pattern(std::size_t size, std::uint64_t seed) {
    random_generator rng(seed);
    byte_buffer out(size);
    for (auto& b : out)
        b = static_cast<std::byte>(rng() & 0xFF);
    return out;
}

/// The identity made from a seed of 32 bytes `n`: the same peer in every run.
inline crypto::identity identity_of(std::uint8_t n) {
    std::array<std::byte, 32> seed{};
    seed.fill(std::byte{n});
    return crypto::identity::from_seed(seed);
}

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

} // namespace hivemesh::test
