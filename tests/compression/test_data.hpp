// Deterministic inputs shared by the compression tests, and the names they use unqualified
// (only the tests in tests/compression/ include this header).
#pragma once

#include <hivemesh/compression.hpp>
#include <hivemesh/core/bytes.hpp>
#include <hivemesh/core/error.hpp>
#include <hivemesh/core/random.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace hivemesh::test {

enum class pattern { zeros, constant, normal };

inline const char* to_string(pattern p) {
    switch (p) {
    case pattern::zeros:
        return "zeros";
    case pattern::constant:
        return "constant";
    case pattern::normal:
        return "normal";
    }
    return "?";
}

inline std::vector<float> make_data(pattern p, std::size_t n, std::uint64_t seed = 7) {
    std::vector<float> values(n, p == pattern::constant ? 0.375f : 0.0f);
    if (p == pattern::normal) {
        random_generator rng(seed);
        for (auto& v : values)
            v = static_cast<float>(rng.normal());
    }
    return values;
}

struct error_stats {
    double mse = 0, relative_l2 = 0, mean_abs = 0, mean_relative = 0, max_abs = 0;
};

inline error_stats compare(const std::vector<float>& x, const std::vector<float>& y) {
    error_stats s;
    double squared = 0, norm = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
        const double d = std::abs(static_cast<double>(x[i]) - y[i]);
        squared += d * d;
        norm += static_cast<double>(x[i]) * x[i];
        s.mean_abs += d;
        s.mean_relative += d / (std::abs(static_cast<double>(x[i])) + 1e-8);
        s.max_abs = std::max(s.max_abs, d);
    }
    const auto n = static_cast<double>(std::max<std::size_t>(x.size(), 1));
    s.mse = squared / n;
    s.relative_l2 = norm > 0 ? std::sqrt(squared / norm) : std::sqrt(squared);
    s.mean_abs /= n;
    s.mean_relative /= n;
    return s;
}

} // namespace hivemesh::test

// The names every compression test uses unqualified.
using hivemesh::byte_buffer;
using hivemesh::byte_view;
using hivemesh::errc;
using hivemesh::random_generator;
namespace test = hivemesh::test;
using namespace hivemesh::compression;
