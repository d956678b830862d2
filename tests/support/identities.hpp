// Identities for the tests, made from seeds so every run meets the same peers.
#pragma once

#include "support/bytes.hpp"

#include <hivemesh/core/random.hpp>
#include <hivemesh/crypto/identity.hpp>

#include <cstdint>

namespace hivemesh::test {

/// The 32-byte identity seed with every byte `fill`.
inline byte_buffer seed_of(std::uint8_t fill) {
    return byte_buffer(32, std::byte{fill});
}

/// The identity whose seed is 32 bytes `fill`.
inline crypto::identity identity_of(std::uint8_t fill) {
    return crypto::identity::from_seed(seed_of(fill));
}

/// The identity whose seed is the next 32 bytes of `rng` (see random_bytes).
inline crypto::identity random_identity(random_generator& rng) {
    return crypto::identity::from_seed(random_bytes(rng, 32));
}

/// The identity whose seed is 32 pseudo-random bytes from `seed`.
inline crypto::identity random_identity(std::uint64_t seed) {
    random_generator rng(seed);
    return random_identity(rng);
}

} // namespace hivemesh::test
