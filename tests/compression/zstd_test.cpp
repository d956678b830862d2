#include "support/bytes.hpp"

#include <hivemesh/compression/zstd.hpp>
#include <hivemesh/core/random.hpp>

#include <catch2/catch.hpp>

#include <cstring>

using hivemesh::byte_buffer;
using hivemesh::byte_view;
using hivemesh::errc;
using hivemesh::random_generator;
using namespace hivemesh::compression;

namespace {

using hivemesh::test::random_bytes;

byte_buffer repetitive(std::size_t n) {
    byte_buffer b(n);
    for (std::size_t i = 0; i < n; ++i)
        b[i] = static_cast<std::byte>("hivemesh "[i % 9]);
    return b;
}

} // namespace

TEST_CASE("byte payloads round-trip", "[zstd]") {
    const std::size_t n = GENERATE(std::size_t{0}, 1, 511, 512, 100000);
    for (const auto& input : {repetitive(n), random_bytes(n, 3)}) {
        const auto packed = compress_bytes(input);
        CHECK(decompress_bytes(packed, n) == input);
        CHECK(packed.size() <= input.size() + 9);
    }
}

TEST_CASE("small payloads are stored, large compressible ones compressed", "[zstd]") {
    CHECK(compress_bytes(repetitive(511)).size() == 511 + 9);
    CHECK(compress_bytes(repetitive(100000)).size() < 1000);
    // Incompressible data is stored rather than grown.
    CHECK(compress_bytes(random_bytes(100000, 3)).size() == 100000 + 9);
    CHECK(static_cast<int>(compress_bytes(random_bytes(100000, 3))[0]) == 0);
    CHECK(static_cast<int>(compress_bytes(repetitive(100000))[0]) == 1);
}

TEST_CASE("hostile byte payloads are refused", "[zstd][hostile]") {
    const auto packed = compress_bytes(repetitive(100000));
    std::error_code ec;
    SECTION("a size above the caller's limit, before decompressing") {
        CHECK(decompress_bytes(packed, 99999, ec).empty());
        CHECK(ec == errc::length_limit_exceeded);
    }
    SECTION("every truncation") {
        for (std::size_t cut = 0; cut < packed.size(); ++cut) {
            CHECK(decompress_bytes(byte_view(packed).first(cut), 100000, ec).empty());
            REQUIRE(ec);
        }
    }
    SECTION("a header size that disagrees with the frame") {
        auto bad = packed;
        const std::uint64_t lie = 50000;
        std::memcpy(bad.data() + 1, &lie, 8);
        CHECK(decompress_bytes(bad, 100000, ec).empty());
        CHECK(ec == errc::corrupt_data);
    }
    SECTION("trailing bytes after the frame") {
        auto bad = packed;
        bad.push_back(std::byte{0});
        CHECK(decompress_bytes(bad, 100000, ec).empty());
        CHECK(ec == errc::corrupt_data);
    }
    SECTION("unknown method") {
        auto bad = packed;
        bad[0] = std::byte{7};
        CHECK(decompress_bytes(bad, 100000, ec).empty());
        CHECK(ec == errc::corrupt_data);
    }
    SECTION("random corruption") {
        random_generator rng(8);
        for (int trial = 0; trial < 2000; ++trial) {
            auto bad = packed;
            bad[rng.uniform(bad.size())] ^= static_cast<std::byte>(1 + rng.uniform(255));
            const auto out = decompress_bytes(bad, 100000, ec);
            REQUIRE((ec ? out.empty() : out.size() == 100000));
        }
    }
    SECTION("stored payload with trailing bytes") {
        auto stored = compress_bytes(repetitive(10));
        stored.push_back(std::byte{1});
        CHECK(decompress_bytes(stored, 100, ec).empty());
        CHECK(ec == errc::trailing_data);
    }
}
