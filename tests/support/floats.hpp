// Float values for the tests.
#pragma once

#include <cstddef>
#include <numeric>
#include <vector>

namespace hivemesh::test {

/// `n` floats counting up by 1 from `start` (std::iota).
inline std::vector<float> iota(std::size_t n, float start = 1.0f) {
    std::vector<float> v(n);
    std::iota(v.begin(), v.end(), start);
    return v;
}

} // namespace hivemesh::test
