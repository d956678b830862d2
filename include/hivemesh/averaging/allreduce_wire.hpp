// Wire messages of the butterfly all-reduce. One streaming RPC call per (sender, reducer)
// pair: the sender writes `begin`, then its slice of the reducer's span as `part` messages in
// order, then closes its side; the reducer answers each part it averaged with a `result`.
//
//   every message: u8 version (2: allreduce_wire_version) | u8 type
//   begin  (1): group_id[32] | u16 group_size | u16 sender | u16 reducer | f64 weight
//               | u64 span_begin | u64 span_size | u32 part_elements
//   part   (2): u32 part | compressed values (hivemesh::compression buffer, to the end)
//   result (3): u32 part | u16 mask length | mask (bit i of byte i/8: member i contributed)
//               | u16 exclusions | exclusions x (u16 member | u8 value_fault)
//               | compressed averaged values (to the end)
//
// A result's exclusions name the members whose values for the part arrived but were left out
// of the mean, in increasing member order, none of them a contributor.
// Decoders check lengths before use and refuse trailing bytes; the payloads are validated by
// compression::decompress_finite_into against the part's element count.
#pragma once

#include "hivemesh/averaging/group.hpp"
#include "hivemesh/core/binary.hpp"
#include "hivemesh/core/error.hpp"

#include <cmath>
#include <cstdint>
#include <string_view>
#include <vector>

namespace hivemesh::averaging {

/// The version byte of the matchmaking messages.
inline constexpr std::uint8_t wire_version = 1;
/// The version byte of the all-reduce messages (2: results name the members left out).
inline constexpr std::uint8_t allreduce_wire_version = 2;

enum class allreduce_message : std::uint8_t { begin = 1, part = 2, result = 3 };

/// Why values that reached their destination were not used (see
/// allreduce_options::max_norm_ratio).
enum class value_fault : std::uint8_t {
    non_finite = 1, ///< a NaN or an infinity
    norm_bound = 2, ///< a norm beyond allreduce_options::max_norm_ratio allows
};

inline constexpr std::string_view to_string(value_fault f) noexcept {
    switch (f) {
    case value_fault::non_finite:
        return "non_finite";
    case value_fault::norm_bound:
        return "norm_bound";
    }
    return "unknown";
}

/// A member whose values for a part reached the part's reducer and were left out of the mean
/// (their weight too).
struct exclusion {
    std::size_t member = 0;
    value_fault fault = value_fault::non_finite;

    friend bool operator==(const exclusion&, const exclusion&) = default;
};

/// The first message of a sender: who it is and what it believes the round looks like; the
/// reducer refuses the stream unless every field matches its own view.
struct begin_message {
    group_id group{};
    std::uint16_t group_size = 0;
    std::uint16_t sender = 0;
    std::uint16_t reducer = 0;
    double weight = 0;
    std::uint64_t span_begin = 0;
    std::uint64_t span_size = 0;
    std::uint32_t part_elements = 0;

    friend bool operator==(const begin_message&, const begin_message&) = default;
};

/// A part of values (sender to reducer) or of averages (reducer to sender).
struct part_message {
    std::uint32_t part = 0;
    std::vector<bool> contributors;  ///< result only: which members' values are in the mean
    std::vector<exclusion> excluded; ///< result only: who was left out, in member order
    byte_view payload;               ///< a compressed buffer (a view into the message)
};

/// Largest mask a group of 65,535 members needs.
inline constexpr std::size_t max_mask_bytes = (0xFFFF + 7) / 8;

namespace detail {

/// The `u8 version | u8 type` head of every averaging message (each wire format numbers its
/// own types and versions).
template <class Type>
void write_head(binary_writer& w, Type type, std::uint8_t version = wire_version) {
    w.write(version);
    w.write(static_cast<std::uint8_t>(type));
}

/// Reads the head; unsupported_version or protocol_violation (another type) otherwise.
template <class Type>
bool read_head(binary_reader& r, Type expected, std::uint8_t version = wire_version) {
    const auto got_version = r.read<std::uint8_t>();
    const auto type = r.read<std::uint8_t>();
    if (!r.ok()) return false;
    if (got_version != version) return r.fail(errc::unsupported_version);
    if (type != static_cast<std::uint8_t>(expected)) return r.fail(errc::protocol_violation);
    return true;
}

} // namespace detail

inline byte_buffer encode(const begin_message& m) {
    byte_buffer out;
    binary_writer w(out);
    detail::write_head(w, allreduce_message::begin, allreduce_wire_version);
    w.write_bytes(m.group);
    w.write(m.group_size);
    w.write(m.sender);
    w.write(m.reducer);
    w.write_f64(m.weight);
    w.write(m.span_begin);
    w.write(m.span_size);
    w.write(m.part_elements);
    return out;
}

/// Errors: truncated_input, unsupported_version, protocol_violation (another type),
/// trailing_data.
inline std::error_code decode(byte_view in, begin_message& m) {
    binary_reader r(in);
    if (!detail::read_head(r, allreduce_message::begin, allreduce_wire_version)) return r.error();
    const auto id = r.read_bytes(m.group.size());
    if (r.ok()) std::copy(id.begin(), id.end(), m.group.begin());
    m.group_size = r.read<std::uint16_t>();
    m.sender = r.read<std::uint16_t>();
    m.reducer = r.read<std::uint16_t>();
    m.weight = r.read_f64();
    m.span_begin = r.read<std::uint64_t>();
    m.span_size = r.read<std::uint64_t>();
    m.part_elements = r.read<std::uint32_t>();
    return r.finish();
}

/// Writes the head of a part message; the caller appends the compressed values.
inline void encode_part_head(byte_buffer& out, std::uint32_t part) {
    binary_writer w(out);
    detail::write_head(w, allreduce_message::part, allreduce_wire_version);
    w.write(part);
}

/// Writes the head of a result message; the caller appends the compressed averages.
/// `excluded` must be in increasing member order.
inline void encode_result_head(byte_buffer& out, std::uint32_t part,
                               const std::vector<bool>& contributors,
                               const std::vector<exclusion>& excluded = {}) {
    binary_writer w(out);
    detail::write_head(w, allreduce_message::result, allreduce_wire_version);
    w.write(part);
    const std::size_t mask_bytes = (contributors.size() + 7) / 8;
    if (mask_bytes > max_mask_bytes)
        throw std::system_error(errc::invalid_argument, "allreduce: group too large");
    w.write(static_cast<std::uint16_t>(mask_bytes));
    std::byte* mask = w.grow(mask_bytes);
    std::fill(mask, mask + mask_bytes, std::byte{0});
    for (std::size_t i = 0; i < contributors.size(); ++i)
        if (contributors[i]) mask[i / 8] |= std::byte{1} << (i % 8);
    if (excluded.size() > 0xFFFF)
        throw std::system_error(errc::invalid_argument, "allreduce: group too large");
    w.write(static_cast<std::uint16_t>(excluded.size()));
    for (const auto& e : excluded) {
        w.write(static_cast<std::uint16_t>(e.member));
        w.write(static_cast<std::uint8_t>(e.fault));
    }
}

/// Decodes a part (`type` part) or a result (`type` result) message. For a result the mask
/// must be exactly ceil(group_size / 8) bytes with no bit at or past group_size, and the
/// exclusions name members below group_size in increasing order, none a contributor, each
/// with a known fault. Errors: truncated_input, unsupported_version, protocol_violation.
inline std::error_code decode_part(byte_view in, allreduce_message type, std::size_t group_size,
                                   part_message& m) {
    binary_reader r(in);
    if (!detail::read_head(r, type, allreduce_wire_version)) return r.error();
    m.part = r.read<std::uint32_t>();
    m.contributors.clear();
    m.excluded.clear();
    if (type == allreduce_message::result) {
        const auto mask_bytes = r.read<std::uint16_t>();
        if (r.ok() && mask_bytes != (group_size + 7) / 8) r.fail(errc::protocol_violation);
        const auto mask = r.read_bytes(mask_bytes);
        if (!r.ok()) return r.error();
        m.contributors.assign(group_size, false);
        for (std::size_t i = 0; i < mask.size() * 8; ++i) {
            const bool bit = (mask[i / 8] & (std::byte{1} << (i % 8))) != std::byte{0};
            if (bit && i >= group_size) return make_error_code(errc::protocol_violation);
            if (bit) m.contributors[i] = true;
        }
        const auto count = r.read<std::uint16_t>();
        for (std::size_t i = 0; i < count && r.ok(); ++i) {
            const auto member = r.read<std::uint16_t>();
            const auto fault = r.read<std::uint8_t>();
            if (!r.ok()) break;
            const bool ordered = m.excluded.empty() || member > m.excluded.back().member;
            const bool known = fault == static_cast<std::uint8_t>(value_fault::non_finite) ||
                               fault == static_cast<std::uint8_t>(value_fault::norm_bound);
            if (!ordered || !known || member >= group_size || m.contributors[member])
                return make_error_code(errc::protocol_violation);
            m.excluded.push_back({member, static_cast<value_fault>(fault)});
        }
    }
    if (!r.ok()) return r.error();
    m.payload = r.rest();
    return {};
}

} // namespace hivemesh::averaging
