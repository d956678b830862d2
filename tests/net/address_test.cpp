#include <hivemesh/core/binary.hpp>
#include <hivemesh/core/random.hpp>
#include <hivemesh/net/address.hpp>

#include <asio/ip/address_v4.hpp>
#include <catch2/catch.hpp>

#include "support/bytes.hpp"

#include <compare>
#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_set>
#include <vector>

using hivemesh::binary_reader;
using hivemesh::binary_writer;
using hivemesh::byte_buffer;
using hivemesh::errc;
using hivemesh::crypto::peer_id;
using hivemesh::net::peer_address;
using protocol = hivemesh::net::peer_address::protocol;
namespace reason = hivemesh::net::detail;

namespace {

using hivemesh::test::bytes_of;

peer_id test_peer(std::uint8_t fill = 7) {
    return peer_id::from_public_key(byte_buffer(32, std::byte{fill}));
}

byte_buffer encode(const peer_address& a) {
    byte_buffer out;
    binary_writer w(out);
    a.write(w);
    return out;
}

/// Decodes one address that must span the whole buffer; returns the reader's error.
std::error_code decode(const byte_buffer& bytes, peer_address& out) {
    binary_reader r(bytes);
    out = peer_address::read(r);
    return r.finish();
}

void append_text(byte_buffer& out, std::string_view text) {
    for (const char c : text)
        out.push_back(static_cast<std::byte>(c));
}

// Canonical text forms, one or more per protocol, at the edges of what is allowed.
const std::vector<std::string> canonical_addresses = {
    "/ip4/127.0.0.1/tcp/4242",
    "/ip4/0.0.0.0/tcp/0",
    "/ip4/255.255.255.255/tcp/65535",
    "/ip6/::1/tcp/4242",
    "/ip6/::/tcp/0",
    "/ip6/2001:db8::1:0:0:1/tcp/443",
    "/ip6/::ffff:127.0.0.1/tcp/80",
    "/ip6/fe80::1/tcp/9",
    "/dns/localhost/tcp/4242",
    "/dns/peer-7.swarm.example.org/tcp/31337",
    "/dns/x/tcp/1",
    "/dns/" + std::string(63, 'a') + ".com/tcp/1",
    // 253 characters: 63 + 1 + 63 + 1 + 63 + 1 + 61.
    "/dns/" + std::string(63, 'a') + "." + std::string(63, 'b') + "." + std::string(63, 'c') + "." +
        std::string(61, 'd') + "/tcp/2",
    "/dns/3com.example/tcp/1",
    "/sim/0/port/0",
    "/sim/42/port/7",
    "/sim/18446744073709551615/port/65535",
};

} // namespace

TEST_CASE("addresses print and parse back to themselves, with and without a PeerId",
          "[net][address]") {
    const std::string id = test_peer().to_string();
    for (const auto& base : canonical_addresses) {
        for (const std::string& text : {base, base + "/p2p/" + id}) {
            INFO(text);
            std::string_view why = "not set";
            const auto parsed = peer_address::parse(text, &why);
            REQUIRE(parsed);
            CHECK(why.empty());
            CHECK(parsed->to_string() == text);
            CHECK(peer_address::from_string(text) == *parsed);
            CHECK(parsed->is_valid());
            CHECK(parsed->peer.has_value() == (text != base));
            CHECK(peer_address::parse(parsed->to_string()) == parsed);
        }
    }
}

TEST_CASE("parsing fills every field", "[net][address]") {
    const peer_id id = test_peer(1);
    const auto a = peer_address::from_string("/ip4/127.0.0.1/tcp/4242/p2p/" + id.to_string());
    CHECK(a.proto == protocol::ip4);
    CHECK(a.host == "127.0.0.1");
    CHECK(a.port == 4242);
    REQUIRE(a.peer);
    CHECK(*a.peer == id);

    const auto s = peer_address::from_string("/sim/12/port/65535");
    CHECK(s.proto == protocol::sim);
    CHECK(s.host == "12");
    CHECK(s.port == 65535);
    CHECK_FALSE(s.peer);
    CHECK(s.sim_node() == std::optional<std::uint64_t>(12));
    CHECK(peer_address::sim(12, 65535) == s);
    CHECK(peer_address::sim(18446744073709551615ULL, 1).to_string() ==
          "/sim/18446744073709551615/port/1");
    CHECK_FALSE(a.sim_node());

    const auto d = peer_address::from_string("/dns/localhost/tcp/80");
    CHECK(d.proto == protocol::dns);
    CHECK(d.host == "localhost");
    const auto v6 = peer_address::from_string("/ip6/::1/tcp/80");
    CHECK(v6.proto == protocol::ip6);
    CHECK(v6.host == "::1");
}

TEST_CASE("IPv6 and DNS hosts are stored in canonical form", "[net][address]") {
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"/ip6/0:0:0:0:0:0:0:1/tcp/1", "/ip6/::1/tcp/1"},
        {"/ip6/0000:0000:0000:0000:0000:0000:0000:0001/tcp/1", "/ip6/::1/tcp/1"},
        {"/ip6/2001:DB8:0:0:1:0:0:1/tcp/1", "/ip6/2001:db8::1:0:0:1/tcp/1"},
        {"/ip6/2001:db8:0:0:0:0:2:1/tcp/1", "/ip6/2001:db8::2:1/tcp/1"},
        // RFC 5952: a single zero group is not compressed.
        {"/ip6/2001:db8:0:1:1:1:1:1/tcp/1", "/ip6/2001:db8:0:1:1:1:1:1/tcp/1"},
        {"/ip6/fe80:0000::0001/tcp/1", "/ip6/fe80::1/tcp/1"},
        {"/ip6/::FFFF:7F00:1/tcp/1", "/ip6/::ffff:127.0.0.1/tcp/1"},
        {"/ip6/0::0/tcp/1", "/ip6/::/tcp/1"},
        {"/dns/LocalHost/tcp/1", "/dns/localhost/tcp/1"},
        {"/dns/Peer-7.EXAMPLE.org/tcp/1", "/dns/peer-7.example.org/tcp/1"},
    };
    for (const auto& [input, canonical] : cases) {
        INFO(input);
        const auto parsed = peer_address::parse(input);
        REQUIRE(parsed);
        CHECK(parsed->to_string() == canonical);
        CHECK(*parsed == peer_address::from_string(canonical));
        CHECK(std::hash<peer_address>{}(*parsed) ==
              std::hash<peer_address>{}(peer_address::from_string(canonical)));
    }
}

TEST_CASE("malformed addresses are refused with the reason", "[net][address]") {
    const std::string id = test_peer().to_string();
    const std::string label64(64, 'a');
    const std::string name254 = std::string(63, 'a') + "." + std::string(63, 'b') + "." +
                                std::string(63, 'c') + "." + std::string(62, 'd');
    REQUIRE(name254.size() == 254);

    const std::vector<std::pair<std::string, std::string_view>> cases = {
        // shape
        {"", reason::reason_empty},
        {"/", reason::reason_empty_component},
        {"//", reason::reason_empty_component},
        {"ip4/127.0.0.1/tcp/1", reason::reason_no_leading_slash},
        {"//ip4/127.0.0.1/tcp/1", reason::reason_empty_component},
        {"/ip4/127.0.0.1/tcp/1/", reason::reason_empty_component},
        {"/ip4/127.0.0.1/tcp/1//", reason::reason_empty_component},
        {"/ip4//tcp/1", reason::reason_empty_component},
        {"/ip4/127.0.0.1//1", reason::reason_empty_component},
        {"/ip4", reason::reason_missing_components},
        {"/ip4/127.0.0.1", reason::reason_missing_components},
        {"/ip4/127.0.0.1/tcp", reason::reason_missing_components},
        {"/sim/1/port", reason::reason_missing_components},
        // protocol and transport keywords (case-sensitive, as in multiaddr)
        {"/ip5/127.0.0.1/tcp/1", reason::reason_unknown_protocol},
        {"/IP4/127.0.0.1/tcp/1", reason::reason_unknown_protocol},
        {"/dns4/localhost/tcp/1", reason::reason_unknown_protocol},
        {"/unix/tmp/socket", reason::reason_unknown_protocol},
        {"/p2p/" + id, reason::reason_unknown_protocol},
        {"/ip4/127.0.0.1/udp/1", reason::reason_expected_tcp},
        {"/ip4/127.0.0.1/TCP/1", reason::reason_expected_tcp},
        {"/ip4/127.0.0.1/port/1", reason::reason_expected_tcp},
        {"/sim/1/tcp/1", reason::reason_expected_port_keyword},
        // ports
        {"/ip4/127.0.0.1/tcp/65536", reason::reason_bad_port},
        {"/ip4/127.0.0.1/tcp/-1", reason::reason_bad_port},
        {"/ip4/127.0.0.1/tcp/+1", reason::reason_bad_port},
        {"/ip4/127.0.0.1/tcp/01", reason::reason_bad_port},
        {"/ip4/127.0.0.1/tcp/00", reason::reason_bad_port},
        {"/ip4/127.0.0.1/tcp/0x10", reason::reason_bad_port},
        {"/ip4/127.0.0.1/tcp/1x", reason::reason_bad_port},
        {"/ip4/127.0.0.1/tcp/1e3", reason::reason_bad_port},
        {"/ip4/127.0.0.1/tcp/18446744073709551617", reason::reason_bad_port},
        {"/ip4/127.0.0.1/tcp/99999999999999999999999999", reason::reason_bad_port},
        {"/sim/1/port/65536", reason::reason_bad_port},
        // ip4
        {"/ip4/256.0.0.1/tcp/1", reason::reason_bad_ip4},
        {"/ip4/127.0.0/tcp/1", reason::reason_bad_ip4},
        {"/ip4/127.1/tcp/1", reason::reason_bad_ip4},
        {"/ip4/127.0.0.01/tcp/1", reason::reason_bad_ip4},
        {"/ip4/127.0.0.1.5/tcp/1", reason::reason_bad_ip4},
        {"/ip4/127..0.1/tcp/1", reason::reason_bad_ip4},
        {"/ip4/0x7f.0.0.1/tcp/1", reason::reason_bad_ip4},
        {"/ip4/-1.0.0.1/tcp/1", reason::reason_bad_ip4},
        {"/ip4/2130706433/tcp/1", reason::reason_bad_ip4},
        {"/ip4/::1/tcp/1", reason::reason_bad_ip4},
        {"/ip4/localhost/tcp/1", reason::reason_bad_ip4},
        {"/ip4/1111111111111111111111.0.0.1/tcp/1", reason::reason_bad_ip4},
        {"/ip4/00.0.0.1/tcp/1", reason::reason_bad_ip4},
        {"/ip4/1.2.3.4./tcp/1", reason::reason_bad_ip4},
        {"/ip4/.1.2.3.4/tcp/1", reason::reason_bad_ip4},
        {"/ip4/1.2.3.999/tcp/1", reason::reason_bad_ip4},
        {"/ip4/1.2.3.1000/tcp/1", reason::reason_bad_ip4},
        {"/ip4/1.2.3.4x/tcp/1", reason::reason_bad_ip4},
        // ip6
        {"/ip6/127.0.0.1/tcp/1", reason::reason_bad_ip6},
        {"/ip6/:::1/tcp/1", reason::reason_bad_ip6},
        {"/ip6/1::2::3/tcp/1", reason::reason_bad_ip6},
        {"/ip6/12345::1/tcp/1", reason::reason_bad_ip6},
        {"/ip6/g::1/tcp/1", reason::reason_bad_ip6},
        {"/ip6/1:2:3:4:5:6:7:8:9/tcp/1", reason::reason_bad_ip6},
        {"/ip6/fe80::1%eth0/tcp/1", reason::reason_bad_ip6},
        {"/ip6/fe80::1%1/tcp/1", reason::reason_bad_ip6},
        {"/ip6/[::1]/tcp/1", reason::reason_bad_ip6},
        {"/ip6/" + std::string(60, '0') + "::1/tcp/1", reason::reason_bad_ip6},
        // dns
        {"/dns/-leading.example/tcp/1", reason::reason_bad_dns},
        {"/dns/trailing-.example/tcp/1", reason::reason_bad_dns},
        {"/dns/a..b/tcp/1", reason::reason_bad_dns},
        {"/dns/.a/tcp/1", reason::reason_bad_dns},
        {"/dns/a./tcp/1", reason::reason_bad_dns},
        {"/dns/under_score.example/tcp/1", reason::reason_bad_dns},
        {"/dns/" + label64 + ".com/tcp/1", reason::reason_bad_dns},
        {"/dns/" + name254 + "/tcp/1", reason::reason_bad_dns},
        {"/dns/1.2.3.4/tcp/1", reason::reason_numeric_dns},
        {"/dns/example.123/tcp/1", reason::reason_numeric_dns},
        {"/dns/b\xC3\xBC"
         "cher.example/tcp/1",
         reason::reason_bad_character},
        // sim
        {"/sim/-1/port/1", reason::reason_bad_sim_node},
        {"/sim/+1/port/1", reason::reason_bad_sim_node},
        {"/sim/01/port/1", reason::reason_bad_sim_node},
        {"/sim/18446744073709551616/port/1", reason::reason_bad_sim_node},
        {"/sim/node1/port/1", reason::reason_bad_sim_node},
        // PeerId and what follows the port
        {"/ip4/127.0.0.1/tcp/1/p2p", reason::reason_missing_peer},
        {"/ip4/127.0.0.1/tcp/1/p2p/", reason::reason_empty_component},
        {"/ip4/127.0.0.1/tcp/1/p2p/notAPeerId0OIl", reason::reason_bad_peer},
        {"/ip4/127.0.0.1/tcp/1/p2p/" + id.substr(0, id.size() - 10), reason::reason_bad_peer},
        {"/ip4/127.0.0.1/tcp/1/p2p/0" + id.substr(1), reason::reason_bad_peer},
        {"/ip4/127.0.0.1/tcp/1/p2p/1" + id, reason::reason_bad_peer},
        {"/ip4/127.0.0.1/tcp/1/ipfs/" + id, reason::reason_expected_p2p},
        {"/ip4/127.0.0.1/tcp/1/tcp/2", reason::reason_expected_p2p},
        {"/ip4/127.0.0.1/tcp/1/p2p/" + id + "/extra", reason::reason_trailing},
        {"/ip4/127.0.0.1/tcp/1/p2p/" + id + "/p2p/" + id, reason::reason_trailing},
        {"/ip4/127.0.0.1/tcp/1/p2p/" + id + "/a/b/c/d/e", reason::reason_trailing},
        // characters and length
        {std::string("/ip4/127.0.0.1\0/tcp/1", 21), reason::reason_bad_character},
        {std::string("/dns/local\0host/tcp/1", 21), reason::reason_bad_character},
        {"/ip4/127.0.0.1/tcp/1\n", reason::reason_bad_character},
        {" /ip4/127.0.0.1/tcp/1", reason::reason_bad_character},
        {"/ip4/127.0.0.1 /tcp/1", reason::reason_bad_character},
        {"/ip4/127.0.0.1/tcp/\x7F", reason::reason_bad_character},
        {"/ip4/127.0.0.1/tcp/1/p2p/" + std::string(600, 'z'), reason::reason_too_long},
        {"/" + std::string(1'000'000, '/'), reason::reason_too_long},
    };
    for (const auto& [text, expected_reason] : cases) {
        INFO(text);
        std::string_view why;
        CHECK_FALSE(peer_address::parse(text, &why));
        CHECK(why == expected_reason);
        try {
            (void)peer_address::from_string(text);
            FAIL("from_string accepted a malformed address");
        } catch (const std::system_error& e) {
            CHECK(e.code() == errc::invalid_argument);
            CHECK(std::string(e.what()).find(expected_reason) != std::string::npos);
        }
    }
}

TEST_CASE("the binary form has the documented layout", "[net][address]") {
    const auto a = peer_address::from_string("/ip4/127.0.0.1/tcp/4242");
    byte_buffer expected = bytes_of({0x00, 9});
    append_text(expected, "127.0.0.1");
    for (const int b : {0x92, 0x10, 0x00})
        expected.push_back(static_cast<std::byte>(b));
    CHECK(encode(a) == expected);

    const peer_id id = test_peer(3);
    byte_buffer with_peer = bytes_of({0x03, 2});
    append_text(with_peer, "17");
    for (const int b : {0x07, 0x00, 0x01})
        with_peer.push_back(static_cast<std::byte>(b));
    with_peer.insert(with_peer.end(), id.bytes().begin(), id.bytes().end());
    CHECK(encode(peer_address::sim(17, 7, id)) == with_peer);

    byte_buffer dns = bytes_of({0x02, 9});
    append_text(dns, "localhost");
    for (const int b : {0x50, 0x00, 0x00})
        dns.push_back(static_cast<std::byte>(b));
    CHECK(encode(peer_address::from_string("/dns/localhost/tcp/80")) == dns);
}

TEST_CASE("the binary form round-trips and refuses every truncation", "[net][address]") {
    const peer_id id = test_peer(9);
    for (const auto& text : canonical_addresses) {
        for (const auto& original :
             {peer_address::from_string(text), peer_address::from_string(text).with_peer(id)}) {
            INFO(original.to_string());
            const byte_buffer bytes = encode(original);
            CHECK(bytes.size() <= peer_address::max_encoded_size);
            peer_address decoded;
            REQUIRE_FALSE(decode(bytes, decoded));
            CHECK(decoded == original);

            for (std::size_t n = 0; n < bytes.size(); ++n) {
                const byte_buffer prefix(bytes.begin(), bytes.begin() + static_cast<long>(n));
                binary_reader r(prefix);
                const peer_address partial = peer_address::read(r);
                CHECK(r.error() == errc::truncated_input);
                CHECK(partial == peer_address{});
            }
            byte_buffer longer = bytes;
            longer.push_back(std::byte{0});
            CHECK(decode(longer, decoded) == errc::trailing_data);
        }
    }
}

TEST_CASE("the binary form is validated like the text form", "[net][address]") {
    peer_address out;
    const auto make = [](int proto, std::string_view host, std::initializer_list<int> tail) {
        byte_buffer b = bytes_of({proto, static_cast<int>(host.size())});
        append_text(b, host);
        for (const int v : tail)
            b.push_back(static_cast<std::byte>(v));
        return b;
    };
    CHECK(decode(make(4, "127.0.0.1", {1, 0, 0}), out) == errc::corrupt_data);    // protocol
    CHECK(decode(make(0xFF, "127.0.0.1", {1, 0, 0}), out) == errc::corrupt_data); // protocol
    CHECK(decode(make(0, "127.0.0.1", {1, 0, 2}), out) == errc::corrupt_data);    // has_peer
    CHECK(decode(make(0, "", {1, 0, 0}), out) == errc::corrupt_data);             // empty host
    CHECK(decode(make(0, "127.0.0", {1, 0, 0}), out) == errc::corrupt_data);
    CHECK(decode(make(0, std::string_view("127.0.0.1\0", 10), {1, 0, 0}), out) ==
          errc::corrupt_data);
    CHECK(decode(make(1, "fe80::1%1", {1, 0, 0}), out) == errc::corrupt_data);
    CHECK(decode(make(2, "a..b", {1, 0, 0}), out) == errc::corrupt_data);
    CHECK(decode(make(2, "1.2.3.4", {1, 0, 0}), out) == errc::corrupt_data);
    CHECK(decode(make(3, "01", {1, 0, 0}), out) == errc::corrupt_data);
    CHECK(decode(make(3, "-1", {1, 0, 0}), out) == errc::corrupt_data);

    // A host length over 253 is refused before the host is looked at.
    byte_buffer long_host = bytes_of({2, 254});
    append_text(long_host, std::string(254, 'a'));
    append_text(long_host, std::string(3, '\0'));
    CHECK(decode(long_host, out) == errc::length_limit_exceeded);

    // Non-canonical spellings are accepted and stored canonically.
    REQUIRE_FALSE(decode(make(2, "LocalHost", {0x50, 0, 0}), out));
    CHECK(out.to_string() == "/dns/localhost/tcp/80");
    REQUIRE_FALSE(decode(make(1, "0:0:0:0:0:0:0:1", {0x50, 0, 0}), out));
    CHECK(out.to_string() == "/ip6/::1/tcp/80");

    // Two addresses back to back: read() consumes exactly one.
    byte_buffer two = encode(peer_address::from_string("/sim/1/port/2"));
    const byte_buffer second = encode(peer_address::from_string("/ip6/::1/tcp/3"));
    two.insert(two.end(), second.begin(), second.end());
    binary_reader r(two);
    CHECK(peer_address::read(r).to_string() == "/sim/1/port/2");
    CHECK(peer_address::read(r).to_string() == "/ip6/::1/tcp/3");
    CHECK_FALSE(r.finish());
}

TEST_CASE("writing an invalid address throws instead of emitting bytes", "[net][address]") {
    const std::vector<peer_address> invalid = {
        {protocol::ip4, "not-an-ip", 1, std::nullopt},
        {protocol::ip4, "", 1, std::nullopt},
        {protocol::ip6, "::1%1", 1, std::nullopt},
        {protocol::dns, std::string(300, 'a'), 1, std::nullopt},
        {protocol::sim, "x", 1, std::nullopt},
        {static_cast<protocol>(9), "127.0.0.1", 1, std::nullopt},
    };
    for (const auto& a : invalid) {
        INFO(a.to_string());
        CHECK_FALSE(a.is_valid());
        byte_buffer out;
        binary_writer w(out);
        try {
            a.write(w);
            FAIL("write accepted an invalid address");
        } catch (const std::system_error& e) {
            CHECK(e.code() == errc::invalid_argument);
        }
        CHECK(out.empty());
    }
}

TEST_CASE("random bytes and random text never crash the decoders", "[net][address]") {
    hivemesh::random_generator rng(0xADD2E55);
    const peer_id id = test_peer(5);
    std::vector<byte_buffer> valid;
    for (const auto& text : canonical_addresses) {
        valid.push_back(encode(peer_address::from_string(text)));
        valid.push_back(encode(peer_address::from_string(text).with_peer(id)));
    }

    std::size_t accepted = 0;
    const auto check_decoded = [&](const byte_buffer& bytes) {
        binary_reader r(bytes);
        const peer_address a = peer_address::read(r);
        if (!r.ok()) return;
        ++accepted;
        // Whatever is accepted is valid and survives another round trip unchanged.
        CHECK(a.is_valid());
        peer_address again;
        CHECK_FALSE(decode(encode(a), again));
        CHECK(again == a);
        CHECK(peer_address::parse(a.to_string()) == a);
    };

    for (int i = 0; i < 20000; ++i) {
        byte_buffer bytes(rng.uniform(300));
        for (auto& b : bytes)
            b = static_cast<std::byte>(rng.uniform(256));
        if (!bytes.empty()) bytes[0] = static_cast<std::byte>(rng.uniform(5)); // reach the host
        if (bytes.size() > 1) bytes[1] = static_cast<std::byte>(rng.uniform(20));
        check_decoded(bytes);

        byte_buffer mutated = valid[rng.uniform(valid.size())];
        const auto flips = 1 + rng.uniform(3);
        for (std::uint64_t f = 0; f < flips; ++f)
            mutated[rng.uniform(mutated.size())] = static_cast<std::byte>(rng.uniform(256));
        check_decoded(mutated);
    }
    CHECK(accepted > 0); // the mutations do reach the success path

    using namespace std::string_view_literals;
    const std::string_view alphabet = "/ip46dnsimtcport2p:.0123456789abcdefxyz-_%[]+ \0\xFF"sv;
    std::size_t parsed = 0;
    for (int i = 0; i < 20000; ++i) {
        std::string text;
        if (i % 2 == 0) {
            text.resize(rng.uniform(48));
            for (auto& c : text)
                c = alphabet[rng.uniform(alphabet.size())];
        } else {
            // Splice random components into a valid address.
            text = canonical_addresses[rng.uniform(canonical_addresses.size())];
            const auto at = rng.uniform(text.size());
            text.insert(at, 1, alphabet[rng.uniform(alphabet.size())]);
        }
        const auto a = peer_address::parse(text);
        if (!a) continue;
        ++parsed;
        CHECK(a->is_valid());
        CHECK(peer_address::parse(a->to_string()) == a);
    }
    CHECK(parsed > 0);
}

TEST_CASE("IPv4 hosts are accepted exactly when inet_pton takes them, as they are written",
          "[net][address]") {
    // Oracle: Asio's make_address_v4 (inet_pton) and to_string (inet_ntop).
    hivemesh::random_generator rng(0x1B4);
    const std::string_view alphabet = "0123456789.";
    std::size_t accepted = 0;
    for (int i = 0; i < 50000; ++i) {
        std::string host;
        if (i % 2 == 0) {
            host.resize(rng.uniform(18));
            for (auto& c : host)
                c = alphabet[rng.uniform(i % 4 == 0 ? alphabet.size() : 10)];
        } else { // four parts of 0 to 3 digits: mostly near-valid quads
            for (int part = 0; part < 4; ++part) {
                if (part > 0) host += '.';
                for (auto digits = rng.uniform(4); digits > 0; --digits)
                    host += alphabet[rng.uniform(10)];
            }
        }
        std::error_code ec;
        const auto oracle = asio::ip::make_address_v4(host.c_str(), ec);
        const auto parsed = peer_address::parse("/ip4/" + host + "/tcp/1");
        CAPTURE(host);
        REQUIRE(parsed.has_value() == !ec);
        if (!parsed) continue;
        ++accepted;
        CHECK(parsed->host == oracle.to_string());
        CHECK(parsed->host == host);
    }
    CHECK(accepted > 1000);
}

TEST_CASE("with_peer, equality, hashing and printing", "[net][address]") {
    const peer_id id = test_peer(2);
    const auto plain = peer_address::from_string("/ip4/127.0.0.1/tcp/1");
    const auto named = plain.with_peer(id);
    CHECK(named.peer == id);
    CHECK_FALSE(plain.peer);
    CHECK(named != plain);
    CHECK(named.without_peer() == plain);
    CHECK(named.to_string() == "/ip4/127.0.0.1/tcp/1/p2p/" + id.to_string());

    std::ostringstream os;
    os << named;
    CHECK(os.str() == named.to_string());

    std::unordered_set<peer_address> set;
    set.insert(peer_address::from_string("/ip6/::1/tcp/1"));
    set.insert(peer_address::from_string("/ip6/0:0::1/tcp/1"));
    set.insert(peer_address::from_string("/dns/LOCALHOST/tcp/1"));
    set.insert(peer_address::from_string("/dns/localhost/tcp/1"));
    set.insert(peer_address::from_string("/dns/localhost/tcp/2"));
    set.insert(peer_address::from_string("/sim/1/port/1"));
    set.insert(peer_address::from_string("/sim/1/port/1").with_peer(id));
    CHECK(set.size() == 5);

    // Ordering is total and consistent with equality, so addresses can key a std::map.
    CHECK(plain < named);
    CHECK(std::is_eq(plain <=> plain));
}
