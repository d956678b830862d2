#include <hivemesh/core/binary.hpp>
#include <hivemesh/dht/messages.hpp>
#include <hivemesh/dht/typed.hpp>

#include <catch2/catch.hpp>

#include "support/bytes.hpp"

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <system_error>
#include <vector>

namespace dht = hivemesh::dht;
using hivemesh::byte_buffer;
using hivemesh::byte_view;
using hivemesh::errc;

namespace {

using hivemesh::test::bytes_of;

using hivemesh::test::hex;

template <class T>
std::string encode_hex(const T& value) {
    return hex(dht::encode_value(value));
}

template <class T>
T round_trip(const T& value) {
    T out{};
    REQUIRE(dht::decode_value(dht::encode_value(value), out) == std::error_code{});
    return out;
}

enum class colour : std::uint16_t { red = 1, blue = 0x0102 };
enum plain_enum : std::int8_t { minus_one = -1 };

struct point {
    std::int32_t x;
    std::int32_t y;
    friend bool operator==(const point&, const point&) = default;
};

struct padded { // 3 padding bytes after `tag`
    std::uint8_t tag;
    std::uint32_t value;
};

struct with_double { // doubles have several representations of the same value (±0, NaNs)
    double d;
};

// A user type with its own codec: a name and two numbers, laid out with the binary writer.
struct peer_stats {
    std::string name;
    std::uint32_t steps = 0;
    double loss = 0;
    friend bool operator==(const peer_stats&, const peer_stats&) = default;
};

} // namespace

template <>
struct hivemesh::dht::value_codec<peer_stats> {
    static constexpr std::size_t max_name = 64;

    static byte_buffer encode(const peer_stats& s) {
        byte_buffer out;
        binary_writer w(out);
        w.write_string(s.name);
        w.write(s.steps);
        w.write_f64(s.loss);
        return out;
    }
    static std::error_code decode(byte_view bytes, peer_stats& out) noexcept {
        try {
            binary_reader r(bytes);
            peer_stats s;
            s.name = r.read_string(max_name);
            s.steps = r.read<std::uint32_t>();
            s.loss = r.read_f64();
            if (const auto ec = r.finish()) return ec;
            out = std::move(s);
            return {};
        } catch (const std::bad_alloc&) {
            return std::make_error_code(std::errc::not_enough_memory);
        }
    }
};

static_assert(dht::value_encodable<int>);
static_assert(dht::value_encodable<bool>);
static_assert(dht::value_encodable<double>);
static_assert(dht::value_encodable<colour>);
static_assert(dht::value_encodable<std::string>);
static_assert(dht::value_encodable<byte_buffer>);
static_assert(dht::value_encodable<point>);
static_assert(dht::value_encodable<std::array<std::uint16_t, 3>>);
static_assert(dht::value_encodable<std::vector<point>>);
static_assert(dht::value_encodable<std::vector<float>>);
static_assert(dht::value_encodable<peer_stats>);
static_assert(dht::value_encodable<dht::store_status>);
// No codec for types whose bytes are not their value.
static_assert(!dht::value_encodable<padded>);
static_assert(!dht::value_encodable<with_double>);
static_assert(!dht::value_encodable<int*>);
static_assert(!dht::value_encodable<long double>);
static_assert(!dht::value_encodable<std::vector<std::string>>);
static_assert(!dht::value_encodable<std::vector<padded>>);

TEST_CASE("typed values: integers are little-endian with exact widths", "[dht]") {
    CHECK(encode_hex(std::uint8_t{0xAB}) == "ab");
    CHECK(encode_hex(std::int16_t{-2}) == "fe ff");
    CHECK(encode_hex(std::uint32_t{0x01020304}) == "04 03 02 01");
    CHECK(encode_hex(std::int64_t{-1}) == "ff ff ff ff ff ff ff ff");
    CHECK(encode_hex(std::uint64_t{0x0102030405060708}) == "08 07 06 05 04 03 02 01");
    CHECK(encode_hex('A') == "41");

    std::uint32_t u = 0;
    CHECK(dht::decode_value(bytes_of({0x04, 0x03, 0x02, 0x01}), u) == std::error_code{});
    CHECK(u == 0x01020304);
    for (const auto v : {std::numeric_limits<std::int64_t>::min(), std::int64_t{-1},
                         std::int64_t{0}, std::numeric_limits<std::int64_t>::max()})
        CHECK(round_trip(v) == v);
    CHECK(round_trip(std::numeric_limits<std::uint16_t>::max()) == 0xFFFF);
}

TEST_CASE("typed values: exact size is required", "[dht]") {
    std::uint32_t u = 7;
    CHECK(dht::decode_value(bytes_of({1, 2, 3}), u) == errc::truncated_input);
    CHECK(dht::decode_value(bytes_of({}), u) == errc::truncated_input);
    CHECK(dht::decode_value(bytes_of({1, 2, 3, 4, 5}), u) == errc::trailing_data);
    CHECK(u == 7); // untouched on failure
    point p{1, 2};
    CHECK(dht::decode_value(byte_buffer(7), p) == errc::truncated_input);
    CHECK(dht::decode_value(byte_buffer(9), p) == errc::trailing_data);
    CHECK(p == point{1, 2});
    std::vector<std::int32_t> v{5};
    CHECK(dht::decode_value(byte_buffer(6), v) == errc::truncated_input);
    CHECK(v == std::vector<std::int32_t>{5});
}

TEST_CASE("typed values: bool is one byte, 0 or 1", "[dht]") {
    CHECK(encode_hex(true) == "01");
    CHECK(encode_hex(false) == "00");
    bool b = false;
    CHECK(dht::decode_value(bytes_of({1}), b) == std::error_code{});
    CHECK(b);
    CHECK(dht::decode_value(bytes_of({0}), b) == std::error_code{});
    CHECK(!b);
    b = true;
    CHECK(dht::decode_value(bytes_of({2}), b) == errc::corrupt_data);
    CHECK(dht::decode_value(bytes_of({0xFF}), b) == errc::corrupt_data);
    CHECK(b);

    std::vector<bool> flags;
    CHECK(dht::decode_value(bytes_of({1, 0, 1}), flags) == std::error_code{});
    CHECK(flags == std::vector<bool>{true, false, true});
    CHECK(dht::encode_value(flags) == bytes_of({1, 0, 1}));
    CHECK(dht::decode_value(bytes_of({1, 3}), flags) == errc::corrupt_data);
    CHECK(flags == std::vector<bool>{true, false, true});
}

TEST_CASE("typed values: floats keep their bit patterns", "[dht]") {
    CHECK(encode_hex(1.0f) == "00 00 80 3f");
    CHECK(encode_hex(-2.0) == "00 00 00 00 00 00 00 c0");
    CHECK(encode_hex(-0.0f) == "00 00 00 80");
    CHECK(std::signbit(round_trip(-0.0)));
    CHECK(round_trip(std::numeric_limits<double>::infinity()) ==
          std::numeric_limits<double>::infinity());
    CHECK(round_trip(std::numeric_limits<float>::denorm_min()) ==
          std::numeric_limits<float>::denorm_min());
    const float nan = std::bit_cast<float>(std::uint32_t{0x7FC01234}); // NaN with a payload
    CHECK(std::bit_cast<std::uint32_t>(round_trip(nan)) == 0x7FC01234);
    double d = 0;
    CHECK(dht::decode_value(bytes_of({0, 0, 0, 0, 0, 0, 0xF0, 0x3F}), d) == std::error_code{});
    CHECK(d == 1.0);
}

TEST_CASE("typed values: enums use their underlying type", "[dht]") {
    CHECK(encode_hex(colour::blue) == "02 01");
    CHECK(encode_hex(minus_one) == "ff");
    CHECK(round_trip(colour::red) == colour::red);
    CHECK(round_trip(minus_one) == minus_one);
    CHECK(encode_hex(dht::store_status::rate_limited) == "07");
    // Values outside the named ones are kept: validation is the application's business.
    colour c = colour::red;
    CHECK(dht::decode_value(bytes_of({0x34, 0x12}), c) == std::error_code{});
    CHECK(static_cast<std::uint16_t>(c) == 0x1234);
}

TEST_CASE("typed values: strings and bytes are stored as they are", "[dht]") {
    CHECK(encode_hex(std::string("hi")) == "68 69");
    CHECK(dht::encode_value(std::string()).empty());
    const std::string with_nul("a\0b", 3);
    CHECK(round_trip(with_nul) == with_nul);
    CHECK(round_trip(std::string()) == std::string());
    CHECK(round_trip(std::string(70000, 'x')) == std::string(70000, 'x'));

    const byte_buffer raw = bytes_of({0, 0xFF, 7});
    CHECK(dht::encode_value(raw) == raw);
    CHECK(round_trip(raw) == raw);
    CHECK(round_trip(byte_buffer{}).empty());
}

TEST_CASE("typed values: padding-free structs and vectors of them", "[dht]") {
    CHECK(encode_hex(point{1, -1}) == "01 00 00 00 ff ff ff ff");
    CHECK(round_trip(point{-7, 42}) == point{-7, 42});
    const std::array<std::uint16_t, 3> triple{1, 2, 0xABCD};
    CHECK(encode_hex(triple) == "01 00 02 00 cd ab");
    CHECK(round_trip(triple) == triple);

    const std::vector<point> path{{1, 2}, {3, 4}, {-5, 6}};
    CHECK(dht::encode_value(path).size() == 24);
    CHECK(encode_hex(std::vector<point>{{1, 2}}) == "01 00 00 00 02 00 00 00");
    CHECK(round_trip(path) == path);
    CHECK(round_trip(std::vector<point>{}).empty());
    const std::vector<std::uint16_t> shorts{1, 0x0203};
    CHECK(encode_hex(shorts) == "01 00 03 02");
    CHECK(round_trip(shorts) == shorts);
    const std::vector<double> doubles{0.5, -1e300};
    CHECK(round_trip(doubles) == doubles);
    const std::vector<colour> colours{colour::blue, colour::red};
    CHECK(encode_hex(colours) == "02 01 01 00");
    CHECK(round_trip(colours) == colours);
}

TEST_CASE("typed values: user codecs", "[dht]") {
    const peer_stats stats{"trainer-3", 1200, 0.25};
    const byte_buffer encoded = dht::encode_value(stats);
    CHECK(hex(encoded) == "09 00 00 00 74 72 61 69 6e 65 72 2d 33 b0 04 00 00 "
                          "00 00 00 00 00 00 d0 3f");
    CHECK(round_trip(stats) == stats);

    peer_stats out{"kept", 1, 1};
    CHECK(dht::decode_value(byte_view(encoded).first(encoded.size() - 1), out) ==
          errc::truncated_input);
    byte_buffer longer = encoded;
    longer.push_back(std::byte{0});
    CHECK(dht::decode_value(longer, out) == errc::trailing_data);
    CHECK(out == peer_stats{"kept", 1, 1});

    // A typed value travels as a record's value through a store request unchanged.
    dht::store_request request;
    request.items.push_back({{hivemesh::to_buffer(hivemesh::as_bytes(std::string_view("stats"))),
                              std::nullopt,
                              encoded,
                              hivemesh::time_point{},
                              {}},
                             false});
    dht::store_request received;
    REQUIRE(dht::decode(dht::encode(request), received) == std::error_code{});
    peer_stats decoded;
    REQUIRE(dht::decode_value(received.items.at(0).item.value, decoded) == std::error_code{});
    CHECK(decoded == stats);
}
