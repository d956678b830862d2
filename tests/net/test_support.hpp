// Helpers shared by the net tests.
#pragma once

#include <hivemesh/core/random.hpp>
#include <hivemesh/crypto/identity.hpp>

#include <array>

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

} // namespace hivemesh::test
