#include "compression/test_data.hpp"

#include <hivemesh/compression.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

using hivemesh::test::pattern;

namespace {

// Largest error each codec may make on an element, as a multiple of the data's scale.
double tolerance(kind k, const std::vector<float>& x) {
    double absmax = 0;
    for (float v : x)
        absmax = std::max(absmax, static_cast<double>(std::abs(v)));
    switch (k) {
    case kind::none:
        return 0;
    case kind::float16:
    case kind::meanstd_16bit:
        return absmax * 1e-3 + 1e-6;
    case kind::blockwise_8bit:
        return absmax * 0.00703125 * (1 + 1e-5);
    case kind::uniform_8bit:
    case kind::quantile_8bit:
        return absmax; // bounded by the bin, checked statistically below
    }
    return 0;
}

} // namespace

TEST_CASE("every codec round-trips every size and pattern", "[compression]") {
    const auto k = GENERATE(from_range(all_kinds));
    const std::size_t n = GENERATE(std::size_t{0}, 1, 4095, 4096, 4097, (std::size_t{1} << 20) + 3);
    const auto p = GENERATE(pattern::zeros, pattern::constant, pattern::normal);
    CAPTURE(to_string(k), n, test::to_string(p));

    const auto x = test::make_data(p, n);
    const byte_buffer buffer = compress(k, x);
    REQUIRE(buffer.size() == compressed_size(k, n));

    header h;
    REQUIRE_FALSE(read_header(buffer, h));
    CHECK(h.codec == k);
    CHECK(h.count == n);
    CHECK(h.original == dtype::float32);

    const auto y = decompress(buffer);
    REQUIRE(y.size() == n);
    if (p != pattern::normal) {
        // Zero and constant tensors are reproduced exactly by every codec.
        CHECK(y == x);
    } else {
        const double allowed = tolerance(k, x);
        double worst = 0;
        for (std::size_t i = 0; i < n; ++i)
            worst = std::max(worst, std::abs(static_cast<double>(x[i]) - y[i]));
        CHECK(worst <= allowed);
    }
    if (k == kind::none) CHECK(y == x);
}

TEST_CASE("compress_into appends after a prefix of any length, aligned or not", "[compression]") {
    std::vector<float> values(1003); // not a multiple of 8: the scalar tails run too
    for (std::size_t i = 0; i < values.size(); ++i)
        values[i] = 0.001f * static_cast<float>(i) - 0.3f;
    for (kind k : all_kinds)
        for (std::size_t prefix : {0u, 1u, 3u, 9u}) {
            INFO(to_string(k) << " after " << prefix << " bytes");
            byte_buffer out(prefix, std::byte{0xEE});
            REQUIRE_FALSE(compress_into(k, values, out));
            const byte_view payload = byte_view(out).subspan(prefix);
            CHECK(hivemesh::to_buffer(payload) == compress(k, values)); // same bytes as alone
            std::vector<float> back(values.size());
            REQUIRE_FALSE(decompress_into(payload, back)); // decodes from an odd address
            CHECK(back == decompress(compress(k, values)));
            CHECK(std::all_of(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(prefix),
                              [](std::byte b) { return b == std::byte{0xEE}; }));
        }
}

TEST_CASE("decompress_add, decompress_finite_into and decompress_norm: exact, from odd "
          "addresses, and all or nothing",
          "[compression]") {
    std::vector<float> values(5003); // float16 decodes 2048 at a time: three chunks
    for (std::size_t i = 0; i < values.size(); ++i)
        values[i] = 0.001f * static_cast<float>(i) - 0.3f;
    std::vector<float> scratch;
    for (kind k : all_kinds)
        for (std::size_t prefix : {0u, 1u}) {
            INFO(to_string(k) << " after " << prefix << " bytes");
            byte_buffer out(prefix, std::byte{0});
            REQUIRE_FALSE(compress_into(k, values, out));
            const byte_view buffer = byte_view(out).subspan(prefix);
            const std::vector<float> decoded = decompress(buffer);

            std::vector<float> got(values.size(), 9.0f);
            REQUIRE_FALSE(decompress_finite_into(buffer, got, scratch));
            CHECK(got == decoded);

            std::vector<float> sum(values.size(), 1.0f);
            REQUIRE_FALSE(decompress_add(buffer, sum, 0.5f, scratch));
            for (std::size_t i = 0; i < sum.size(); ++i)
                REQUIRE(sum[i] == 1.0f + 0.5f * decoded[i]);

            double squares = 0;
            for (const float v : decoded)
                squares += static_cast<double>(v) * static_cast<double>(v);
            double norm = -1;
            REQUIRE_FALSE(decompress_norm(buffer, values.size(), norm, scratch));
            CHECK(norm == std::sqrt(squares));
            CHECK(decompress_norm(buffer, values.size() - 1, norm, scratch) == errc::size_mismatch);
            CHECK(decompress_norm(buffer.first(buffer.size() - 1), values.size(), norm, scratch));
            CHECK(norm == std::sqrt(squares));

            // Wrong size and a cut buffer leave the destination alone.
            std::vector<float> shorter(values.size() - 1, 2.0f);
            CHECK(decompress_add(buffer, shorter, 1.0f, scratch) == errc::size_mismatch);
            CHECK(decompress_finite_into(buffer.first(buffer.size() - 1), got, scratch));
            CHECK(got == decoded);
            const std::vector<float> before = sum;
            CHECK(decompress_add(buffer.first(buffer.size() - 1), sum, 1.0f, scratch));
            CHECK(sum == before);
            CHECK(std::all_of(shorter.begin(), shorter.end(), [](float v) { return v == 2.0f; }));
        }
    // A non-finite value anywhere is refused before anything is written.
    // (float16 clamps infinities, so only its NaN survives encoding.)
    constexpr float nan = std::numeric_limits<float>::quiet_NaN();
    constexpr float inf = std::numeric_limits<float>::infinity();
    const std::pair<kind, float> cases[] = {
        {kind::none, nan}, {kind::none, -inf}, {kind::float16, nan}};
    for (const auto& [k, bad] : cases)
        for (const std::size_t at : {std::size_t{777}, std::size_t{4500}}) {
            INFO(to_string(k) << " holding " << bad << " at " << at);
            std::vector<float> poisoned = values;
            poisoned[at] = bad;
            const byte_buffer buffer = compress(k, poisoned);
            std::vector<float> sum(values.size(), 1.0f);
            CHECK(decompress_add(buffer, sum, 1.0f, scratch) == errc::non_finite_input);
            CHECK(decompress_finite_into(buffer, sum, scratch) == errc::non_finite_input);
            CHECK(std::all_of(sum.begin(), sum.end(), [](float v) { return v == 1.0f; }));
            double norm = 7;
            CHECK(decompress_norm(buffer, values.size(), norm, scratch) == errc::non_finite_input);
            CHECK(norm == 7);
        }
    // A peer may send float16 infinities itself (0x7C00, 0xFC00): refused as well.
    for (const std::uint16_t infinity : {std::uint16_t{0x7C00}, std::uint16_t{0xFC00}}) {
        byte_buffer buffer = compress(kind::float16, values);
        std::memcpy(buffer.data() + 16 + 2 * 3000, &infinity, 2);
        std::vector<float> sum(values.size(), 1.0f);
        CHECK(decompress_add(buffer, sum, 1.0f, scratch) == errc::non_finite_input);
        CHECK(decompress_finite_into(buffer, sum, scratch) == errc::non_finite_input);
        CHECK(std::all_of(sum.begin(), sum.end(), [](float v) { return v == 1.0f; }));
        double norm = 7;
        CHECK(decompress_norm(buffer, values.size(), norm, scratch) == errc::non_finite_input);
    }
}

TEST_CASE("all_finite finds a NaN or infinity at any position of any length, at any address",
          "[compression]") {
    const std::uint32_t non_finite[] = {0x7F800000u, 0xFF800000u, 0x7FC00000u, 0x7F800001u,
                                        0xFFFFFFFFu};
    const std::uint32_t finite[] = {0x7F7FFFFFu, 0xFF7FFFFFu, 0x00000001u,
                                    0x80000000u, 0x3F800000u, 0x7F000000u};
    // Up to 80: past two turns of the AVX2 loop's four vectors, its single ones and a tail.
    std::vector<std::byte> storage(4 * 80 + 3);
    auto store = [&](std::size_t offset, std::size_t i, std::uint32_t bits) {
        std::memcpy(storage.data() + offset + 4 * i, &bits, 4);
    };
    for (std::size_t offset = 0; offset < 4; ++offset)
        for (std::size_t n = 0; n <= 80; ++n) {
            const std::byte* values = storage.data() + offset;
            for (std::size_t i = 0; i < n; ++i)
                store(offset, i, finite[i % std::size(finite)]);
            INFO("offset " << offset << ", " << n << " values");
            REQUIRE(hivemesh::compression::detail::all_finite(values, n));
            REQUIRE(hivemesh::compression::detail::all_finite_portable(values, n));
            for (std::size_t at = 0; at < n; ++at)
                for (const std::uint32_t bad : non_finite) {
                    store(offset, at, bad);
                    INFO("bits " << bad << " at " << at);
                    REQUIRE_FALSE(hivemesh::compression::detail::all_finite(values, n));
                    REQUIRE_FALSE(hivemesh::compression::detail::all_finite_portable(values, n));
                    store(offset, at, finite[at % std::size(finite)]);
                }
        }
}

TEST_CASE("8-bit codecs decode only finite values from any valid buffer, and meanstd_16bit is "
          "checked",
          "[compression]") {
    // decompress_finite_into and decompress_add skip the finite check for these codecs, so
    // the most extreme scales a buffer may carry must still decode finite.
    constexpr float largest = std::numeric_limits<float>::max();
    std::vector<float> values(256);
    for (std::size_t i = 0; i < values.size(); ++i)
        values[i] = static_cast<float>(i) - 128.0f;
    std::vector<float> scratch;
    const auto put_float = [](byte_buffer& b, std::size_t offset, float v) {
        std::memcpy(b.data() + offset, &v, sizeof v);
    };
    const auto decodes_finite_everywhere = [&](const byte_buffer& buffer) {
        std::vector<float> got(values.size(), 9.0f);
        REQUIRE_FALSE(decompress_finite_into(buffer, got, scratch));
        CHECK(std::all_of(got.begin(), got.end(), [](float v) { return std::isfinite(v); }));
        std::vector<float> sum(values.size(), 0.0f);
        REQUIRE_FALSE(decompress_add(buffer, sum, 1.0f, scratch));
        CHECK(sum == got);
        return got;
    };
    SECTION("blockwise_8bit: the largest absmax with every code") {
        byte_buffer buffer = compress(kind::blockwise_8bit, values, {.block_size = 256});
        put_float(buffer, 16 + 4, largest); // header, block size, then the only absmax
        for (std::size_t code = 0; code < 256; ++code)
            buffer[16 + 4 + 4 + code] = static_cast<std::byte>(code);
        const auto got = decodes_finite_everywhere(buffer);
        CHECK(got[255] == largest);
        CHECK(got[0] == -0.99296875f * largest);
    }
    for (kind k : {kind::uniform_8bit, kind::quantile_8bit}) {
        DYNAMIC_SECTION(to_string(k) << ": a codebook of the largest magnitudes") {
            byte_buffer buffer = compress(k, values);
            for (std::size_t entry = 0; entry < 256; ++entry) // the codebook follows the header
                put_float(buffer, 16 + 4 * entry, entry % 2 ? largest : -largest);
            decodes_finite_everywhere(buffer);
        }
    }
    SECTION("meanstd_16bit can overflow, so it is checked") {
        byte_buffer buffer = compress(kind::meanstd_16bit, values, {.row_length = 256});
        put_float(buffer, 16 + 8, largest);     // the only row's mean
        put_float(buffer, 16 + 8 + 4, largest); // and its standard deviation
        std::vector<float> sum(values.size(), 1.0f);
        CHECK(decompress_add(buffer, sum, 1.0f, scratch) == errc::non_finite_input);
        CHECK(decompress_finite_into(buffer, sum, scratch) == errc::non_finite_input);
        CHECK(std::all_of(sum.begin(), sum.end(), [](float v) { return v == 1.0f; }));
    }
}

TEST_CASE("compressed sizes are what the formats say", "[compression]") {
    const std::size_t n = 10000;
    CHECK(compressed_size(kind::none, n) == 16 + 4 * n);
    CHECK(compressed_size(kind::float16, n) == 16 + 2 * n);
    CHECK(compressed_size(kind::meanstd_16bit, n, {.row_length = 100}) == 16 + 8 + 8 * 100 + 2 * n);
    CHECK(compressed_size(kind::uniform_8bit, n) == 16 + 1024 + n);
    CHECK(compressed_size(kind::quantile_8bit, n) == 16 + 1024 + n);
    CHECK(compressed_size(kind::blockwise_8bit, n) == 16 + 4 + 4 * 3 + n);
    CHECK(compressed_size(kind::blockwise_8bit, n, {.block_size = 64}) == 16 + 4 + 4 * 157 + n);
}

TEST_CASE("128x128x64 N(0,1) tensor: error bounds per codec", "[compression]") {
    const auto x = test::make_data(pattern::normal, 128 * 128 * 64, 11);
    const options rows{.row_length = 64}; // meanstd works per last-dimension row
    const auto f16 = test::compare(x, decompress(compress(kind::float16, x)));
    const auto meanstd = test::compare(x, decompress(compress(kind::meanstd_16bit, x, rows)));
    const auto uniform = test::compare(x, decompress(compress(kind::uniform_8bit, x)));
    const auto quantile = test::compare(x, decompress(compress(kind::quantile_8bit, x)));
    const auto blockwise = test::compare(x, decompress(compress(kind::blockwise_8bit, x)));
    CHECK(f16.mse < 5e-8);
    CHECK(meanstd.mse < 5e-8);
    CHECK(uniform.mse < 8e-4);
    CHECK(quantile.mse < 8e-4);
    CHECK(blockwise.mse < 8e-4);
    // The 8-bit codecs really lose information: a broken codec that sent float32 would
    // pass the bounds above, so check they are not exact either.
    CHECK(uniform.mse > 1e-6);
    CHECK(quantile.mse > 1e-6);
    CHECK(blockwise.mse > 1e-6);
}

TEST_CASE("uniform_8bit and quantile_8bit keep the mean", "[compression]") {
    const auto k = GENERATE(kind::uniform_8bit, kind::quantile_8bit);
    CAPTURE(to_string(k));
    auto x = test::make_data(pattern::normal, 128 * 128 * 64, 3);
    for (auto& v : x)
        v = v * 2.0f + 0.75f; // a mean far from zero
    const auto y = decompress(compress(k, x));
    double sum_x = 0, sum_y = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
        sum_x += x[i];
        sum_y += y[i];
    }
    const double n = static_cast<double>(x.size());
    CHECK(sum_y / n == Approx(sum_x / n).margin(1e-6));
}

TEST_CASE("uniform_8bit bins are 6 sigma wide around the mean", "[compression]") {
    // Values beyond +-3 sigma land in the edge bins; the codebook holds bin means.
    auto x = test::make_data(pattern::normal, 100000, 5);
    x[0] = 100.0f;
    x[1] = -100.0f;
    const auto buffer = compress(kind::uniform_8bit, x);
    const auto* codes = reinterpret_cast<const std::uint8_t*>(buffer.data() + 16 + 1024);
    CHECK(codes[0] == 255);
    CHECK(codes[1] == 0);
    const auto y = decompress(buffer);
    CHECK(y[0] == y[0]); // finite
    CHECK(y[0] > 3.0f);
    CHECK(y[1] < -3.0f);
}

TEST_CASE("meanstd_16bit keeps each row's mean and scale", "[compression]") {
    std::vector<float> x(4 * 256);
    random_generator rng(9);
    for (std::size_t row = 0; row < 4; ++row)
        for (std::size_t i = 0; i < 256; ++i)
            x[row * 256 + i] =
                static_cast<float>(1000.0 * row + std::pow(10.0, row) * rng.normal());
    const auto y = decompress(compress(kind::meanstd_16bit, x, {.row_length = 256}));
    for (std::size_t row = 0; row < 4; ++row)
        for (std::size_t i = 0; i < 256; ++i) {
            const double scale = std::pow(10.0, row);
            CHECK(std::abs(x[row * 256 + i] - y[row * 256 + i]) <=
                  scale * 5e-3 + 1e-4 * row * 1000);
        }
    CHECK_THROWS_AS(compress(kind::meanstd_16bit, x, {.row_length = 1000}), std::system_error);
}

TEST_CASE("float16 conversion is correctly rounded and clamps", "[compression]") {
    using detail::float_to_half_bits;
    using detail::half_bits_to_float;
    CHECK(float_to_half_bits(1.0f) == 0x3C00);
    CHECK(float_to_half_bits(-2.0f) == 0xC000);
    CHECK(float_to_half_bits(65504.0f) == 0x7BFF);
    CHECK(float_to_half_bits(0x1p-24f) == 0x0001);            // smallest subnormal
    CHECK(float_to_half_bits(0x1p-25f) == 0x0000);            // halfway to zero: ties to even
    CHECK(float_to_half_bits(1.0f + 0x1p-11f) == 0x3C00);     // halfway: ties to even (down)
    CHECK(float_to_half_bits(1.0f + 3 * 0x1p-11f) == 0x3C02); // halfway: ties to even (up)
    // Every half value converts to float and back unchanged.
    for (std::uint32_t h = 0; h < 0x10000; ++h) {
        const float f = half_bits_to_float(static_cast<std::uint16_t>(h));
        if (std::isnan(f)) continue;
        REQUIRE(float_to_half_bits(f) == h);
    }
    // The bulk path (F16C where present) agrees with the portable one on awkward values.
    std::vector<float> awkward = {0.0f,
                                  -0.0f,
                                  1e-8f,
                                  -6.1e-5f,
                                  0.1f,
                                  65519.0f,
                                  65520.0f,
                                  1e6f,
                                  -1e6f,
                                  std::numeric_limits<float>::infinity(),
                                  std::numeric_limits<float>::quiet_NaN(),
                                  0x1p-25f,
                                  3.14159f};
    std::vector<std::uint16_t> bulk(awkward.size());
    detail::floats_to_halves(awkward.data(), bulk.data(), awkward.size());
    for (std::size_t i = 0; i < awkward.size(); ++i) {
        CAPTURE(awkward[i]);
        const auto scalar = float_to_half_bits(detail::clamp_to_half_range(awkward[i]));
        if (std::isnan(awkward[i]))
            CHECK(std::isnan(half_bits_to_float(bulk[i])));
        else
            CHECK(bulk[i] == scalar);
    }
}

TEST_CASE("non-finite inputs follow the documented rule", "[compression]") {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const float inf = std::numeric_limits<float>::infinity();
    std::vector<float> x = {1.0f, nan, -inf, inf, 70000.0f, -2.0f};

    const auto none = decompress(compress(kind::none, x));
    for (std::size_t i = 0; i < x.size(); ++i)
        CHECK(std::bit_cast<std::uint32_t>(none[i]) == std::bit_cast<std::uint32_t>(x[i]));

    const auto half = decompress(compress(kind::float16, x));
    CHECK(half[0] == 1.0f);
    CHECK(std::isnan(half[1]));
    CHECK(half[2] == -65504.0f);
    CHECK(half[3] == 65504.0f);
    CHECK(half[4] == 65504.0f);
    CHECK(half[5] == -2.0f);

    for (kind k :
         {kind::meanstd_16bit, kind::uniform_8bit, kind::quantile_8bit, kind::blockwise_8bit}) {
        CAPTURE(to_string(k));
        byte_buffer out = {std::byte{42}};
        CHECK(compress_into(k, x, out) == errc::non_finite_input);
        CHECK(out == byte_buffer{std::byte{42}}); // untouched on error
        CHECK_THROWS_AS(compress(k, x), std::system_error);
        x[1] = 0.0f;
        x[2] = 0.0f;
        x[3] = 0.0f;
        CHECK_FALSE(compress_into(k, x, out));
        x[1] = nan;
        x[2] = -inf;
        x[3] = inf;
    }

    // blockwise_8bit finds them while it encodes, in any block, on any thread.
    std::vector<float> blocks(10 * 64 + 5, 0.25f);
    for (const float bad : {nan, -inf})
        for (const std::size_t at : {std::size_t{0}, std::size_t{7 * 64 + 3}, blocks.size() - 1})
            for (const unsigned threads : {1u, 3u}) {
                CAPTURE(bad, at, threads);
                options opts;
                opts.block_size = 64;
                opts.threads = threads;
                blocks[at] = bad;
                byte_buffer out = {std::byte{42}};
                CHECK(compress_into(kind::blockwise_8bit, blocks, out, opts) ==
                      errc::non_finite_input);
                CHECK(out == byte_buffer{std::byte{42}});
                blocks[at] = 0.25f;
                CHECK_FALSE(compress_into(kind::blockwise_8bit, blocks, out, opts));
            }
}

TEST_CASE("threads split work without changing the bytes", "[compression]") {
    const auto x = test::make_data(pattern::normal, (std::size_t{1} << 20) + 3, 21);
    for (kind k : {kind::none, kind::float16, kind::blockwise_8bit}) {
        CAPTURE(to_string(k));
        const auto one = compress(k, x, {.threads = 1});
        const auto three = compress(k, x, {.threads = 3});
        CHECK(one == three);
        std::vector<float> y1(x.size()), y3(x.size());
        REQUIRE_FALSE(decompress_into(one, y1, {.threads = 1}));
        REQUIRE_FALSE(decompress_into(one, y3, {.threads = 3}));
        CHECK(y1 == y3);
    }
}

TEST_CASE("options are validated", "[compression]") {
    const std::vector<float> x(100, 1.0f);
    byte_buffer out;
    CHECK(compress_into(kind::blockwise_8bit, x, out, {.block_size = 63}) ==
          errc::invalid_argument);
    CHECK(compress_into(kind::blockwise_8bit, x, out, {.block_size = 4097}) ==
          errc::invalid_argument);
    CHECK(compress_into(kind::meanstd_16bit, x, out, {.row_length = 7}) == errc::invalid_argument);
    CHECK(compress_into(static_cast<kind>(9), x, out) == errc::unknown_codec);
    CHECK(out.empty());
    CHECK_FALSE(compress_into(kind::blockwise_8bit, x, out, {.block_size = 64}));
    CHECK(out.size() == compressed_size(kind::blockwise_8bit, 100, {.block_size = 64}));
}

TEST_CASE("the original dtype travels in the header", "[compression]") {
    const std::vector<float> x = {1.0f, 2.0f};
    header h;
    REQUIRE_FALSE(read_header(compress(kind::float16, x, {.original = dtype::bfloat16}), h));
    CHECK(h.original == dtype::bfloat16);
}

TEST_CASE("codec names parse back", "[compression]") {
    for (kind k : all_kinds)
        CHECK(parse_kind(to_string(k)) == k);
    CHECK_FALSE(parse_kind("float8").has_value());
}
