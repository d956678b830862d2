#include <hivemesh/core/binary.hpp>
#include <hivemesh/core/random.hpp>

#include <catch2/catch.hpp>

#include "support/bytes.hpp"

#include <bit>
#include <concepts>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

using hivemesh::binary_reader;
using hivemesh::binary_writer;
using hivemesh::byte_buffer;
using hivemesh::byte_view;
using hivemesh::errc;

namespace {

using hivemesh::test::bytes_of;

using hivemesh::test::hex;

template <class T>
std::string encode_hex(T value) {
    byte_buffer buf;
    binary_writer w(buf);
    w.write(value);
    return hex(buf);
}

} // namespace

TEST_CASE("integers are written little-endian with exact widths", "[core][binary]") {
    CHECK(encode_hex(std::uint8_t{0xAB}) == "ab");
    CHECK(encode_hex(std::int8_t{-2}) == "fe");
    CHECK(encode_hex(std::uint16_t{0x0102}) == "02 01");
    CHECK(encode_hex(std::int16_t{-2}) == "fe ff");
    CHECK(encode_hex(std::uint32_t{0x01020304}) == "04 03 02 01");
    CHECK(encode_hex(std::numeric_limits<std::int32_t>::min()) == "00 00 00 80");
    CHECK(encode_hex(std::uint64_t{0x0102030405060708}) == "08 07 06 05 04 03 02 01");
    CHECK(encode_hex(std::int64_t{-1}) == "ff ff ff ff ff ff ff ff");
    CHECK(encode_hex(std::numeric_limits<std::int64_t>::min()) == "00 00 00 00 00 00 00 80");
}

TEST_CASE("floats are written as their IEEE-754 bits, little-endian", "[core][binary]") {
    byte_buffer buf;
    binary_writer w(buf);
    w.write_f32(1.0f);
    CHECK(hex(buf) == "00 00 80 3f");
    buf.clear();
    w.write_f32(-0.0f);
    CHECK(hex(buf) == "00 00 00 80");
    buf.clear();
    w.write_f64(1.0);
    CHECK(hex(buf) == "00 00 00 00 00 00 f0 3f");
    buf.clear();
    w.write_f64(-0.0);
    CHECK(hex(buf) == "00 00 00 00 00 00 00 80");
    buf.clear();
    w.write_f64(-2.5);
    CHECK(hex(buf) == "00 00 00 00 00 00 04 c0");
}

TEST_CASE("sized bytes and strings carry a u32 little-endian length", "[core][binary]") {
    byte_buffer buf;
    binary_writer w(buf);
    w.write_sized_bytes(hivemesh::as_bytes("abc"));
    CHECK(hex(buf) == "03 00 00 00 61 62 63");
    buf.clear();
    w.write_string("");
    CHECK(hex(buf) == "00 00 00 00");
    buf.clear();
    w.write_string("hi");
    w.write_bytes(hivemesh::as_bytes("xyz")); // raw: no prefix
    CHECK(hex(buf) == "02 00 00 00 68 69 78 79 7a");
    buf.clear();
    w.write_bytes({});
    CHECK(buf.empty());
}

TEST_CASE("the writer appends to the caller's buffer", "[core][binary]") {
    byte_buffer buf = bytes_of({0xEE});
    binary_writer w(buf);
    CHECK(w.size() == 1);
    CHECK(&w.buffer() == &buf);
    w.write(std::uint16_t{0x1234});
    CHECK(hex(buf) == "ee 34 12");
    std::byte* p = w.grow(3);
    CHECK(buf.size() == 6);
    CHECK(p == buf.data() + 3);
    p[0] = std::byte{1};
    p[2] = std::byte{3};
    CHECK(hex(buf) == "ee 34 12 01 00 03");
    CHECK(w.size() == 6);
}

TEMPLATE_TEST_CASE("every integer width round-trips", "[core][binary]", std::int8_t, std::uint8_t,
                   std::int16_t, std::uint16_t, std::int32_t, std::uint32_t, std::int64_t,
                   std::uint64_t) {
    using limits = std::numeric_limits<TestType>;
    std::vector<TestType> values = {limits::min(),
                                    limits::max(),
                                    TestType{0},
                                    TestType{1},
                                    static_cast<TestType>(limits::max() - 1),
                                    static_cast<TestType>(limits::min() + 1),
                                    static_cast<TestType>(-1)};
    hivemesh::random_generator rng(7);
    for (int i = 0; i < 1000; ++i)
        values.push_back(static_cast<TestType>(rng()));

    byte_buffer buf;
    binary_writer w(buf);
    for (const auto v : values)
        w.write(v);
    REQUIRE(buf.size() == values.size() * sizeof(TestType));

    binary_reader r(buf);
    for (std::size_t i = 0; i < values.size(); ++i) {
        const TestType got = r.template read<TestType>();
        REQUIRE(got == values[i]);
        REQUIRE(r.position() == (i + 1) * sizeof(TestType));
    }
    CHECK(r.remaining() == 0);
    CHECK_FALSE(r.finish());
    CHECK(r.ok());
}

TEST_CASE("f32 and f64 round-trip bit for bit, NaN payloads and signed zero included",
          "[core][binary]") {
    const std::uint32_t f32_patterns[] = {
        0x00000000u, // +0
        0x80000000u, // -0
        0x3F800000u, // 1
        0x7F800000u, // +inf
        0xFF800000u, // -inf
        0x7FC00000u, // quiet NaN
        0xFFC00001u, // negative quiet NaN with payload
        0x7F800001u, // signalling NaN
        0x7FBFFFFFu, // signalling NaN, full payload
        0x00000001u, // smallest subnormal
        0x807FFFFFu, // largest negative subnormal
        0x7F7FFFFFu, // largest finite
    };
    const std::uint64_t f64_patterns[] = {
        0x0000000000000000ull, 0x8000000000000000ull, 0x3FF0000000000000ull, 0x7FF0000000000000ull,
        0xFFF0000000000000ull, 0x7FF8000000000000ull, 0xFFF8000000000001ull, 0x7FF0000000000001ull,
        0x7FF7FFFFFFFFFFFFull, 0x0000000000000001ull, 0x800FFFFFFFFFFFFFull, 0x7FEFFFFFFFFFFFFFull,
    };
    byte_buffer buf;
    binary_writer w(buf);
    for (const auto bits : f32_patterns)
        w.write_f32(std::bit_cast<float>(bits));
    for (const auto bits : f64_patterns)
        w.write_f64(std::bit_cast<double>(bits));
    REQUIRE(buf.size() == std::size(f32_patterns) * 4 + std::size(f64_patterns) * 8);

    binary_reader r(buf);
    for (const auto bits : f32_patterns)
        CHECK(std::bit_cast<std::uint32_t>(r.read_f32()) == bits);
    for (const auto bits : f64_patterns)
        CHECK(std::bit_cast<std::uint64_t>(r.read_f64()) == bits);
    CHECK_FALSE(r.finish());

    // The byte layout is the integer layout of the bits.
    buf.clear();
    w.write_f32(std::bit_cast<float>(0xFFC00001u));
    CHECK(hex(buf) == "01 00 c0 ff");
}

TEST_CASE("sized bytes and strings round-trip", "[core][binary]") {
    const std::string big(70000, 'q');
    byte_buffer buf;
    binary_writer w(buf);
    w.write_string("");
    w.write_string("hello");
    w.write_sized_bytes(hivemesh::as_bytes(big));
    w.write_sized_bytes(bytes_of({0, 1, 0xFF}));

    binary_reader r(buf);
    CHECK(r.read_string(0).empty());
    CHECK(r.read_string(5) == "hello");
    const byte_view view = r.read_sized_bytes(big.size());
    CHECK(hivemesh::as_string_view(view) == big);
    // The view points into the input: nothing was copied.
    CHECK(view.data() == buf.data() + 4 + 4 + 5 + 4);
    CHECK(hex(r.read_sized_bytes(3)) == "00 01 ff");
    CHECK_FALSE(r.finish());
}

namespace {

// A message with one field of every kind, and where each field ends in the encoding.
struct message {
    std::uint8_t a = 0;
    std::uint16_t b = 0;
    std::uint32_t c = 0;
    std::uint64_t d = 0;
    std::int32_t e = 0;
    float f = 0;
    double g = 0;
    std::string h;
    std::vector<std::uint16_t> items;
    std::string i;

    bool operator==(const message&) const = default;
};

const message sample{0x11,    0x2233,    0x44556677u, 0x8899AABBCCDDEEFFull, -5, 1.5f, -2.25,
                     "hello", {7, 8, 9}, "z"};

// Calls `f` on each field of `m` in encoding order: the one list encode(), decode() and
// expected_prefix() share.
template <class Message, class F>
void for_each_field(Message& m, F f) {
    std::apply([&](auto&... field) { (f(field), ...); },
               std::tie(m.a, m.b, m.c, m.d, m.e, m.f, m.g, m.h, m.items, m.i));
}

// One field, with the writer call for its type.
void write_field(binary_writer& w, std::integral auto value) {
    w.write(value);
}
void write_field(binary_writer& w, float value) {
    w.write_f32(value);
}
void write_field(binary_writer& w, double value) {
    w.write_f64(value);
}
void write_field(binary_writer& w, const std::string& value) {
    w.write_string(value);
}
void write_field(binary_writer& w, const std::vector<std::uint16_t>& items) {
    w.write(static_cast<std::uint64_t>(items.size()));
    for (const auto x : items)
        w.write(x);
}

// One field, with the reader call for its type (strings and lists of at most 100).
template <std::integral T>
void read_field(binary_reader& r, T& value) {
    value = r.read<T>();
}
void read_field(binary_reader& r, float& value) {
    value = r.read_f32();
}
void read_field(binary_reader& r, double& value) {
    value = r.read_f64();
}
void read_field(binary_reader& r, std::string& value) {
    value = r.read_string(100);
}
void read_field(binary_reader& r, std::vector<std::uint16_t>& items) {
    const std::size_t n = r.read_count(sizeof(std::uint16_t), 100);
    items.reserve(n);
    for (std::size_t k = 0; k < n; ++k)
        items.push_back(r.read<std::uint16_t>());
}

// Encodes `m` and records the offset at which each field's encoding ends. read_count checks
// that every element is present, so the count field "ends" with its elements.
byte_buffer encode(const message& m, std::vector<std::size_t>& ends) {
    byte_buffer buf;
    binary_writer w(buf);
    ends.clear();
    for_each_field(m, [&](const auto& field) {
        write_field(w, field);
        ends.push_back(w.size());
    });
    return buf;
}

message decode(binary_reader& r) {
    message m;
    for_each_field(m, [&](auto& field) { read_field(r, field); });
    return m;
}

// What decode() must return for a prefix that ends inside field `first_missing`: every
// earlier field intact, that field and every later one zero (errors are sticky).
message expected_prefix(std::size_t first_missing) {
    message m = sample;
    std::size_t index = 0;
    for_each_field(m, [&](auto& field) {
        if (index++ >= first_missing) field = {};
    });
    return m;
}

} // namespace

TEST_CASE("a whole message decodes and finish() accepts it", "[core][binary]") {
    std::vector<std::size_t> ends;
    const byte_buffer buf = encode(sample, ends);
    REQUIRE(ends.size() == 10);
    REQUIRE(buf.size() == 1 + 2 + 4 + 8 + 4 + 4 + 8 + (4 + 5) + (8 + 6) + (4 + 1));
    binary_reader r(buf);
    CHECK(decode(r) == sample);
    CHECK(r.position() == buf.size());
    CHECK_FALSE(r.finish());
    CHECK(r.ok());
}

TEST_CASE("every truncation fails with truncated_input and sticky zeros", "[core][binary]") {
    std::vector<std::size_t> ends;
    const byte_buffer buf = encode(sample, ends);
    for (std::size_t len = 0; len < buf.size(); ++len) {
        INFO("prefix length " << len);
        binary_reader r(byte_view(buf).first(len));
        const message got = decode(r);
        std::size_t first_missing = 0;
        while (ends[first_missing] <= len)
            ++first_missing;
        CHECK(got == expected_prefix(first_missing));
        // Zero means +0.0 exactly, not merely something equal to it.
        if (first_missing <= 5) CHECK(std::bit_cast<std::uint32_t>(got.f) == 0u);
        if (first_missing <= 6) CHECK(std::bit_cast<std::uint64_t>(got.g) == 0u);
        CHECK(r.error() == errc::truncated_input);
        CHECK_FALSE(r.ok());
        CHECK(r.remaining() == 0);
        CHECK(r.position() == len);
        CHECK(r.rest().empty());
        // Later reads keep failing and the first error stays.
        CHECK(r.read<std::uint64_t>() == 0);
        CHECK(r.read_bytes(0).empty());
        CHECK(r.finish() == errc::truncated_input);
    }
}

TEST_CASE("finish() reports trailing data", "[core][binary]") {
    std::vector<std::size_t> ends;
    byte_buffer buf = encode(sample, ends);
    buf.push_back(std::byte{0});
    binary_reader r(buf);
    CHECK(decode(r) == sample); // the fields themselves are fine
    CHECK(r.ok());
    CHECK(r.remaining() == 1);
    CHECK(r.finish() == errc::trailing_data);
    CHECK(r.error() == errc::trailing_data);
    CHECK(r.remaining() == 0);
    CHECK(r.finish() == errc::trailing_data);

    binary_reader empty(byte_view{});
    CHECK_FALSE(empty.finish());

    const byte_buffer unread_input = bytes_of({1, 2});

    binary_reader unread(unread_input);
    CHECK(unread.read<std::uint8_t>() == 1);
    CHECK(unread.finish() == errc::trailing_data);
    CHECK(unread.read<std::uint8_t>() == 0);
}

TEST_CASE("the first error wins", "[core][binary]") {
    SECTION("an explicit failure, then a truncation") {
        const byte_buffer r_input = bytes_of({1, 2, 3, 4, 5, 6, 7, 8});
        binary_reader r(r_input);
        CHECK(r.read<std::uint8_t>() == 1);
        CHECK_FALSE(r.fail(errc::corrupt_data));
        // fail() also drops the rest: reads that would have fitted return zero now.
        CHECK(r.remaining() == 0);
        CHECK(r.read<std::uint8_t>() == 0);
        CHECK(r.read<std::uint64_t>() == 0);
        CHECK(r.error() == errc::corrupt_data);
        CHECK(r.finish() == errc::corrupt_data);
    }
    SECTION("a truncation, then explicit failures") {
        const byte_buffer r_input = bytes_of({1, 2});
        binary_reader r(r_input);
        CHECK(r.read<std::uint32_t>() == 0);
        CHECK(r.error() == errc::truncated_input);
        r.fail(errc::bad_magic);
        r.fail(std::make_error_code(std::errc::io_error));
        CHECK(r.error() == errc::truncated_input);
    }
    SECTION("a limit, then a truncation") {
        byte_buffer buf;
        binary_writer w(buf);
        w.write(std::uint32_t{50});
        binary_reader r(buf);
        CHECK(r.read_sized_bytes(10).empty());
        CHECK(r.error() == errc::length_limit_exceeded);
        CHECK(r.read<std::uint8_t>() == 0);
        CHECK(r.error() == errc::length_limit_exceeded);
    }
    SECTION("a foreign error code is kept as is") {
        const byte_buffer r_input = bytes_of({1});
        binary_reader r(r_input);
        r.fail(std::make_error_code(std::errc::io_error));
        CHECK(r.error() == std::errc::io_error);
        CHECK(r.finish() == std::errc::io_error);
    }
}

namespace {

byte_buffer count_message(std::uint64_t count, std::size_t payload_bytes) {
    byte_buffer buf;
    binary_writer w(buf);
    w.write(count);
    w.grow(payload_bytes);
    return buf;
}

// A decoder that trusts read_count() and allocates what it returns, as real ones do.
std::vector<std::uint64_t> decode_u64_array(binary_reader& r, std::size_t max_count) {
    std::vector<std::uint64_t> out;
    out.reserve(r.read_count(sizeof(std::uint64_t), max_count));
    while (out.size() < out.capacity() && r.ok())
        out.push_back(r.read<std::uint64_t>());
    return out;
}

} // namespace

TEST_CASE("read_count checks counts before anything is allocated", "[core][binary]") {
    constexpr std::size_t no_limit = std::numeric_limits<std::size_t>::max();

    SECTION("a count of 2^60 with little behind it is truncated_input, not bad_alloc") {
        const byte_buffer buf = count_message(std::uint64_t{1} << 60, 16);
        binary_reader r(buf);
        std::vector<std::uint64_t> out;
        REQUIRE_NOTHROW(out = decode_u64_array(r, no_limit));
        CHECK(out.empty());
        CHECK(r.error() == errc::truncated_input);
    }
    SECTION("a count whose byte size overflows 64 bits is truncated_input") {
        // 2^61 * 8 == 2^64 wraps to 0; 2^62 + 1 elements of 4 bytes wrap to 4.
        const byte_buffer r_input = count_message(std::uint64_t{1} << 61, 8);
        binary_reader r(r_input);
        CHECK(r.read_count(8, no_limit) == 0);
        CHECK(r.error() == errc::truncated_input);
        const byte_buffer r2_input = count_message((std::uint64_t{1} << 62) + 1, 8);
        binary_reader r2(r2_input);
        CHECK(r2.read_count(4, no_limit) == 0);
        CHECK(r2.error() == errc::truncated_input);
        const byte_buffer r3_input = count_message(std::numeric_limits<std::uint64_t>::max(), 8);
        binary_reader r3(r3_input);
        CHECK(r3.read_count(1, no_limit) == 0);
        CHECK(r3.error() == errc::truncated_input);
    }
    SECTION("a count above the maximum is length_limit_exceeded") {
        const byte_buffer r_input = count_message(std::uint64_t{1} << 60, 16);
        binary_reader r(r_input);
        std::vector<std::uint64_t> out;
        REQUIRE_NOTHROW(out = decode_u64_array(r, 1000));
        CHECK(out.empty());
        CHECK(r.error() == errc::length_limit_exceeded);

        // Even when the elements are all there.
        const byte_buffer r2_input = count_message(11, 11 * 8);
        binary_reader r2(r2_input);
        CHECK(r2.read_count(8, 10) == 0);
        CHECK(r2.error() == errc::length_limit_exceeded);
        CHECK(r2.remaining() == 0);
    }
    SECTION("the limit is checked before the remaining size") {
        const byte_buffer r_input = count_message(1000, 0);
        binary_reader r(r_input);
        CHECK(r.read_count(4, 999) == 0);
        CHECK(r.error() == errc::length_limit_exceeded);
    }
    SECTION("counts at the edges") {
        const byte_buffer exact_input = count_message(3, 12);
        binary_reader exact(exact_input);
        CHECK(exact.read_count(4, 3) == 3); // count == max and bytes == remaining
        CHECK(exact.ok());
        CHECK(exact.remaining() == 12);
        CHECK(exact.position() == 8);

        const byte_buffer one_short_input = count_message(4, 15);

        binary_reader one_short(one_short_input);
        CHECK(one_short.read_count(4, no_limit) == 0);
        CHECK(one_short.error() == errc::truncated_input);

        const byte_buffer zero_input = count_message(0, 0);

        binary_reader zero(zero_input);
        CHECK(zero.read_count(8, 0) == 0);
        CHECK(zero.ok());
        CHECK_FALSE(zero.finish());

        // Zero-sized elements need no bytes but still obey the maximum.
        const byte_buffer empty_elements_input = count_message(5, 0);
        binary_reader empty_elements(empty_elements_input);
        CHECK(empty_elements.read_count(0, 5) == 5);
        CHECK(empty_elements.ok());
        const byte_buffer too_many_input = count_message(6, 0);
        binary_reader too_many(too_many_input);
        CHECK(too_many.read_count(0, 5) == 0);
        CHECK(too_many.error() == errc::length_limit_exceeded);
    }
    SECTION("a truncated count field") {
        const byte_buffer r_input = bytes_of({1, 0, 0, 0, 0, 0, 0});
        binary_reader r(r_input);
        CHECK(r.read_count(1, no_limit) == 0);
        CHECK(r.error() == errc::truncated_input);
    }
    SECTION("a valid array decodes") {
        byte_buffer buf;
        binary_writer w(buf);
        w.write(std::uint64_t{3});
        for (std::uint64_t v : {10u, 20u, 30u})
            w.write(v);
        binary_reader r(buf);
        CHECK(decode_u64_array(r, 3) == std::vector<std::uint64_t>{10, 20, 30});
        CHECK_FALSE(r.finish());
    }
}

TEST_CASE("check_count on its own", "[core][binary]") {
    const byte_buffer buf(16);
    binary_reader r(buf);
    CHECK(r.check_count(4, 4, 4));
    CHECK(r.check_count(16, 1, 100));
    CHECK(r.ok());
    CHECK(r.position() == 0); // checking consumes nothing
    CHECK_FALSE(r.check_count(17, 1, 100));
    CHECK(r.error() == errc::truncated_input);
    CHECK_FALSE(r.check_count(0, 1, 100)); // sticky
    binary_reader r2(buf);
    CHECK_FALSE(r2.check_count(5, 1, 4));
    CHECK(r2.error() == errc::length_limit_exceeded);
}

TEST_CASE("read_sized_bytes and read_string reject hostile lengths", "[core][binary]") {
    constexpr std::size_t no_limit = std::numeric_limits<std::size_t>::max();
    auto sized = [](std::uint32_t length, std::size_t payload) {
        byte_buffer buf;
        binary_writer w(buf);
        w.write(length);
        std::byte* p = w.grow(payload);
        for (std::size_t k = 0; k < payload; ++k)
            p[k] = static_cast<std::byte>('a' + k % 26);
        return buf;
    };

    SECTION("a length larger than what remains") {
        const byte_buffer r_input = sized(0xFFFFFFFFu, 10);
        binary_reader r(r_input);
        CHECK(r.read_sized_bytes(no_limit).empty());
        CHECK(r.error() == errc::truncated_input);

        const byte_buffer s_input = sized(0xFFFFFFFFu, 10);

        binary_reader s(s_input);
        std::string text = "untouched";
        REQUIRE_NOTHROW(text = s.read_string(no_limit));
        CHECK(text.empty());
        CHECK(s.error() == errc::truncated_input);

        const byte_buffer one_short_input = sized(10, 9);

        binary_reader one_short(one_short_input);
        CHECK(one_short.read_sized_bytes(10).empty());
        CHECK(one_short.error() == errc::truncated_input);
    }
    SECTION("a length above the maximum, even when the bytes are there") {
        const byte_buffer r_input = sized(10, 10);
        binary_reader r(r_input);
        CHECK(r.read_sized_bytes(9).empty());
        CHECK(r.error() == errc::length_limit_exceeded);

        const byte_buffer s_input = sized(0xFFFFFFFFu, 0);

        binary_reader s(s_input);
        CHECK(s.read_string(64).empty());
        CHECK(s.error() == errc::length_limit_exceeded);
    }
    SECTION("a length equal to the maximum and to what remains") {
        const byte_buffer buf = sized(10, 10);
        binary_reader r(buf);
        CHECK(hivemesh::as_string_view(r.read_sized_bytes(10)) == "abcdefghij");
        CHECK_FALSE(r.finish());
        binary_reader s(buf);
        CHECK(s.read_string(10) == "abcdefghij");
        CHECK_FALSE(s.finish());
    }
    SECTION("read_bytes") {
        const byte_buffer buf = bytes_of({1, 2, 3});
        binary_reader r(buf);
        CHECK(r.read_bytes(0).empty());
        CHECK(r.ok());
        const byte_view two = r.read_bytes(2);
        CHECK(two.data() == buf.data());
        CHECK(hex(two) == "01 02");
        CHECK(hex(r.rest()) == "03");
        CHECK(r.read_bytes(2).empty());
        CHECK(r.error() == errc::truncated_input);
    }
}

TEST_CASE("byte helpers view without copying", "[core][bytes]") {
    const std::string_view text = "abc";
    const byte_view view = hivemesh::as_bytes(text);
    CHECK(view.size() == 3);
    CHECK(static_cast<const void*>(view.data()) == static_cast<const void*>(text.data()));
    CHECK(hivemesh::as_string_view(view) == "abc");
    CHECK(hivemesh::as_string_view(view).data() == text.data());

    const byte_buffer copy = hivemesh::to_buffer(view);
    CHECK(hex(copy) == "61 62 63");
    CHECK(copy.data() != view.data());

    const std::uint16_t values[] = {0x0102, 0x0304};
    const byte_view raw = hivemesh::as_bytes(std::span<const std::uint16_t>(values));
    CHECK(raw.size() == 4);
    CHECK(static_cast<const void*>(raw.data()) == static_cast<const void*>(values));
}
