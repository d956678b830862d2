// Peer addresses: where a peer listens, in a printable form hivemind and libp2p users know
// and a compact binary form for the wire (DHT records and RPC messages carry addresses).
//
// Text form (multiaddr-like; the /p2p part is optional):
//   /ip4/127.0.0.1/tcp/4242/p2p/<PeerId>
//   /ip6/::1/tcp/4242/p2p/<PeerId>
//   /dns/localhost/tcp/4242/p2p/<PeerId>
//   /sim/<node number>/port/<port>/p2p/<PeerId>     (the in-process simulated network)
//
// Binary form (at most 290 bytes):
//   u8 protocol (ip4 0, ip6 1, dns 2, sim 3) | u8 host length (1..253) | host (ASCII text,
//   same rules as the text form) | u16 port | u8 has_peer (0 or 1) | [32-byte PeerId]
//
// Addresses come from users and from the network, so both forms are validated strictly and
// stored canonically (lower-case DNS names, RFC 5952 IPv6, no leading zeros), which makes
// `==` and hashing meaningful and print -> parse -> print the identity.
#pragma once

#include "hivemesh/core/binary.hpp"
#include "hivemesh/core/error.hpp"
#include "hivemesh/crypto/peer_id.hpp"

#include <asio/ip/address_v6.hpp>

#include <algorithm>
#include <array>
#include <charconv>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <system_error>

namespace hivemesh::net {

namespace detail {

inline constexpr std::string_view reason_empty = "empty address";
inline constexpr std::string_view reason_too_long = "address longer than 512 characters";
inline constexpr std::string_view reason_bad_character =
    "control, space or non-ASCII character in address";
inline constexpr std::string_view reason_no_leading_slash = "address must start with '/'";
inline constexpr std::string_view reason_empty_component =
    "empty component (doubled, leading or trailing '/')";
inline constexpr std::string_view reason_missing_components =
    "missing components: expected /<protocol>/<host>/<tcp|port>/<port>[/p2p/<PeerId>]";
inline constexpr std::string_view reason_unknown_protocol =
    "unknown protocol: expected ip4, ip6, dns or sim";
inline constexpr std::string_view reason_bad_ip4 = "not a dotted-quad IPv4 address";
inline constexpr std::string_view reason_bad_ip6 = "not an IPv6 address (zones are not supported)";
inline constexpr std::string_view reason_bad_dns =
    "not a DNS name: labels of 1..63 letters, digits or inner '-', at most 253 characters";
inline constexpr std::string_view reason_numeric_dns =
    "DNS name ends in a numeric label; write an IPv4 address as /ip4/";
inline constexpr std::string_view reason_bad_sim_node =
    "sim node must be a decimal number without sign or leading zeros";
inline constexpr std::string_view reason_expected_tcp = "expected 'tcp' after the host";
inline constexpr std::string_view reason_expected_port_keyword = "expected 'port' after a sim node";
inline constexpr std::string_view reason_bad_port =
    "port must be a decimal number 0..65535 without sign or leading zeros";
inline constexpr std::string_view reason_expected_p2p =
    "unexpected component after the port: expected /p2p/<PeerId>";
inline constexpr std::string_view reason_missing_peer = "missing PeerId after /p2p";
inline constexpr std::string_view reason_bad_peer = "not a PeerId";
inline constexpr std::string_view reason_trailing = "trailing components after the PeerId";

inline constexpr bool is_digit(char c) noexcept {
    return c >= '0' && c <= '9';
}
inline constexpr bool is_hex_digit(char c) noexcept {
    return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}
inline constexpr bool is_letter(char c) noexcept {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
inline constexpr char to_lower(char c) noexcept {
    return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
}

/// A canonical unsigned decimal (digits only, no sign, no leading zero unless it is "0")
/// that is at most `max`; nullopt otherwise.
inline std::optional<std::uint64_t> parse_decimal(std::string_view text,
                                                  std::uint64_t max) noexcept {
    if (text.empty() || (text.size() > 1 && text.front() == '0')) return std::nullopt;
    for (const char c : text)
        if (!is_digit(c)) return std::nullopt; // from_chars alone would accept a leading '-'
    std::uint64_t value = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec != std::errc{} || end != text.data() + text.size() || value > max) return std::nullopt;
    return value;
}

/// Copies `text` into a NUL-terminated buffer for the C parsers behind Asio; false if it
/// does not fit.
template <std::size_t N>
bool to_c_string(std::string_view text, std::array<char, N>& buffer) noexcept {
    if (text.size() >= N) return false;
    text.copy(buffer.data(), text.size());
    buffer[text.size()] = '\0';
    return true;
}

inline std::string_view canonical_ip4(std::string_view host, std::string& out) {
    // Exactly four decimal parts of at most 255 without leading zeros, as inet_pton takes
    // them; such text is its own canonical form, so no formatting is needed.
    std::size_t parts = 0;
    std::size_t i = 0;
    while (i < host.size() || parts < 4) {
        if (parts > 0) {
            if (parts == 4 || i >= host.size() || host[i] != '.') return reason_bad_ip4;
            ++i;
        }
        const std::size_t begin = i;
        unsigned value = 0;
        while (i < host.size() && is_digit(host[i]) && i - begin < 3)
            value = value * 10 + static_cast<unsigned>(host[i++] - '0');
        const std::size_t digits = i - begin;
        if (digits == 0 || value > 255 || (digits > 1 && host[begin] == '0')) return reason_bad_ip4;
        ++parts;
    }
    out.assign(host);
    return {};
}

inline std::string_view canonical_ip6(std::string_view host, std::string& out) {
    std::array<char, 46> buffer{}; // INET6_ADDRSTRLEN
    // Only hex digits, ':' and the '.' of an embedded IPv4 tail: this also refuses "%zone".
    for (const char c : host)
        if (!is_hex_digit(c) && c != ':' && c != '.') return reason_bad_ip6;
    if (!to_c_string(host, buffer)) return reason_bad_ip6;
    std::error_code ec;
    const auto address = asio::ip::make_address_v6(buffer.data(), ec);
    if (ec || address.scope_id() != 0) return reason_bad_ip6;
    out = address.to_string(); // inet_ntop: lower case, longest zero run compressed
    return {};
}

inline std::string_view canonical_dns(std::string_view host, std::string& out) {
    if (host.empty() || host.size() > 253) return reason_bad_dns;
    std::size_t label_start = 0;
    bool last_label_numeric = true;
    for (std::size_t i = 0; i <= host.size(); ++i) {
        if (i == host.size() || host[i] == '.') {
            const std::size_t length = i - label_start;
            if (length == 0 || length > 63) return reason_bad_dns;
            if (host[label_start] == '-' || host[i - 1] == '-') return reason_bad_dns;
            label_start = i + 1;
            if (i == host.size()) break;
            last_label_numeric = true;
            continue;
        }
        const char c = host[i];
        if (!is_letter(c) && !is_digit(c) && c != '-') return reason_bad_dns;
        if (!is_digit(c)) last_label_numeric = false;
    }
    // "1.2.3.4" is an IPv4 literal to getaddrinfo, and RFC 1123 top-level labels are not
    // all-numeric: refusing it keeps one spelling per address.
    if (last_label_numeric) return reason_numeric_dns;
    out.assign(host);
    for (char& c : out)
        c = to_lower(c); // DNS compares names case-insensitively
    return {};
}

inline std::string_view canonical_sim_node(std::string_view host, std::string& out) {
    if (!parse_decimal(host, UINT64_MAX)) return reason_bad_sim_node;
    out.assign(host);
    return {};
}

} // namespace detail

/// Where a peer can be reached, and optionally who it is.
///
/// A plain aggregate: `parse`/`from_string`/`read` produce valid, canonical values; a value
/// built by hand is checked by `is_valid()` and by `write()`.
struct peer_address {
    /// The network an address belongs to; the values are part of the binary form.
    enum class protocol : std::uint8_t { ip4 = 0, ip6 = 1, dns = 2, sim = 3 };

    static constexpr std::size_t max_text_length = 512;
    static constexpr std::size_t max_host_length = 253; // the longest DNS name
    static constexpr std::size_t max_encoded_size =
        1 + 1 + max_host_length + 2 + 1 + crypto::peer_id::size;

    protocol proto = protocol::ip4;
    /// Dotted quad (ip4), IPv6 literal without brackets (ip6), DNS name (dns) or decimal
    /// node number (sim).
    std::string host;
    std::uint16_t port = 0;
    /// Who is expected to answer; absent in listen addresses and before the id is known.
    std::optional<crypto::peer_id> peer;

    /// The name of a protocol as it appears in the text form.
    static constexpr std::string_view protocol_name(protocol p) noexcept {
        switch (p) {
        case protocol::ip4:
            return "ip4";
        case protocol::ip6:
            return "ip6";
        case protocol::dns:
            return "dns";
        case protocol::sim:
            return "sim";
        }
        return "?";
    }

    /// The address of node `node` of the simulated network.
    static peer_address sim(std::uint64_t node, std::uint16_t port,
                            std::optional<crypto::peer_id> peer = std::nullopt) {
        return {protocol::sim, std::to_string(node), port, peer};
    }

    /// The node number of a sim address; nullopt for other protocols or a bad host.
    std::optional<std::uint64_t> sim_node() const noexcept {
        if (proto != protocol::sim) return std::nullopt;
        return detail::parse_decimal(host, UINT64_MAX);
    }

    /// A copy that names `id` as the peer expected at this address.
    peer_address with_peer(const crypto::peer_id& id) const {
        peer_address copy = *this;
        copy.peer = id;
        return copy;
    }

    /// A copy without the peer id, e.g. to compare where two peers listen.
    peer_address without_peer() const {
        peer_address copy = *this;
        copy.peer.reset();
        return copy;
    }

    /// True if `host` is valid for `proto` (in any spelling `parse` accepts) and would fit
    /// the binary form.
    bool is_valid() const {
        std::string canonical;
        return canonicalize_host(proto, host, canonical).empty();
    }

    /// The text form, e.g. "/ip4/127.0.0.1/tcp/4242/p2p/<PeerId>".
    std::string to_string() const {
        std::string out;
        out.reserve(16 + host.size() + (peer ? 5 + 44 : 0));
        out += '/';
        out += protocol_name(proto);
        out += '/';
        out += host;
        out += proto == protocol::sim ? "/port/" : "/tcp/";
        out += std::to_string(port);
        if (peer) {
            out += "/p2p/";
            out += peer->to_string();
        }
        return out;
    }

    /// Parses the text form. On failure returns nullopt and, when `reason` is given, points
    /// it at a short static description of the first problem found.
    static std::optional<peer_address> parse(std::string_view text,
                                             std::string_view* reason = nullptr) {
        peer_address result;
        const std::string_view why = parse_into(text, result);
        if (reason) *reason = why;
        if (!why.empty()) return std::nullopt;
        return result;
    }

    /// Parses the text form; throws std::system_error(errc::invalid_argument) whose message
    /// says what is wrong.
    static peer_address from_string(std::string_view text) {
        peer_address result;
        const std::string_view why = parse_into(text, result);
        if (!why.empty())
            throw std::system_error(errc::invalid_argument, "hivemesh: bad peer address \"" +
                                                                printable_prefix(text) +
                                                                "\": " + std::string(why));
        return result;
    }

    /// Appends the binary form. Throws std::system_error(errc::invalid_argument) if the
    /// address is not valid (see is_valid()): the peer would refuse it anyway.
    void write(binary_writer& w) const {
        if (!is_valid())
            throw std::system_error(errc::invalid_argument,
                                    "hivemesh: cannot encode invalid peer address \"" +
                                        printable_prefix(host) + "\"");
        w.write(static_cast<std::uint8_t>(proto));
        w.write(static_cast<std::uint8_t>(host.size())); // is_valid(): at most 253
        w.write_bytes(as_bytes(host));
        w.write(port);
        w.write(static_cast<std::uint8_t>(peer ? 1 : 0));
        if (peer) w.write_bytes(peer->view());
    }

    /// Reads the binary form, validating it like the text form and storing the canonical
    /// host. On failure returns an empty address and sets the reader's error:
    /// truncated_input, length_limit_exceeded (host over 253 bytes) or corrupt_data
    /// (unknown protocol, invalid host, has_peer flag other than 0 or 1).
    static peer_address read(binary_reader& r) {
        peer_address result;
        const auto proto_byte = r.read<std::uint8_t>();
        if (!r.ok()) return {};
        if (proto_byte > static_cast<std::uint8_t>(protocol::sim)) {
            r.fail(errc::corrupt_data);
            return {};
        }
        result.proto = static_cast<protocol>(proto_byte);
        const auto host_length = r.read<std::uint8_t>();
        if (!r.check_count(host_length, 1, max_host_length)) return {};
        const std::string_view host = as_string_view(r.read_bytes(host_length));
        if (!r.ok()) return {};
        if (!canonicalize_host(result.proto, host, result.host).empty()) {
            r.fail(errc::corrupt_data);
            return {};
        }
        result.port = r.read<std::uint16_t>();
        const auto has_peer = r.read<std::uint8_t>();
        if (!r.ok()) return {};
        if (has_peer > 1) {
            r.fail(errc::corrupt_data);
            return {};
        }
        if (has_peer == 1) {
            const byte_view id = r.read_bytes(crypto::peer_id::size);
            if (!r.ok()) return {};
            crypto::peer_id::bytes_type bytes;
            std::copy(id.begin(), id.end(), bytes.begin());
            result.peer = crypto::peer_id(bytes);
        }
        return result;
    }

    /// Appends the binary form of an address whose PeerId travels beside it or is proven by
    /// the connection, so never twice. Throws std::system_error(errc::invalid_argument) if
    /// the address carries a PeerId or is not valid.
    void write_without_peer(binary_writer& w) const {
        if (peer)
            throw std::system_error(errc::invalid_argument,
                                    "hivemesh: an address sent without its PeerId carries one");
        write(w);
    }

    /// Reads what write_without_peer() wrote. Only the canonical spelling of the host is
    /// accepted, so an address has one encoding; a PeerId, another spelling or anything
    /// read() refuses fails the reader with corrupt_data (or read()'s error) and returns an
    /// empty address.
    static peer_address read_without_peer(binary_reader& r) {
        const byte_view ahead = r.rest();
        peer_address address = read(r);
        if (!r.ok()) return {};
        const auto host_length = static_cast<std::size_t>(ahead[1]);
        const std::string_view wire_host = as_string_view(ahead.subspan(2, host_length));
        if (address.peer || wire_host != address.host) {
            r.fail(errc::corrupt_data);
            return {};
        }
        return address;
    }

    friend bool operator==(const peer_address&, const peer_address&) = default;
    friend auto operator<=>(const peer_address&, const peer_address&) = default;
    friend std::ostream& operator<<(std::ostream& os, const peer_address& a) {
        return os << a.to_string();
    }

private:
    static std::string_view parse_into(std::string_view text, peer_address& out);

    /// Validates `host` for protocol `p` and stores its canonical spelling in `out`;
    /// returns an empty view on success, else the reason.
    static std::string_view canonicalize_host(protocol p, std::string_view host, std::string& out) {
        switch (p) {
        case protocol::ip4:
            return detail::canonical_ip4(host, out);
        case protocol::ip6:
            return detail::canonical_ip6(host, out);
        case protocol::dns:
            return detail::canonical_dns(host, out);
        case protocol::sim:
            return detail::canonical_sim_node(host, out);
        }
        return detail::reason_unknown_protocol;
    }

    /// At most 64 characters of `text` with anything unprintable replaced, for messages.
    static std::string printable_prefix(std::string_view text) {
        std::string out(text.substr(0, 64));
        for (char& c : out)
            if (c < 0x20 || c > 0x7E) c = '?';
        if (text.size() > 64) out += "...";
        return out;
    }
};

inline std::string_view peer_address::parse_into(std::string_view text, peer_address& out) {
    if (text.empty()) return detail::reason_empty;
    if (text.size() > max_text_length) return detail::reason_too_long;
    for (const char c : text)
        if (c <= 0x20 || c >= 0x7F) return detail::reason_bad_character;
    if (text.front() != '/') return detail::reason_no_leading_slash;

    // Split the rest on '/'; one slot more than a full address detects trailing parts.
    std::array<std::string_view, 7> parts;
    std::size_t count = 0;
    std::string_view rest = text.substr(1);
    while (true) {
        const auto slash = rest.find('/');
        const std::string_view part = rest.substr(0, slash);
        if (part.empty()) return detail::reason_empty_component;
        if (count == parts.size()) return detail::reason_trailing;
        parts[count++] = part;
        if (slash == std::string_view::npos) break;
        rest.remove_prefix(slash + 1);
    }

    if (parts[0] == "ip4") {
        out.proto = protocol::ip4;
    } else if (parts[0] == "ip6") {
        out.proto = protocol::ip6;
    } else if (parts[0] == "dns") {
        out.proto = protocol::dns;
    } else if (parts[0] == "sim") {
        out.proto = protocol::sim;
    } else {
        return detail::reason_unknown_protocol;
    }
    if (count < 4) return detail::reason_missing_components;

    if (const auto why = canonicalize_host(out.proto, parts[1], out.host); !why.empty()) return why;
    if (out.proto == protocol::sim) {
        if (parts[2] != "port") return detail::reason_expected_port_keyword;
    } else if (parts[2] != "tcp") {
        return detail::reason_expected_tcp;
    }
    const auto port = detail::parse_decimal(parts[3], UINT16_MAX);
    if (!port) return detail::reason_bad_port;
    out.port = static_cast<std::uint16_t>(*port);

    out.peer.reset();
    if (count == 4) return {};
    if (parts[4] != "p2p") return detail::reason_expected_p2p;
    if (count == 5) return detail::reason_missing_peer;
    if (count > 6) return detail::reason_trailing;
    out.peer = crypto::peer_id::parse(parts[5]);
    if (!out.peer) return detail::reason_bad_peer;
    return {};
}

} // namespace hivemesh::net

template <>
struct std::hash<hivemesh::net::peer_address> {
    std::size_t operator()(const hivemesh::net::peer_address& a) const noexcept {
        std::size_t h = std::hash<std::string>{}(a.host);
        const auto mix = [&h](std::size_t v) {
            h ^= v + 0x9E3779B97F4A7C15ULL + (h << 6) + (h >> 2);
        };
        mix(static_cast<std::size_t>(a.proto));
        mix(a.port);
        mix(a.peer ? std::hash<hivemesh::crypto::peer_id>{}(*a.peer) : 0);
        return h;
    }
};
