// An averaging group as every member sees it: a random id and the ordered member list.
// Matchmaking produces it; the all-reduce and the Moshpit key rotation consume it.
#pragma once

#include "hivemesh/core/bytes.hpp"
#include "hivemesh/crypto/peer_id.hpp"
#include "hivemesh/net/node.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace hivemesh::averaging {

/// A group's random identifier (every member holds the same bytes).
using group_id = std::array<std::byte, 32>;

/// What a member does in an all-reduce.
enum class member_role : std::uint8_t {
    node = 0,   ///< sends its values and reduces a span
    client = 1, ///< sends its values only (share 0; cannot be dialed)
    aux = 2,    ///< reduces a span only (weight 0, no values of its own)
};

inline constexpr std::string_view to_string(member_role r) noexcept {
    switch (r) {
    case member_role::node:
        return "node";
    case member_role::client:
        return "client";
    case member_role::aux:
        return "aux";
    }
    return "unknown";
}

/// Does this role contribute values (and so receive averages)?
inline constexpr bool sends_values(member_role r) noexcept {
    return r != member_role::aux;
}

template <class Endpoint>
struct group_member {
    net::peer_endpoint<Endpoint> peer; ///< PeerId and where to dial (unused for clients)
    member_role role = member_role::node;
    double bandwidth = 0; ///< as the member announced it (0: unknown, or a client)
    byte_buffer metadata; ///< the member's own bytes, gathered by matchmaking
};

/// A formed group. The member order is the group's: spans, indices and bit masks follow it.
template <class Endpoint>
struct group_info {
    group_id id{};
    std::vector<group_member<Endpoint>> members;

    std::size_t size() const noexcept { return members.size(); }
};

/// The members' bandwidths in their order, as load_balance() takes them: 0 for a client,
/// std::nullopt where a member announced none (0).
template <class Endpoint>
std::vector<std::optional<double>> announced_bandwidths(const group_info<Endpoint>& group) {
    std::vector<std::optional<double>> out;
    out.reserve(group.size());
    for (const auto& m : group.members) {
        if (m.role == member_role::client)
            out.emplace_back(0.0);
        else if (m.bandwidth > 0)
            out.emplace_back(m.bandwidth);
        else
            out.emplace_back(std::nullopt);
    }
    return out;
}

} // namespace hivemesh::averaging
