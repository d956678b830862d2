// Decoding truncated, corrupted and hand-crafted hostile buffers must fail cleanly: an
// error code, no crash, no undefined behaviour (run under ASan/UBSan in CI), no huge
// allocation, and the output left untouched.
#include "compression/test_data.hpp"

#include <hivemesh/compression.hpp>

#include <catch2/catch.hpp>

#include <cstring>
#include <limits>

namespace {

byte_buffer valid_buffer(kind k, std::size_t n) {
    return compress(k, test::make_data(test::pattern::normal, n, 5),
                    {.block_size = 64,
                     .row_length = k == kind::meanstd_16bit ? std::size_t{10} : std::size_t{0}});
}

template <class T>
void poke(byte_buffer& buffer, std::size_t offset, T value) {
    std::memcpy(buffer.data() + offset, &value, sizeof value);
}

} // namespace

TEST_CASE("every truncation of a valid buffer is refused", "[compression][hostile]") {
    const auto k = GENERATE(from_range(all_kinds));
    CAPTURE(to_string(k));
    const auto buffer = valid_buffer(k, 200);
    for (std::size_t cut = 0; cut < buffer.size(); ++cut) {
        CAPTURE(cut);
        std::error_code ec;
        const auto values = decompress(byte_view(buffer).first(cut), ec);
        REQUIRE(ec);
        REQUIRE(values.empty());
    }
    std::error_code ec;
    CHECK(decompress(buffer, ec).size() == 200);
    CHECK_FALSE(ec);
}

TEST_CASE("trailing bytes are refused", "[compression][hostile]") {
    const auto k = GENERATE(from_range(all_kinds));
    auto buffer = valid_buffer(k, 200);
    buffer.push_back(std::byte{0});
    std::error_code ec;
    (void)decompress(buffer, ec);
    CHECK(ec == errc::trailing_data);
}

TEST_CASE("random corruption never crashes and never leaves partial output",
          "[compression][hostile]") {
    const auto k = GENERATE(from_range(all_kinds));
    CAPTURE(to_string(k));
    const auto original = valid_buffer(k, 300);
    random_generator rng(static_cast<std::uint64_t>(k) + 1);
    std::size_t refused = 0;
    for (int trial = 0; trial < 3000; ++trial) {
        auto buffer = original;
        const auto flips = 1 + rng.uniform(4);
        for (std::uint64_t f = 0; f < flips; ++f)
            buffer[rng.uniform(buffer.size())] ^= static_cast<std::byte>(1 + rng.uniform(255));
        std::vector<float> out(300, -7.0f);
        const std::error_code ec = decompress_into(buffer, out);
        if (ec) {
            ++refused;
            for (float v : out)
                REQUIRE(v == -7.0f);
        }
    }
    // Payload flips decode to other valid values; header flips must be caught.
    CHECK(refused > 0);
}

TEST_CASE("hostile headers are refused before allocating", "[compression][hostile]") {
    auto buffer = valid_buffer(kind::blockwise_8bit, 100);
    std::error_code ec;
    SECTION("bad magic") {
        buffer[0] = std::byte{'X'};
        (void)decompress(buffer, ec);
        CHECK(ec == errc::bad_magic);
    }
    SECTION("future version") {
        buffer[2] = std::byte{2};
        (void)decompress(buffer, ec);
        CHECK(ec == errc::unsupported_version);
    }
    SECTION("unknown codec") {
        buffer[3] = std::byte{200};
        (void)decompress(buffer, ec);
        CHECK(ec == errc::unknown_codec);
    }
    SECTION("unknown dtype or flags") {
        buffer[GENERATE(4, 5, 6, 7)] = std::byte{9};
        (void)decompress(buffer, ec);
        CHECK(ec == errc::corrupt_data);
    }
    SECTION("a count of 2^62 elements") {
        poke<std::uint64_t>(buffer, 8, std::uint64_t{1} << 62);
        (void)decompress(buffer, ec);
        CHECK(ec == errc::length_limit_exceeded);
    }
    SECTION("a count over the configured limit") {
        (void)decompress(buffer, ec, {.max_elements = 99});
        CHECK(ec == errc::length_limit_exceeded);
    }
    SECTION("a count larger than the payload") {
        poke<std::uint64_t>(buffer, 8, 1u << 30);
        (void)decompress(buffer, ec);
        CHECK(ec == errc::truncated_input);
    }
    SECTION("block size out of range") {
        poke<std::uint32_t>(buffer, 16, GENERATE(0u, 63u, 4097u, 0xFFFFFFFFu));
        (void)decompress(buffer, ec);
        CHECK(ec == errc::corrupt_data);
    }
    SECTION("non-finite or negative absmax") {
        poke<float>(buffer, 20,
                    GENERATE(-1.0f, std::numeric_limits<float>::quiet_NaN(),
                             std::numeric_limits<float>::infinity()));
        (void)decompress(buffer, ec);
        CHECK(ec == errc::corrupt_data);
    }
}

TEST_CASE("hostile codec fields are refused", "[compression][hostile]") {
    std::error_code ec;
    SECTION("meanstd row length that does not divide the count") {
        auto buffer = valid_buffer(kind::meanstd_16bit, 100);
        poke<std::uint64_t>(buffer, 16, GENERATE(std::uint64_t{0}, 3, 1000, ~std::uint64_t{0}));
        (void)decompress(buffer, ec);
        CHECK(ec == errc::corrupt_data);
    }
    SECTION("meanstd zero std") {
        auto buffer = valid_buffer(kind::meanstd_16bit, 100);
        poke<float>(buffer, 16 + 8 + 4 * 10, 0.0f); // first std
        (void)decompress(buffer, ec);
        CHECK(ec == errc::corrupt_data);
    }
    SECTION("codebook with NaN") {
        auto buffer = valid_buffer(GENERATE(kind::uniform_8bit, kind::quantile_8bit), 100);
        poke<float>(buffer, 16 + 4 * 17, std::numeric_limits<float>::quiet_NaN());
        (void)decompress(buffer, ec);
        CHECK(ec == errc::corrupt_data);
    }
    SECTION("output of the wrong size") {
        const auto buffer = valid_buffer(kind::float16, 100);
        std::vector<float> out(99);
        CHECK(decompress_into(buffer, out) == errc::size_mismatch);
    }
}

TEST_CASE("decoding an unaligned buffer works", "[compression][hostile]") {
    const auto k = GENERATE(from_range(all_kinds));
    const auto buffer = valid_buffer(k, 330);
    byte_buffer shifted(buffer.size() + 1);
    std::memcpy(shifted.data() + 1, buffer.data(), buffer.size());
    CHECK(decompress(byte_view(shifted).subspan(1)) == decompress(buffer));
}

TEST_CASE("none_values views exactly the values of a well-formed none buffer of that count",
          "[compression][hostile]") {
    const auto values = test::make_data(test::pattern::normal, 300, 7);
    const auto buffer = compress(kind::none, values);
    const auto viewed = none_values(buffer, 300);
    REQUIRE(viewed);
    REQUIRE(viewed->size() == 4 * values.size());
    CHECK(std::memcmp(viewed->data(), values.data(), viewed->size()) == 0);
    CHECK(viewed->data() == buffer.data() + header_size); // where it is, not a copy
    CHECK_FALSE(none_values(buffer, 299));
    CHECK_FALSE(none_values(buffer, 301));
    for (std::size_t cut = 0; cut < buffer.size(); ++cut)
        REQUIRE_FALSE(none_values(byte_view(buffer).first(cut), 300));
    auto longer = buffer;
    longer.push_back(std::byte{0});
    CHECK_FALSE(none_values(longer, 300));
    CHECK_FALSE(none_values(valid_buffer(kind::float16, 300), 300));
    CHECK_FALSE(none_values(buffer, 300, {.max_elements = 299}));
    // NaN and infinity are values like any other here: the reader checks them.
    const std::vector<float> odd{std::numeric_limits<float>::quiet_NaN(),
                                 std::numeric_limits<float>::infinity(), 1.0f};
    CHECK(none_values(compress(kind::none, odd), 3));
}
