#include "compression/test_data.hpp"

#include <hivemesh/compression.hpp>

#include <catch2/catch.hpp>

#include <bit>
#include <cmath>

namespace {

// The oracle: index of the nearest map entry by exhaustive search, ties to the lower
// index, comparing in double so it does not share the implementation's float rounding.
std::uint8_t nearest_by_search(float value) {
    const auto& map = detail::dynamic_map();
    std::size_t best = 0;
    double best_distance = std::abs(static_cast<double>(value) - map[0]);
    for (std::size_t i = 1; i < map.size(); ++i) {
        const double d = std::abs(static_cast<double>(value) - map[i]);
        if (d < best_distance) {
            best = i;
            best_distance = d;
        }
    }
    return static_cast<std::uint8_t>(best);
}

// True when `value` lies within a few ulps of a midpoint, where float and double rounding
// may legitimately disagree about which neighbour is nearer.
bool near_a_midpoint(float value) {
    const auto& map = detail::dynamic_map();
    for (std::size_t i = 0; i + 1 < map.size(); ++i) {
        const double mid = (static_cast<double>(map[i]) + map[i + 1]) / 2;
        if (std::abs(value - mid) <= 4 * std::abs(mid) * 0x1p-24 + 1e-45) return true;
    }
    return false;
}

std::vector<std::uint8_t> codes_of(const byte_buffer& buffer, std::size_t n, std::size_t blocks) {
    const auto* codes = reinterpret_cast<const std::uint8_t*>(buffer.data() + 16 + 4 + 4 * blocks);
    return {codes, codes + n};
}

} // namespace

TEST_CASE("the dynamic map has 256 sorted entries from -0.99296875 to 1", "[blockwise]") {
    const auto& map = detail::dynamic_map();
    REQUIRE(map.size() == 256);
    CHECK(map.front() == Approx(-0.99296875).epsilon(1e-7));
    CHECK(map.back() == 1.0f);
    CHECK(map[127] == 0.0f);
    for (std::size_t i = 1; i < map.size(); ++i)
        CHECK(map[i - 1] < map[i]);
    // Symmetric apart from +1.0: entry 127 - k is the negation of entry 127 + k.
    for (std::size_t k = 1; k <= 127; ++k)
        CHECK(map[127 - k] == -map[127 + k]);
    // Spot values from the formula: decade 0 is the single value 1e-6 * 0.55.
    CHECK(map[128] == Approx(0.55e-6).epsilon(1e-6));
    CHECK(map[254] == Approx(0.1 + 0.9 * 127.0 / 128.0).epsilon(1e-7));
}

TEST_CASE("the nearest-entry table needs one comparison per cell", "[blockwise]") {
    CHECK(detail::blockwise_magnitudes().cells_hold_at_most_one_midpoint());
}

TEST_CASE("quantization picks the nearest map entry", "[blockwise]") {
    // Values spread over every decade of the map, both signs, plus every midpoint itself
    // and its float neighbours, where the tie rule decides.
    std::vector<float> values;
    random_generator rng(17);
    for (int i = 0; i < 200000; ++i) {
        const double magnitude = std::pow(10.0, -8.0 * rng.uniform_real());
        values.push_back(static_cast<float>(rng.uniform(2) ? magnitude : -magnitude));
    }
    const auto& map = detail::dynamic_map();
    for (std::size_t i = 0; i + 1 < map.size(); ++i) {
        const float mid = (map[i] + map[i + 1]) * 0.5f;
        values.push_back(mid);
        values.push_back(std::nextafter(mid, 2.0f));
        values.push_back(std::nextafter(mid, -2.0f));
    }
    // Both ends and the middle of every table cell, up to past 1.0 (rounding can give
    // slightly more), where the vector path's clamped keys and low-bit comparison act.
    for (std::uint32_t key = 0; key <= detail::magnitude_table::max_key + 1; ++key)
        for (const std::uint32_t low : {0x0000u, 0x0001u, 0x8000u, 0xFFFFu}) {
            const float v = std::bit_cast<float>((key << 16) | low);
            values.push_back(v);
            values.push_back(-v);
        }
    values.push_back(1.0f);
    values.push_back(-1.0f);
    values.push_back(0.0f);
    values.push_back(-0.0f);
    // absmax 1 makes the scaled value the value itself (the map is in [-1, 1]).
    values.push_back(1.0f);
    std::vector<std::uint8_t> scalar(values.size()), dispatched(values.size());
    detail::quantize_block_scalar<false>(values, 1.0f, scalar.data());
    detail::quantize_block(values, 1.0f, dispatched.data()); // AVX2 where the CPU has it
    std::size_t checked = 0;
    for (std::size_t i = 0; i < values.size(); ++i) {
        CAPTURE(i, values[i]);
        REQUIRE(scalar[i] == dispatched[i]);
        if (!near_a_midpoint(values[i])) {
            REQUIRE(scalar[i] == nearest_by_search(values[i]));
            ++checked;
        }
    }
    CHECK(checked > 199000);
}

TEST_CASE("ties go to the lower index", "[blockwise]") {
    const auto& map = detail::dynamic_map();
    std::size_t exact_ties = 0;
    for (std::size_t i = 0; i + 1 < map.size(); ++i) {
        const float mid = (map[i] + map[i + 1]) * 0.5f;
        // Only where the float midpoint is exactly equidistant is it a true tie.
        if (static_cast<double>(mid) - map[i] != static_cast<double>(map[i + 1]) - mid) continue;
        const std::vector<float> one = {mid};
        std::uint8_t code = 0;
        detail::quantize_block_scalar<false>(one, 1.0f, &code);
        CAPTURE(i, mid);
        CHECK(code == i);
        ++exact_ties;
    }
    CHECK(exact_ties > 0);
}

TEST_CASE("blockwise_8bit on N(0,1), n = 2^20, block 4096", "[blockwise]") {
    const auto x = test::make_data(test::pattern::normal, std::size_t{1} << 20, 1234);
    const auto buffer = compress(kind::blockwise_8bit, x);
    const auto y = decompress(buffer);
    const auto stats = test::compare(x, y);
    CHECK(stats.relative_l2 > 0.0125);
    CHECK(stats.relative_l2 < 0.0135);
    CHECK(stats.mean_abs < 0.011);
    CHECK(stats.mean_relative < 0.018);

    for (std::size_t start = 0; start < x.size(); start += 4096) {
        float absmax = 0;
        for (std::size_t i = start; i < start + 4096; ++i)
            absmax = std::max(absmax, std::abs(x[i]));
        for (std::size_t i = start; i < start + 4096; ++i)
            // The bound of DESIGN §8, up to float rounding of the map entries themselves.
            REQUIRE(std::abs(x[i] - y[i]) <= 0.00703125f * absmax * (1 + 1e-5f));
    }
}

TEST_CASE("blockwise_8bit stores one absmax per block and the nearest codes", "[blockwise]") {
    const std::size_t block = GENERATE(std::size_t{64}, 100, 4096);
    const std::size_t n = 3 * block + 5;
    CAPTURE(block);
    auto x = test::make_data(test::pattern::normal, n, 99);
    std::fill(x.begin() + static_cast<std::ptrdiff_t>(block),
              x.begin() + 2 * static_cast<std::ptrdiff_t>(block), 0.0f);
    const auto buffer = compress(kind::blockwise_8bit, x, {.block_size = block});
    const std::size_t blocks = 4;
    REQUIRE(buffer.size() == 16 + 4 + 4 * blocks + n);
    std::uint32_t stored_block = 0;
    std::memcpy(&stored_block, buffer.data() + 16, 4);
    CHECK(stored_block == block);
    const auto codes = codes_of(buffer, n, blocks);
    for (std::size_t b = 0; b < blocks; ++b) {
        const std::size_t begin = b * block, end = std::min(n, begin + block);
        float absmax = 0;
        for (std::size_t i = begin; i < end; ++i)
            absmax = std::max(absmax, std::abs(x[i]));
        float stored = 0;
        std::memcpy(&stored, buffer.data() + 20 + 4 * b, 4);
        CHECK(stored == absmax);
        for (std::size_t i = begin; i < end; ++i) {
            if (absmax == 0) {
                REQUIRE(codes[i] == 127);
                continue;
            }
            const float scaled = std::abs(x[i]) * (1.0f / absmax) * (x[i] < 0 ? -1.0f : 1.0f);
            if (!near_a_midpoint(scaled)) REQUIRE(codes[i] == nearest_by_search(scaled));
        }
    }
    const auto y = decompress(buffer);
    for (std::size_t i = block; i < 2 * block; ++i)
        REQUIRE(y[i] == 0.0f); // all-zero block
}

TEST_CASE("blockwise_8bit handles extreme block scales", "[blockwise]") {
    // Subnormal absmax (the reciprocal overflows) and huge absmax.
    const float tiny = std::numeric_limits<float>::denorm_min() * 1000;
    const float huge = std::numeric_limits<float>::max() / 2;
    for (float scale : {tiny, huge}) {
        CAPTURE(scale);
        std::vector<float> x(300);
        for (std::size_t i = 0; i < x.size(); ++i)
            x[i] = scale * (static_cast<float>(static_cast<int>(i % 7) - 3) / 3.0f);
        const auto y = decompress(compress(kind::blockwise_8bit, x, {.block_size = 64}));
        for (std::size_t i = 0; i < x.size(); ++i) {
            REQUIRE(std::isfinite(y[i]));
            REQUIRE(std::abs(static_cast<double>(x[i]) - y[i]) <=
                    0.00703125 * scale * (1 + 1e-5) + 1e-45);
        }
    }
}
