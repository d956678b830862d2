// Wire messages of matchmaking. A follower opens one streaming call to a leader
// ("<prefix>.join") and sends a join request; the leader answers with a join response and,
// if it accepted, later with the formed group or a disband notice (which names the leader
// the disbanding peer now follows, if any, for its former followers to ask).
//
//   every message: u8 version (1) | u8 type
//   request  (1): u64 schema_hash | u32-sized group key | i64 expiration (ns since the Unix
//                 epoch) | member
//   response (2): u8 join_status | u8 has_leader | [u8[32] PeerId | address]
//   group    (3): group_id[32] | u16 count (1..65535) | count x (u8[32] PeerId | member)
//   disband  (4): u8 has_leader | [u8[32] PeerId | address]
//   member:       u8 role | f64 bandwidth | u8 has_address | [address] | u32-sized metadata
//   address:      net::peer_address binary form without a PeerId (canonical host only)
//
// Decoders check every length before use and refuse trailing bytes; encodings are canonical
// (decoding then encoding gives the same bytes).
#pragma once

#include "hivemesh/averaging/allreduce_wire.hpp"
#include "hivemesh/averaging/group.hpp"
#include "hivemesh/core/binary.hpp"
#include "hivemesh/core/clock.hpp"
#include "hivemesh/core/error.hpp"
#include "hivemesh/dht/messages.hpp"

#include <cmath>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace hivemesh::averaging {

enum class matchmaking_message : std::uint8_t { request = 1, response = 2, group = 3, disband = 4 };

/// A leader's answer to a join request; the values are part of the wire format.
enum class join_status : std::uint8_t {
    accepted = 0,
    not_looking = 1,     ///< the leader is not looking for a group now
    bad_schema_hash = 2, ///< the tensors differ: these peers must never average together
    bad_group_key = 3,   ///< the leader looks under another key
    not_declared = 4,    ///< the follower's declaration has already expired
    not_a_leader = 5,    ///< the peer follows another leader (suggested) or is later than us
    duplicate_peer = 6,  ///< the follower is already in the group
    group_full = 7,      ///< the group reached its target size
    bad_request = 8,     ///< the request is malformed or inconsistent
};

inline constexpr std::uint8_t max_join_status = 8;

inline constexpr std::string_view to_string(join_status s) noexcept {
    switch (s) {
    case join_status::accepted:
        return "accepted";
    case join_status::not_looking:
        return "not looking for a group";
    case join_status::bad_schema_hash:
        return "different tensor schema";
    case join_status::bad_group_key:
        return "different group key";
    case join_status::not_declared:
        return "declaration expired";
    case join_status::not_a_leader:
        return "not a leader";
    case join_status::duplicate_peer:
        return "already in the group";
    case join_status::group_full:
        return "group full";
    case join_status::bad_request:
        return "bad request";
    }
    return "unknown";
}

/// What a peer tells about itself when it joins.
struct member_wire {
    member_role role = member_role::node;
    double bandwidth = 0;
    std::optional<net::peer_address> address; ///< where to dial it; none for a client
    byte_buffer metadata;

    friend bool operator==(const member_wire&, const member_wire&) = default;
};

struct join_request {
    std::uint64_t schema_hash = 0;
    std::string group_key;
    time_point expiration{};
    member_wire member;

    friend bool operator==(const join_request&, const join_request&) = default;
};

/// A leader to ask instead: its PeerId and where to dial it.
using suggested_leader = std::pair<crypto::peer_id, net::peer_address>;

struct join_response {
    join_status status = join_status::accepted;
    /// With not_a_leader: the leader the peer follows, to ask instead.
    std::optional<suggested_leader> leader;

    friend bool operator==(const join_response&, const join_response&) = default;
};

/// A leader's notice that its group will not form; `leader` is the peer it now follows.
struct disband_message {
    std::optional<suggested_leader> leader;

    friend bool operator==(const disband_message&, const disband_message&) = default;
};

struct group_message {
    group_id id{};
    std::vector<std::pair<crypto::peer_id, member_wire>> members;

    friend bool operator==(const group_message&, const group_message&) = default;
};

/// Decoder limits.
struct matchmaking_limits {
    std::size_t max_group_key = 512;
    std::size_t max_metadata = 4096;
    std::size_t max_group_size = 1024;
};

namespace detail {

inline void write_member(binary_writer& w, const member_wire& m) {
    w.write(static_cast<std::uint8_t>(m.role));
    w.write_f64(m.bandwidth);
    w.write_flag(m.address.has_value());
    if (m.address) m.address->write_without_peer(w);
    w.write_sized_bytes(m.metadata);
}

inline void read_member(binary_reader& r, member_wire& m, const matchmaking_limits& limits) {
    const auto role = r.read<std::uint8_t>();
    if (r.ok() && role > static_cast<std::uint8_t>(member_role::aux)) r.fail(errc::corrupt_data);
    m.role = static_cast<member_role>(role);
    m.bandwidth = r.read_f64();
    if (r.ok() && !(std::isfinite(m.bandwidth) && m.bandwidth >= 0)) r.fail(errc::corrupt_data);
    if (r.read_flag() && r.ok()) m.address = net::peer_address::read_without_peer(r);
    m.metadata = to_buffer(r.read_sized_bytes(limits.max_metadata));
}

inline void write_peer_id(binary_writer& w, const crypto::peer_id& id) {
    w.write_bytes(id.bytes());
}

inline crypto::peer_id read_peer_id(binary_reader& r) {
    crypto::peer_id::bytes_type bytes{};
    const auto raw = r.read_bytes(bytes.size());
    if (r.ok()) std::copy(raw.begin(), raw.end(), bytes.begin());
    return crypto::peer_id(bytes);
}

} // namespace detail

inline byte_buffer encode(const join_request& m) {
    byte_buffer out;
    binary_writer w(out);
    detail::write_head(w, matchmaking_message::request);
    w.write(m.schema_hash);
    w.write_string(m.group_key);
    w.write(static_cast<std::int64_t>(m.expiration.time_since_epoch().count()));
    detail::write_member(w, m.member);
    return out;
}

inline std::error_code decode(byte_view in, join_request& m,
                              const matchmaking_limits& limits = {}) {
    binary_reader r(in);
    if (!detail::read_head(r, matchmaking_message::request)) return r.error();
    m.schema_hash = r.read<std::uint64_t>();
    m.group_key = r.read_string(limits.max_group_key);
    m.expiration = time_point(duration(r.read<std::int64_t>()));
    detail::read_member(r, m.member, limits);
    return r.finish();
}

namespace detail {

inline void write_leader(binary_writer& w, const std::optional<suggested_leader>& leader) {
    w.write_flag(leader.has_value());
    if (leader) {
        write_peer_id(w, leader->first);
        leader->second.write_without_peer(w);
    }
}

inline void read_leader(binary_reader& r, std::optional<suggested_leader>& leader) {
    leader.reset();
    if (r.read_flag() && r.ok()) {
        auto id = read_peer_id(r);
        auto address = net::peer_address::read_without_peer(r);
        if (r.ok()) leader.emplace(id, std::move(address));
    }
}

} // namespace detail

inline byte_buffer encode(const join_response& m) {
    byte_buffer out;
    binary_writer w(out);
    detail::write_head(w, matchmaking_message::response);
    w.write(static_cast<std::uint8_t>(m.status));
    detail::write_leader(w, m.leader);
    return out;
}

inline std::error_code decode(byte_view in, join_response& m) {
    binary_reader r(in);
    if (!detail::read_head(r, matchmaking_message::response)) return r.error();
    const auto status = r.read<std::uint8_t>();
    if (r.ok() && status > max_join_status) r.fail(errc::corrupt_data);
    m.status = static_cast<join_status>(status);
    detail::read_leader(r, m.leader);
    return r.finish();
}

inline byte_buffer encode(const group_message& m) {
    if (m.members.empty() || m.members.size() > 0xFFFF)
        throw std::system_error(errc::invalid_argument, "group_message: 1..65535 members");
    byte_buffer out;
    binary_writer w(out);
    detail::write_head(w, matchmaking_message::group);
    w.write_bytes(m.id);
    w.write(static_cast<std::uint16_t>(m.members.size()));
    for (const auto& [id, member] : m.members) {
        detail::write_peer_id(w, id);
        detail::write_member(w, member);
    }
    return out;
}

inline std::error_code decode(byte_view in, group_message& m,
                              const matchmaking_limits& limits = {}) {
    binary_reader r(in);
    if (!detail::read_head(r, matchmaking_message::group)) return r.error();
    const auto id = r.read_bytes(m.id.size());
    if (r.ok()) std::copy(id.begin(), id.end(), m.id.begin());
    const auto count = r.read<std::uint16_t>();
    // Each member takes at least 46 bytes: id, role, bandwidth, flag, metadata length.
    if (r.ok() && (count == 0 || !r.check_count(count, 46, limits.max_group_size)))
        r.fail(errc::length_limit_exceeded);
    m.members.clear();
    for (std::size_t i = 0; i < count && r.ok(); ++i) {
        auto& [peer, member] = m.members.emplace_back();
        peer = detail::read_peer_id(r);
        detail::read_member(r, member, limits);
    }
    return r.finish();
}

inline byte_buffer encode(const disband_message& m) {
    byte_buffer out;
    binary_writer w(out);
    detail::write_head(w, matchmaking_message::disband);
    detail::write_leader(w, m.leader);
    return out;
}

inline std::error_code decode(byte_view in, disband_message& m) {
    binary_reader r(in);
    if (!detail::read_head(r, matchmaking_message::disband)) return r.error();
    detail::read_leader(r, m.leader);
    return r.finish();
}

/// The type of a leader's message after its response (group or disband), or an error.
inline std::error_code peek_type(byte_view in, matchmaking_message& type) {
    if (in.size() < 2) return errc::truncated_input;
    if (static_cast<std::uint8_t>(in[0]) != wire_version) return errc::unsupported_version;
    const auto t = static_cast<std::uint8_t>(in[1]);
    if (t < 1 || t > 4) return errc::protocol_violation;
    type = static_cast<matchmaking_message>(t);
    return {};
}

} // namespace hivemesh::averaging
