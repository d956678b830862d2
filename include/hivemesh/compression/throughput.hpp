// How fast this machine runs a codec: what the all-reduce's adaptive codec choice weighs
// against the link (averaging::allreduce_options::slow_link_codec).
#pragma once

#include "hivemesh/compression/compress.hpp"
#include "hivemesh/compression/kind.hpp"
#include "hivemesh/core/random.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <mutex>
#include <span>
#include <vector>

namespace hivemesh::compression {

/// Float32 bytes per second that `k` compresses and then decompresses, one after the other
/// on the calling thread (options and limits at their defaults): 4 x `elements` over the
/// best time of `repeats` runs, on values spread like a gradient's. Costs `repeats` runs,
/// a few milliseconds for the default 256 Ki elements with an optimised build. Returns 0
/// when the codec fails (an unknown kind).
inline double measure_throughput(kind k, std::size_t elements = std::size_t{1} << 18,
                                 int repeats = 3) {
    std::vector<float> values(std::max<std::size_t>(elements, 1)), decoded(values.size());
    random_generator rng(1);
    for (auto& v : values)
        v = static_cast<float>(0.01 * rng.normal());
    byte_buffer packed;
    packed.reserve(compressed_size(k, values.size()));
    using clock = std::chrono::steady_clock;
    clock::duration best = clock::duration::max();
    for (int run = 0; run < std::max(repeats, 1); ++run) {
        packed.clear();
        const auto start = clock::now();
        if (compress_into(k, values, packed) || decompress_into(packed, decoded)) return 0;
        best = std::min(best, clock::now() - start);
    }
    const double seconds =
        std::max(std::chrono::duration<double>(best).count(), 1e-9); // a coarse clock
    return 4.0 * static_cast<double>(values.size()) / seconds;
}

/// measure_throughput(k), measured on the first call for each codec and remembered for the
/// life of the process. Thread-safe.
inline double measured_throughput(kind k) {
    static std::mutex mutex;
    static std::array<double, 256> known{}; // by the kind's wire value; 0: not yet measured
    const auto index = static_cast<std::size_t>(k);
    std::lock_guard lock(mutex);
    if (known[index] == 0) known[index] = measure_throughput(k);
    return known[index];
}

} // namespace hivemesh::compression
