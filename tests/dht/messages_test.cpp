#include <hivemesh/core/random.hpp>
#include <hivemesh/dht/messages.hpp>

#include <catch2/catch.hpp>

#include "support/bytes.hpp"
#include "support/identities.hpp"
#include "support/time.hpp"

#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <limits>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace dht = hivemesh::dht;
using hivemesh::byte_buffer;
using hivemesh::byte_view;
using hivemesh::errc;
using hivemesh::crypto::peer_id;
using hivemesh::net::peer_address;

namespace {

using hivemesh::test::at_nanoseconds;
using hivemesh::test::bytes_of;
using hivemesh::test::hex;

byte_buffer filled(std::size_t n, int value) {
    return byte_buffer(n, static_cast<std::byte>(value));
}

peer_id test_peer(int fill) {
    peer_id::bytes_type bytes;
    bytes.fill(static_cast<std::byte>(fill));
    return peer_id(bytes);
}

// One address of every protocol, including the longest host the binary form allows.
const std::vector<peer_address> addresses = {
    peer_address::from_string("/ip4/127.0.0.1/tcp/4242"),
    peer_address::from_string("/ip4/0.0.0.0/tcp/0"),
    peer_address::from_string("/ip6/::1/tcp/65535"),
    peer_address::from_string("/ip6/2001:db8::1:0:0:1/tcp/443"),
    peer_address::from_string("/dns/peer-7.swarm.example.org/tcp/31337"),
    peer_address::from_string("/dns/" + std::string(63, 'a') + "." + std::string(63, 'b') + "." +
                              std::string(63, 'c') + "." + std::string(61, 'd') + "/tcp/2"),
    peer_address::from_string("/sim/0/port/0"),
    peer_address::sim(18446744073709551615ULL, 7),
};

// Client mode first, then every address.
std::vector<dht::sender_info> senders() {
    std::vector<dht::sender_info> out{dht::sender_info{}};
    for (const auto& a : addresses)
        out.push_back({a});
    return out;
}

/// Builds raw messages field by field, to write what the encoder never would.
struct raw {
    byte_buffer bytes;
    hivemesh::binary_writer w{bytes};

    raw() = default;
    raw(int version, int type) { u8(version).u8(type); }
    raw& u8(int v) {
        w.write(static_cast<std::uint8_t>(v));
        return *this;
    }
    raw& u16(std::uint16_t v) {
        w.write(v);
        return *this;
    }
    raw& u32(std::uint32_t v) {
        w.write(v);
        return *this;
    }
    raw& i64(std::int64_t v) {
        w.write(v);
        return *this;
    }
    raw& sized(std::string_view s) {
        w.write_string(s);
        return *this;
    }
    raw& put(byte_view b) {
        w.write_bytes(b);
        return *this;
    }
    raw& str(std::string_view s) { return put(hivemesh::as_bytes(s)); }
    /// An address in binary form: protocol, host, port and has_peer as given.
    raw& address(int proto, std::string_view host, std::uint16_t port = 1, int has_peer = 0) {
        u8(proto).u8(static_cast<int>(host.size())).str(host).u16(port).u8(has_peer);
        return *this;
    }
    /// stored_value: value, expiration, signature.
    raw& value(std::string_view v, std::int64_t expiration = 1, std::string_view sig = "") {
        return sized(v).i64(expiration).sized(sig);
    }
};

template <class M>
std::error_code decode_as(byte_view bytes, const dht::message_limits& limits = {}) {
    M out;
    return dht::decode(bytes, out, limits);
}

/// A message to recognise: decoders must leave their output alone on failure.
template <class M>
M sentinel();
template <>
dht::ping_request sentinel<dht::ping_request>() {
    return {{addresses[0]}};
}
template <>
dht::ping_response sentinel<dht::ping_response>() {
    return {};
}
template <>
dht::store_request sentinel<dht::store_request>() {
    return {{},
            {{{bytes_of("sentinel"), std::nullopt, bytes_of("v"), at_nanoseconds(5), {}}, true}}};
}
template <>
dht::store_response sentinel<dht::store_response>() {
    return {{dht::store_status::rate_limited}};
}
template <>
dht::find_request sentinel<dht::find_request>() {
    return {{}, {dht::id::of_key("sentinel")}, 3};
}
template <>
dht::find_response sentinel<dht::find_response>() {
    return {{dht::find_result{std::nullopt, {{test_peer(9), addresses[6]}}}}};
}

/// Every prefix of `bytes` (all of them for small messages, a sample for large ones) is
/// refused as truncated_input and leaves the output alone; so is every extension.
template <class M>
void check_truncations_and_trailing(const byte_buffer& bytes) {
    std::vector<std::size_t> lengths;
    const std::size_t n = bytes.size();
    if (n <= 4096) {
        for (std::size_t i = 0; i < n; ++i)
            lengths.push_back(i);
    } else {
        for (std::size_t i = 0; i < 512; ++i)
            lengths.push_back(i), lengths.push_back(n - 1 - i);
        for (std::size_t i = 0; i < 2000; ++i)
            lengths.push_back(n * i / 2000);
    }
    std::size_t wrong = 0, first_wrong = 0;
    std::error_code wrong_code;
    for (const std::size_t length : lengths) {
        M out = sentinel<M>();
        const auto ec = dht::decode(byte_view(bytes).first(length), out);
        if ((ec != errc::truncated_input || !(out == sentinel<M>())) && wrong++ == 0) {
            first_wrong = length;
            wrong_code = ec;
        }
    }
    INFO("first bad prefix length " << first_wrong << " of " << n << ": " << wrong_code.message());
    CHECK(wrong == 0);

    for (const int extra : {0x00, 0x01, 0xFF}) {
        byte_buffer longer = bytes;
        longer.push_back(static_cast<std::byte>(extra));
        M out = sentinel<M>();
        CHECK(dht::decode(longer, out) == errc::trailing_data);
        CHECK(out == sentinel<M>());
    }
}

/// decode(encode(m)) == m, the encoding is canonical, every truncation and extension is
/// refused. Returns the encoding.
template <class M>
byte_buffer check_round_trip(const M& message) {
    const byte_buffer bytes = dht::encode(message);
    M decoded = sentinel<M>();
    REQUIRE(dht::decode(bytes, decoded) == std::error_code{});
    CHECK(decoded == message);
    CHECK(dht::encode(decoded) == bytes);
    check_truncations_and_trailing<M>(bytes);
    return bytes;
}

dht::record make_record(std::string_view key, std::optional<std::string_view> subkey,
                        std::string_view value, std::int64_t expiration,
                        std::string_view signature = "") {
    dht::record r;
    r.key = bytes_of(key);
    if (subkey) r.subkey = bytes_of(*subkey);
    r.value = bytes_of(value);
    r.expiration = at_nanoseconds(expiration);
    r.signature = bytes_of(signature);
    return r;
}

dht::stored_value make_value(std::string_view value, std::int64_t expiration,
                             std::string_view signature = "") {
    return {bytes_of(value), at_nanoseconds(expiration), bytes_of(signature)};
}

constexpr std::int64_t i64_min = std::numeric_limits<std::int64_t>::min();
constexpr std::int64_t i64_max = std::numeric_limits<std::int64_t>::max();
constexpr std::uint32_t u32_max = std::numeric_limits<std::uint32_t>::max();

} // namespace

TEST_CASE("dht messages: exact bytes of small messages", "[dht]") {
    CHECK(hex(dht::encode(dht::ping_response{})) == "03 02");
    CHECK(hex(dht::encode(dht::ping_request{})) == "03 01 00");
    CHECK(hex(dht::encode(dht::ping_request{{peer_address::sim(7, 9)}})) ==
          "03 01 01 03 01 37 09 00 00");

    dht::store_request store;
    store.items.push_back({make_record("k", std::nullopt, "v", 1), true});
    store.items.push_back({make_record("", std::string_view("s"), "", -1, "g"), false});
    CHECK(hex(dht::encode(store)) == "03 03 00 02 00 00 00 "
                                     "01 00 00 00 6b 00 01 00 00 00 76 "
                                     "01 00 00 00 00 00 00 00 00 00 00 00 01 "
                                     "00 00 00 00 01 01 00 00 00 73 00 00 00 00 "
                                     "ff ff ff ff ff ff ff ff 01 00 00 00 67 00");

    CHECK(hex(dht::encode(
              dht::store_response{{dht::store_status::stored, dht::store_status::rate_limited}})) ==
          "03 04 02 00 00 00 00 07");

    dht::id key(dht::id::bytes_type{0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19,
                                    0x1a, 0x1b, 0x1c, 0x1d, 0x1e, 0x1f, 0x20, 0x21, 0x22, 0x23});
    CHECK(hex(dht::encode(dht::find_request{{}, {key}, 5})) ==
          "03 05 00 01 05 00 00 00 01 00 00 00 "
          "10 11 12 13 14 15 16 17 18 19 1a 1b 1c 1d 1e 1f 20 21 22 23 00 00 00 00");

    dht::find_request carrying{
        {}, {key}, 5, {{make_record("k", std::nullopt, "v", 1), false}}, false};
    CHECK(hex(dht::encode(carrying)) ==
          "03 05 00 00 05 00 00 00 01 00 00 00 "
          "10 11 12 13 14 15 16 17 18 19 1a 1b 1c 1d 1e 1f 20 21 22 23 01 00 00 00 "
          "01 00 00 00 6b 00 01 00 00 00 76 01 00 00 00 00 00 00 00 00 00 00 00 00");
    CHECK(hex(dht::encode(dht::find_response{{}, {dht::store_status::outdated}})) ==
          "03 06 00 00 00 00 01 00 00 00 01");

    dht::key_entry entry;
    entry.key = bytes_of("k");
    entry.dictionary[bytes_of("a")] = make_value("x", 2);
    dht::find_response found{
        {{entry, {{test_peer(0xAA), peer_address::from_string("/ip4/1.2.3.4/tcp/258")}}}}};
    CHECK(hex(dht::encode(found)) ==
          "03 06 01 00 00 00 01 01 00 00 00 6b 00 01 00 00 00 01 00 00 00 61 "
          "01 00 00 00 78 02 00 00 00 00 00 00 00 00 00 00 00 01 00 00 00 00 " +
              hex(filled(32, 0xAA)) + " 00 07 31 2e 32 2e 33 2e 34 02 01 00 00 00 00 00");
    // A peer whose key is known travels as that key, flagged; its PeerId is the key's.
    const auto peer_key = hivemesh::test::identity_of(5).public_key();
    const dht::find_response keyed{
        {{std::nullopt,
          {{peer_key.id(), peer_address::from_string("/ip4/1.2.3.4/tcp/258"), peer_key}}}}};
    CHECK(hex(dht::encode(keyed)) ==
          "03 06 01 00 00 00 00 01 00 00 00 01 " +
              hex(byte_buffer(peer_key.view().begin(), peer_key.view().end())) +
              " 00 07 31 2e 32 2e 33 2e 34 02 01 00 00 00 00 00");
}

TEST_CASE("dht messages: ping round trips", "[dht]") {
    for (const auto& from : senders()) {
        INFO((from.listen ? from.listen->to_string() : "client mode"));
        check_round_trip(dht::ping_request{from});
    }
    check_round_trip(dht::ping_response{});
}

TEST_CASE("dht messages: store request round trips", "[dht]") {
    const dht::message_limits limits;
    std::vector<dht::store_item> items = {
        {make_record("", std::nullopt, "", 0), false},        // everything empty or zero
        {make_record("", std::string_view(""), "", 0), true}, // empty subkey is not no subkey
        {make_record(std::string_view("\0", 1), std::string_view("\0", 1),
                     std::string_view("\0\0", 2), 0),
         false},
        {make_record("0", std::string_view("0"), "0", -1, "0"), false},
        {make_record("key", std::string_view("subkey"), "value", i64_min, "sig"), true},
        {make_record("key", std::nullopt, "value", i64_max), false},
    };
    for (const auto& from : senders()) {
        INFO((from.listen ? from.listen->to_string() : "client mode"));
        check_round_trip(dht::store_request{from, {}});
        check_round_trip(dht::store_request{from, items});
    }
    for (const auto& item : items)
        check_round_trip(dht::store_request{{}, {item}});

    SECTION("every field at its maximum size") {
        dht::record big;
        big.key = filled(limits.max_key_size, 1);
        big.subkey = filled(limits.max_subkey_size, 2);
        big.value = filled(limits.max_value_size, 3);
        big.signature = filled(limits.max_signature_size, 4);
        big.expiration = at_nanoseconds(123);
        check_round_trip(dht::store_request{{addresses[5]}, {{big, true}}});
    }
    SECTION("the maximum number of items") {
        dht::store_request many{{addresses[0]}, {}};
        for (std::size_t i = 0; i < limits.max_items; ++i)
            many.items.push_back(
                {make_record(std::to_string(i), std::nullopt, "v", static_cast<std::int64_t>(i)),
                 i % 2 == 0});
        check_round_trip(many);
    }
}

TEST_CASE("dht messages: store response round trips", "[dht]") {
    check_round_trip(dht::store_response{});
    dht::store_response all;
    for (int s = 0; s <= dht::max_store_status; ++s)
        all.statuses.push_back(static_cast<dht::store_status>(s));
    check_round_trip(all);
    dht::store_response many;
    for (std::size_t i = 0; i < dht::message_limits{}.max_items; ++i)
        many.statuses.push_back(static_cast<dht::store_status>(i % 8));
    check_round_trip(many);
}

TEST_CASE("dht messages: find request round trips", "[dht]") {
    const dht::message_limits limits;
    std::vector<dht::id> keys = {dht::id{}, dht::id::of_key(""), dht::id::of_key("a"),
                                 dht::id::of_key("a")}; // duplicates are the caller's business
    for (const auto& from : senders()) {
        INFO((from.listen ? from.listen->to_string() : "client mode"));
        check_round_trip(dht::find_request{from, {}, 0});
        check_round_trip(dht::find_request{from, keys, 20});
    }
    check_round_trip(dht::find_request{{}, keys, static_cast<std::uint32_t>(limits.max_peers)});
    dht::find_request many{{addresses[2]}, {}, 1};
    for (std::size_t i = 0; i < limits.max_items; ++i)
        many.keys.push_back(dht::id::of_key(std::to_string(i)));
    check_round_trip(many);

    SECTION("with records to store, wanting values or not") {
        const std::vector<dht::store_item> items = {
            {make_record("", std::nullopt, "", 0), false},
            {make_record("key", std::string_view("subkey"), "value", i64_min, "sig"), true},
            {make_record("a", std::nullopt, "value", i64_max), false},
        };
        for (const bool want_values : {false, true}) {
            check_round_trip(dht::find_request{{addresses[0]}, keys, 20, items, want_values});
            check_round_trip(dht::find_request{{}, {}, 0, items, want_values});
            check_round_trip(dht::find_request{{addresses[6]}, keys, 5, {}, want_values});
        }
        dht::find_request most{{addresses[1]}, many.keys, 20, {}, false};
        for (std::size_t i = 0; i < limits.max_items; ++i)
            most.items.push_back(
                {make_record(std::to_string(i), std::nullopt, "v", static_cast<std::int64_t>(i)),
                 i % 2 == 0});
        check_round_trip(most);
    }
}

TEST_CASE("dht messages: find response round trips", "[dht]") {
    const dht::message_limits limits;
    std::vector<dht::peer_info> peers;
    for (std::size_t i = 0; i < addresses.size(); ++i)
        peers.push_back({test_peer(static_cast<int>(i)), addresses[i]});
    // Every other one with its key.
    for (std::size_t i = 0; i < peers.size(); i += 2) {
        peers[i].key = hivemesh::test::identity_of(static_cast<std::uint8_t>(i + 1)).public_key();
        peers[i].peer = peers[i].key->id();
    }
    // A key that does not prove the PeerId next to it is not encoded.
    auto mismatched = peers[0];
    mismatched.peer = test_peer(1);
    CHECK_THROWS_AS(dht::encode(dht::find_response{{{std::nullopt, {mismatched}}}}),
                    std::system_error);

    dht::key_entry empty_entry; // neither plain nor dictionary: holds nothing, still valid
    dht::key_entry plain;
    plain.key = bytes_of("plain");
    plain.plain = make_value("", 0);
    dht::key_entry falsy;
    falsy.plain = make_value(std::string_view("\0", 1), -1, std::string_view("\0", 1));
    dht::key_entry dictionary;
    dictionary.key = bytes_of("dict");
    // Unsigned byte order, prefixes before extensions, the empty subkey first.
    for (const auto subkey :
         {std::string_view(""), std::string_view("\0", 1), std::string_view("a"),
          std::string_view("ab"), std::string_view("b"), std::string_view("\x7f"),
          std::string_view("\x80"), std::string_view("\xff")})
        dictionary.dictionary[bytes_of(subkey)] = make_value(subkey, 7, "sig");

    check_round_trip(dht::find_response{});
    check_round_trip(dht::find_response{{dht::find_result{}}});
    std::vector<dht::store_status> every_status;
    for (int s = 0; s <= dht::max_store_status; ++s)
        every_status.push_back(static_cast<dht::store_status>(s));
    check_round_trip(dht::find_response{{}, every_status});
    check_round_trip(
        dht::find_response{{{plain, {peers[0]}}, {std::nullopt, peers}}, every_status});
    check_round_trip(dht::find_response{{{std::nullopt, peers},
                                         {empty_entry, {}},
                                         {plain, {peers[0]}},
                                         {falsy, {}},
                                         {dictionary, peers}}});

    SECTION("maximum sizes and counts") {
        dht::key_entry big;
        big.key = filled(limits.max_key_size, 1);
        big.plain = {filled(limits.max_value_size, 2), at_nanoseconds(i64_max),
                     filled(limits.max_signature_size, 3)};
        dht::key_entry big_dictionary;
        big_dictionary.key = bytes_of("k");
        big_dictionary.dictionary[filled(limits.max_subkey_size, 0xFF)] = *big.plain;
        dht::key_entry many_subkeys;
        for (std::size_t i = 0; i < limits.max_subkeys; ++i)
            many_subkeys.dictionary[bytes_of(std::to_string(i))] =
                make_value("v", static_cast<std::int64_t>(i));
        std::vector<dht::peer_info> many_peers;
        for (std::size_t i = 0; i < limits.max_peers; ++i)
            many_peers.push_back({test_peer(static_cast<int>(i)),
                                  peer_address::sim(i, static_cast<std::uint16_t>(i))});
        check_round_trip(dht::find_response{{{big, many_peers}}});
        check_round_trip(dht::find_response{{{big_dictionary, {}}, {many_subkeys, many_peers}}});

        dht::find_response many_results;
        for (std::size_t i = 0; i < limits.max_items; ++i) {
            many_results.results.push_back(
                {i % 3 == 0 ? std::optional(plain) : std::nullopt, {peers[i % peers.size()]}});
            many_results.statuses.push_back(static_cast<dht::store_status>(i % 9));
        }
        check_round_trip(many_results);
    }
}

TEST_CASE("dht messages: wrong version and wrong type", "[dht]") {
    const byte_buffer valid[] = {
        dht::encode(dht::ping_request{}),  dht::encode(dht::ping_response{}),
        dht::encode(dht::store_request{}), dht::encode(dht::store_response{}),
        dht::encode(dht::find_request{}),  dht::encode(dht::find_response{})};
    const auto decode_all = [](const byte_buffer& bytes) {
        return std::vector<std::error_code>{
            decode_as<dht::ping_request>(bytes),  decode_as<dht::ping_response>(bytes),
            decode_as<dht::store_request>(bytes), decode_as<dht::store_response>(bytes),
            decode_as<dht::find_request>(bytes),  decode_as<dht::find_response>(bytes)};
    };
    for (std::size_t type = 0; type < 6; ++type) {
        INFO("message type " << type + 1);
        const auto results = decode_all(valid[type]);
        for (std::size_t other = 0; other < 6; ++other)
            CHECK(results[other] ==
                  (other == type ? std::error_code{} : make_error_code(errc::protocol_violation)));
        for (const int version : {0, 1, 2, 4, 0xFF}) {
            byte_buffer bad = valid[type];
            bad[0] = static_cast<std::byte>(version);
            for (const auto ec : decode_all(bad))
                CHECK(ec == errc::unsupported_version);
        }
        for (const int bad_type : {0, 7, 0x81, 0xFF}) {
            byte_buffer bad = valid[type];
            bad[1] = static_cast<std::byte>(bad_type);
            for (const auto ec : decode_all(bad))
                CHECK(ec == errc::protocol_violation);
        }
    }
    // A lone version byte is judged before the missing type.
    CHECK(decode_as<dht::ping_request>(raw().u8(2).bytes) == errc::unsupported_version);
    CHECK(decode_as<dht::ping_request>(raw().u8(3).bytes) == errc::truncated_input);
    CHECK(decode_as<dht::ping_request>(byte_buffer{}) == errc::truncated_input);
}

TEST_CASE("dht messages: counts over a limit are refused before allocation", "[dht]") {
    const dht::message_limits limits;
    // A huge count in a tiny message: over the limit.
    CHECK(decode_as<dht::store_request>(raw(3, 3).u8(0).u32(u32_max).bytes) ==
          errc::length_limit_exceeded);
    CHECK(decode_as<dht::store_response>(raw(3, 4).u32(u32_max).bytes) ==
          errc::length_limit_exceeded);
    CHECK(decode_as<dht::find_request>(raw(3, 5).u8(0).u8(1).u32(1).u32(u32_max).bytes) ==
          errc::length_limit_exceeded);
    CHECK(decode_as<dht::find_request>(raw(3, 5).u8(0).u8(0).u32(1).u32(0).u32(u32_max).bytes) ==
          errc::length_limit_exceeded);
    CHECK(decode_as<dht::find_response>(raw(3, 6).u32(u32_max).bytes) ==
          errc::length_limit_exceeded);
    CHECK(decode_as<dht::find_response>(raw(3, 6).u32(1).u8(0).u32(u32_max).bytes) ==
          errc::length_limit_exceeded);
    CHECK(decode_as<dht::find_response>(raw(3, 6).u32(0).u32(u32_max).bytes) ==
          errc::length_limit_exceeded);
    CHECK(
        decode_as<dht::find_response>(raw(3, 6).u32(1).u8(1).sized("k").u8(0).u32(u32_max).bytes) ==
        errc::length_limit_exceeded);
    // Lengths of byte strings.
    CHECK(decode_as<dht::store_request>(
              raw(3, 3).u8(0).u32(1).u32(u32_max).put(filled(40, 0)).bytes) ==
          errc::length_limit_exceeded);

    // The same counts with limits that allow them: the remaining bytes refuse them, so
    // nothing was reserved (reserving 2^32 elements would abort under ASan, or fail).
    dht::message_limits unlimited;
    unlimited.max_items = unlimited.max_key_size = unlimited.max_subkey_size =
        unlimited.max_value_size = unlimited.max_signature_size = unlimited.max_subkeys =
            unlimited.max_peers = std::numeric_limits<std::size_t>::max();
    CHECK(decode_as<dht::store_request>(raw(3, 3).u8(0).u32(u32_max).bytes, unlimited) ==
          errc::truncated_input);
    CHECK(decode_as<dht::store_response>(raw(3, 4).u32(u32_max).bytes, unlimited) ==
          errc::truncated_input);
    CHECK(decode_as<dht::find_request>(raw(3, 5).u8(0).u8(1).u32(1).u32(u32_max).bytes,
                                       unlimited) == errc::truncated_input);
    CHECK(decode_as<dht::find_request>(raw(3, 5).u8(0).u8(0).u32(1).u32(0).u32(u32_max).bytes,
                                       unlimited) == errc::truncated_input);
    CHECK(decode_as<dht::find_response>(raw(3, 6).u32(0).u32(u32_max).bytes, unlimited) ==
          errc::truncated_input);
    CHECK(decode_as<dht::find_response>(raw(3, 6).u32(u32_max).bytes, unlimited) ==
          errc::truncated_input);
    CHECK(decode_as<dht::find_response>(raw(3, 6).u32(1).u8(0).u32(u32_max).bytes, unlimited) ==
          errc::truncated_input);
    CHECK(decode_as<dht::find_response>(raw(3, 6).u32(1).u8(1).sized("k").u8(0).u32(u32_max).bytes,
                                        unlimited) == errc::truncated_input);
    CHECK(
        decode_as<dht::store_request>(raw(3, 3).u8(0).u32(1).u32(u32_max).put(filled(40, 0)).bytes,
                                      unlimited) == errc::truncated_input);
    // Counts within the default limit that the input cannot hold are truncated too.
    CHECK(decode_as<dht::store_request>(
              raw(3, 3).u8(0).u32(static_cast<std::uint32_t>(limits.max_items)).bytes) ==
          errc::truncated_input);
    CHECK(decode_as<dht::find_response>(
              raw(3, 6).u32(1).u8(0).u32(static_cast<std::uint32_t>(limits.max_peers)).bytes) ==
          errc::truncated_input);
}

TEST_CASE("dht messages: each limit is enforced by decode and encode", "[dht]") {
    const dht::message_limits defaults;
    const auto refused = [](const auto& message, const dht::message_limits& tight) {
        using M = std::decay_t<decltype(message)>;
        const byte_buffer bytes = dht::encode(message); // within the defaults
        M out = sentinel<M>();
        CHECK(dht::decode(bytes, out, tight) == errc::length_limit_exceeded);
        CHECK(out == sentinel<M>());
        try {
            (void)dht::encode(message, tight);
            FAIL("encode accepted a message over the limits");
        } catch (const std::system_error& e) {
            CHECK(e.code() == errc::invalid_argument);
        }
        CHECK(dht::decode(bytes, out) == std::error_code{}); // the defaults allow it
    };
    const auto with = [&](auto change) {
        dht::message_limits l = defaults;
        change(l);
        return l;
    };

    const dht::store_request store{
        {},
        {{make_record("key", std::string_view("sub"), "value", 1, "sg"), false},
         {make_record("k", std::nullopt, "v", 1), false}}};
    const auto at_limit = [](const auto& message, const dht::message_limits& l) {
        using M = std::decay_t<decltype(message)>;
        M out;
        CHECK(dht::decode(dht::encode(message, l), out, l) == std::error_code{});
        CHECK(out == message);
    };
    // The store's items, in a store request or carried by a find.
    const auto check_items = [&](const auto& message) {
        refused(message, with([](auto& l) { l.max_items = 1; }));
        refused(message, with([](auto& l) { l.max_key_size = 2; }));
        refused(message, with([](auto& l) { l.max_subkey_size = 2; }));
        refused(message, with([](auto& l) { l.max_value_size = 4; }));
        refused(message, with([](auto& l) { l.max_signature_size = 1; }));
        at_limit(message, with([](auto& l) {
                     l.max_items = 2;
                     l.max_key_size = l.max_subkey_size = 3;
                     l.max_value_size = 5;
                     l.max_signature_size = 2;
                 }));
    };
    check_items(store);
    check_items(dht::find_request{{}, {dht::id{}}, 1, store.items, false});

    refused(dht::store_response{{dht::store_status::stored, dht::store_status::expired}},
            with([](auto& l) { l.max_items = 1; }));
    refused(dht::find_request{{}, {dht::id{}, dht::id{}}, 1},
            with([](auto& l) { l.max_items = 1; }));
    refused(dht::find_request{{}, {}, 10}, with([](auto& l) { l.max_peers = 9; }));
    at_limit(dht::find_request{{}, {}, 10}, with([](auto& l) { l.max_peers = 10; }));
    refused(dht::find_response{{}, {dht::store_status::stored, dht::store_status::expired}},
            with([](auto& l) { l.max_items = 1; }));

    dht::key_entry dictionary;
    dictionary.key = bytes_of("key");
    dictionary.dictionary[bytes_of("sub")] = make_value("value", 1, "sg");
    dictionary.dictionary[bytes_of("s2")] = make_value("v", 1);
    dht::key_entry plain;
    plain.key = bytes_of("k");
    plain.plain = make_value("value", 1, "sg");
    const std::vector<dht::peer_info> two_peers = {{test_peer(1), addresses[0]},
                                                   {test_peer(2), addresses[6]}};
    const dht::find_response found{{{dictionary, two_peers}, {plain, {}}}};
    refused(found, with([](auto& l) { l.max_items = 1; }));
    refused(found, with([](auto& l) { l.max_key_size = 2; }));
    refused(found, with([](auto& l) { l.max_subkey_size = 2; }));
    refused(found, with([](auto& l) { l.max_value_size = 4; }));
    refused(found, with([](auto& l) { l.max_signature_size = 1; }));
    refused(found, with([](auto& l) { l.max_subkeys = 1; }));
    refused(found, with([](auto& l) { l.max_peers = 1; }));
    at_limit(found, with([](auto& l) {
                 l.max_items = l.max_subkeys = l.max_peers = 2;
                 l.max_key_size = l.max_subkey_size = 3;
                 l.max_value_size = 5;
                 l.max_signature_size = 2;
             }));

    // The defaults themselves, one over each.
    dht::store_request over{{}, {{make_record("", std::nullopt, "", 0), false}}};
    over.items[0].item.value = filled(defaults.max_value_size + 1, 0);
    CHECK_THROWS_AS(dht::encode(over), std::system_error);
    over.items[0].item.value.clear();
    over.items[0].item.key = filled(defaults.max_key_size + 1, 0);
    CHECK_THROWS_AS(dht::encode(over), std::system_error);
    over.items[0].item.key.clear();
    over.items[0].item.subkey = filled(defaults.max_subkey_size + 1, 0);
    CHECK_THROWS_AS(dht::encode(over), std::system_error);
    over.items[0].item.subkey.reset();
    over.items[0].item.signature = filled(defaults.max_signature_size + 1, 0);
    CHECK_THROWS_AS(dht::encode(over), std::system_error);
    over.items[0].item.signature.clear();
    CHECK_NOTHROW(dht::encode(over));
    over.items.resize(defaults.max_items + 1);
    CHECK_THROWS_AS(dht::encode(over), std::system_error);
    CHECK_THROWS_AS(
        dht::encode(dht::find_request{{}, {}, static_cast<std::uint32_t>(defaults.max_peers + 1)}),
        std::system_error);
}

TEST_CASE("dht messages: dictionaries must be sorted, unique, and alone", "[dht]") {
    // find_response with one result holding an entry for key "k" with the given subkeys.
    const auto dictionary = [](std::initializer_list<std::string_view> subkeys, int has_plain = 0) {
        raw m(3, 6);
        m.u32(1).u8(1).sized("k").u8(has_plain);
        if (has_plain) m.value("p");
        m.u32(static_cast<std::uint32_t>(subkeys.size()));
        for (const auto s : subkeys)
            m.sized(s).value("v");
        m.u32(0).u32(0); // no peers, no statuses
        return m.bytes;
    };
    CHECK(decode_as<dht::find_response>(dictionary({"a", "b"})) == std::error_code{});
    CHECK(decode_as<dht::find_response>(dictionary({"", "a", "aa", "b", "\x80"})) ==
          std::error_code{});
    CHECK(decode_as<dht::find_response>(dictionary({"b", "a"})) == errc::corrupt_data);
    CHECK(decode_as<dht::find_response>(dictionary({"a", "a"})) == errc::corrupt_data);
    CHECK(decode_as<dht::find_response>(dictionary({"", ""})) == errc::corrupt_data);
    CHECK(decode_as<dht::find_response>(dictionary({"ab", "a"})) == errc::corrupt_data);
    CHECK(decode_as<dht::find_response>(dictionary({"a", "b", "c", "b"})) == errc::corrupt_data);
    // Unsigned order: 0x80 sorts after 0x7f.
    CHECK(decode_as<dht::find_response>(dictionary({"\x80", "\x7f"})) == errc::corrupt_data);
    CHECK(decode_as<dht::find_response>(dictionary({"\x7f", "\x80"})) == std::error_code{});

    CHECK(decode_as<dht::find_response>(dictionary({}, 1)) == std::error_code{});
    CHECK(decode_as<dht::find_response>(dictionary({"a"}, 1)) == errc::corrupt_data);

    dht::key_entry both;
    both.plain = make_value("p", 1);
    both.dictionary[bytes_of("a")] = make_value("v", 1);
    CHECK_THROWS_AS(dht::encode(dht::find_response{{{both, {}}}}), std::system_error);
}

TEST_CASE("dht messages: flag bytes must be 0 or 1", "[dht]") {
    for (const int flag : {0, 1, 2, 0x80, 0xFF}) {
        INFO("flag " << flag);
        const std::error_code expected =
            flag <= 1 ? std::error_code{} : make_error_code(errc::corrupt_data);
        // sender has_listen
        {
            raw m(3, 1);
            m.u8(flag);
            if (flag == 1) m.address(0, "10.0.0.1");
            CHECK(decode_as<dht::ping_request>(m.bytes) == expected);
        }
        // store_item has_subkey and in_cache
        {
            raw m(3, 3);
            m.u8(0).u32(1).sized("k").u8(flag);
            if (flag == 1) m.sized("s");
            m.sized("v").i64(1).sized("").u8(0);
            CHECK(decode_as<dht::store_request>(m.bytes) == expected);
            CHECK(decode_as<dht::store_request>(
                      raw(3, 3).u8(0).u32(1).sized("k").u8(0).value("v").u8(flag).bytes) ==
                  expected);
        }
        // find_request want_values
        CHECK(decode_as<dht::find_request>(raw(3, 5).u8(0).u8(flag).u32(1).u32(0).u32(0).bytes) ==
              expected);
        // find_result has_entry, key_entry has_plain
        {
            raw m(3, 6);
            m.u32(1).u8(flag);
            if (flag == 1) m.sized("k").u8(0).u32(0);
            m.u32(0).u32(0);
            CHECK(decode_as<dht::find_response>(m.bytes) == expected);
            raw n(3, 6);
            n.u32(1).u8(1).sized("k").u8(flag);
            if (flag == 1) n.value("v");
            n.u32(0).u32(0).u32(0);
            CHECK(decode_as<dht::find_response>(n.bytes) == expected);
        }
        // peer_info has_key
        {
            raw m(3, 6);
            m.u32(1).u8(0).u32(1).u8(flag).put(hivemesh::test::identity_of(4).public_key().view());
            m.address(0, "10.0.0.1").u32(0);
            CHECK(decode_as<dht::find_response>(m.bytes) == expected);
        }
    }
}

TEST_CASE("dht messages: status bytes above max_store_status are refused", "[dht]") {
    for (int s = 0; s < 256; ++s) {
        INFO("status " << s);
        CHECK(
            decode_as<dht::store_response>(raw(3, 4).u32(2).u8(0).u8(s).bytes) ==
            (s <= dht::max_store_status ? std::error_code{} : make_error_code(errc::corrupt_data)));
    }
    for (int s = 0; s < 256; ++s) {
        INFO("find status " << s);
        CHECK(
            decode_as<dht::find_response>(raw(3, 6).u32(0).u32(2).u8(0).u8(s).bytes) ==
            (s <= dht::max_store_status ? std::error_code{} : make_error_code(errc::corrupt_data)));
    }
    CHECK_THROWS_AS(dht::encode(dht::store_response{
                        {static_cast<dht::store_status>(dht::max_store_status + 1)}}),
                    std::system_error);
    CHECK_THROWS_AS(dht::encode(dht::find_response{
                        {}, {static_cast<dht::store_status>(dht::max_store_status + 1)}}),
                    std::system_error);
}

TEST_CASE("dht messages: addresses are validated and canonical on the wire", "[dht]") {
    const auto ping = [](int proto, std::string_view host, int has_peer = 0) {
        raw m(3, 1);
        m.u8(1).address(proto, host, 80, has_peer);
        if (has_peer == 1) m.put(test_peer(3).view());
        return decode_as<dht::ping_request>(m.bytes);
    };
    const auto peer = [](int proto, std::string_view host, int has_peer = 0) {
        raw m(3, 6);
        m.u32(1).u8(0).u32(1).u8(0).put(test_peer(4).view()).address(proto, host, 80, has_peer);
        if (has_peer == 1) m.put(test_peer(3).view());
        m.u32(0); // no statuses
        return decode_as<dht::find_response>(m.bytes);
    };
    const auto check_addresses = [](const auto& try_decode) {
        CHECK(try_decode(0, "10.1.2.3") == std::error_code{});
        CHECK(try_decode(1, "2001:db8::1") == std::error_code{});
        CHECK(try_decode(2, "example.org") == std::error_code{});
        CHECK(try_decode(3, "12") == std::error_code{});
        // peer_address::read accepts these spellings, but they are not the canonical ones.
        CHECK(try_decode(2, "Example.ORG") == errc::corrupt_data);
        CHECK(try_decode(1, "2001:DB8::1") == errc::corrupt_data);
        CHECK(try_decode(1, "2001:db8:0:0:0:0:0:1") == errc::corrupt_data);
        CHECK(try_decode(1, "::ffff:7f00:1") == errc::corrupt_data); // canonical: ::ffff:127.0.0.1
        // Invalid hosts and protocols.
        CHECK(try_decode(0, "256.1.1.1") == errc::corrupt_data);
        CHECK(try_decode(0, "") != std::error_code{}); // corrupt, or too short for a peer
        CHECK(try_decode(3, "012") == errc::corrupt_data);
        CHECK(try_decode(4, "10.1.2.3") == errc::corrupt_data);
        // The PeerId never travels inside the address.
        CHECK(try_decode(0, "10.1.2.3", 1) == errc::corrupt_data);
        CHECK(try_decode(0, "10.1.2.3", 2) == errc::corrupt_data);
    };
    check_addresses(ping);
    check_addresses(peer);

    // Encoders refuse what decoders would.
    CHECK_THROWS_AS(dht::encode(dht::ping_request{{addresses[0].with_peer(test_peer(1))}}),
                    std::system_error);
    CHECK_THROWS_AS(dht::encode(dht::find_response{
                        {{std::nullopt, {{test_peer(1), addresses[0].with_peer(test_peer(1))}}}}}),
                    std::system_error);
    peer_address bad = addresses[0];
    bad.host = "256.0.0.1";
    CHECK_THROWS_AS(dht::encode(dht::ping_request{{bad}}), std::system_error);
    CHECK_THROWS_AS(dht::encode(dht::find_request{{bad}, {}, 1}), std::system_error);
    CHECK_THROWS_AS(dht::encode(dht::store_request{{bad}, {}}), std::system_error);
}

TEST_CASE("dht messages: what decodes re-encodes to the same bytes under mutation", "[dht]") {
    // A small deterministic fuzz: mutate valid messages; anything still accepted must be
    // canonical, and nothing may crash.
    hivemesh::random_generator rng(20240607);
    dht::key_entry dictionary;
    dictionary.key = bytes_of("key");
    dictionary.dictionary[bytes_of("a")] = make_value("1", 1, "s");
    dictionary.dictionary[bytes_of("b")] = make_value("", -5);
    dht::key_entry plain;
    plain.plain = make_value("value", 9);
    const std::vector<byte_buffer> seeds = {
        dht::encode(dht::ping_request{{addresses[3]}}),
        dht::encode(dht::ping_response{}),
        dht::encode(
            dht::store_request{{addresses[4]},
                               {{make_record("k", std::string_view("s"), "v", 3, "sig"), true},
                                {make_record("", std::nullopt, "", 0), false}}}),
        dht::encode(dht::store_response{{dht::store_status::stored, dht::store_status::invalid}}),
        dht::encode(dht::find_request{{addresses[6]}, {dht::id::of_key("x")}, 20}),
        dht::encode(
            dht::find_request{{addresses[0]},
                              {dht::id::of_key("x"), dht::id::of_key("y")},
                              5,
                              {{make_record("x", std::string_view("s"), "v", 3, "g"), false}},
                              false}),
        dht::encode(dht::find_response{
            {{dictionary, {{test_peer(1), addresses[1]}}}, {plain, {}}, {std::nullopt, {}}}}),
        dht::encode(dht::find_response{{{std::nullopt, {{test_peer(2), addresses[6]}}}},
                                       {dht::store_status::stored, dht::store_status::invalid}}),
    };
    std::size_t accepted = 0, non_canonical = 0;
    const auto check = [&](const byte_buffer& bytes) {
        const auto one = [&](auto message) {
            if (dht::decode(bytes, message)) return;
            ++accepted;
            if (dht::encode(message) != bytes) ++non_canonical;
        };
        one(dht::ping_request{});
        one(dht::ping_response{});
        one(dht::store_request{});
        one(dht::store_response{});
        one(dht::find_request{});
        one(dht::find_response{});
    };
    for (int round = 0; round < 20000; ++round) {
        byte_buffer bytes = seeds[rng.uniform(seeds.size())];
        const auto mutations = 1 + rng.uniform(3);
        for (std::uint64_t m = 0; m < mutations; ++m) {
            const auto where = rng.uniform(bytes.size() + 1);
            switch (rng.uniform(4)) {
            case 0:
                if (where < bytes.size()) bytes[where] = static_cast<std::byte>(rng());
                break;
            case 1:
                if (where < bytes.size())
                    bytes[where] ^= static_cast<std::byte>(1u << rng.uniform(8));
                break;
            case 2:
                bytes.insert(bytes.begin() + static_cast<std::ptrdiff_t>(where),
                             static_cast<std::byte>(rng()));
                break;
            default:
                if (where < bytes.size())
                    bytes.erase(bytes.begin() + static_cast<std::ptrdiff_t>(where));
            }
        }
        check(bytes);
    }
    CHECK(accepted > 100); // the mutations do reach valid messages (e.g. flipped payload bytes)
    CHECK(non_canonical == 0);
}
