// Wire format of the DHT RPCs: ping, store and find, each a request and a response.
//
// Every message starts with `u8 version (3) | u8 type`; integers are little-endian; byte
// strings ("sized") are `u32 length | bytes`; counts are u32; times are i64 nanoseconds
// since the Unix epoch; a flag is a u8 that must be 0 or 1 and announces an optional field.
//
// | type | message        | body                                                      |
// |------|----------------|-----------------------------------------------------------|
// | 1    | ping_request   | sender                                                    |
// | 2    | ping_response  | (nothing)                                                 |
// | 3    | store_request  | sender, u32 item count, store_item[count]                 |
// | 4    | store_response | u32 count, u8 store_status[count]                         |
// | 5    | find_request   | sender, u8 want_values, u32 max_peers, u32 key count,     |
// |      |                | 20-byte id[count], u32 item count, store_item[count]      |
// | 6    | find_response  | u32 result count, find_result[count], u32 status count,   |
// |      |                | u8 store_status[count]                                    |
//
// | part         | layout                                                              |
// |--------------|---------------------------------------------------------------------|
// | sender       | u8 has_listen, [address]                                            |
// | address      | net::peer_address binary form with has_peer = 0 (the peer id is     |
// |              | known from the connection or sent next to it), canonical host only  |
// | store_item   | sized key, u8 has_subkey, [sized subkey], sized value,              |
// |              | i64 expiration, sized signature, u8 in_cache                        |
// | stored_value | sized value, i64 expiration, sized signature                        |
// | key_entry    | sized key, u8 has_plain, [stored_value], u32 subkey count,          |
// |              | (sized subkey, stored_value)[count] in strictly increasing order    |
// | find_result  | u8 has_entry, [key_entry], u32 peer count, peer_info[count]         |
// | peer_info    | u8 has_key, 32-byte public key (has_key) or PeerId, address         |
//
// A find may carry records to store (a store's lookup hands them to the nodes it asks, so
// that the nearest of them need no store request after it); its response then holds one
// status per item, as a store_response would. A find that does not want values is
// answered with no entries.
//
// Each value has exactly one encoding: decoding refuses non-canonical input (flags other
// than 0 or 1, unsorted or duplicate subkeys, a plain value next to a dictionary,
// non-canonical address hosts, status bytes above max_store_status), so whatever decodes
// re-encodes to the same bytes. Every length and count is checked against
// `message_limits` and against the bytes that remain before anything is allocated.
#pragma once

#include "hivemesh/core/binary.hpp"
#include "hivemesh/core/bytes.hpp"
#include "hivemesh/core/clock.hpp"
#include "hivemesh/core/error.hpp"
#include "hivemesh/crypto/identity.hpp"
#include "hivemesh/crypto/peer_id.hpp"
#include "hivemesh/dht/id.hpp"
#include "hivemesh/dht/record.hpp"
#include "hivemesh/net/address.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <limits>
#include <new>
#include <optional>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace hivemesh::dht {

/// Upper bounds a decoder enforces on what a peer sends; encoders refuse to exceed them.
struct message_limits {
    std::size_t max_items = 256; ///< items per store, statuses, keys per find, results
    std::size_t max_key_size = 1024;
    std::size_t max_subkey_size = 1024;
    std::size_t max_value_size = 64 * 1024;
    std::size_t max_signature_size = 128;
    std::size_t max_subkeys = 1024; ///< dictionary entries in one key_entry
    std::size_t max_peers = 64;     ///< peers per find_result, and find_request::max_peers
};

/// A peer and where it listens. `address.peer` must be empty: the PeerId travels in `peer`,
/// or as the public key that proves it when the sender knows that.
struct peer_info {
    crypto::peer_id peer;
    net::peer_address address;
    /// When set, `peer` is its PeerId (the encoder refuses anything else).
    std::optional<crypto::public_key> key = std::nullopt;

    friend bool operator==(const peer_info&, const peer_info&) = default;
};

/// What a requester says about itself; its PeerId is the one its connection proved.
struct sender_info {
    /// Where the sender serves (without a PeerId); nullopt in client mode (serves nothing).
    std::optional<net::peer_address> listen;

    friend bool operator==(const sender_info&, const sender_info&) = default;
};

struct ping_request {
    sender_info from;
    friend bool operator==(const ping_request&, const ping_request&) = default;
};

struct ping_response {
    friend bool operator==(const ping_response&, const ping_response&) = default;
};

/// One record to store; `in_cache` marks a copy cached on a node that is not a replica.
struct store_item {
    record item;
    bool in_cache = false;
    friend bool operator==(const store_item&, const store_item&) = default;
};

struct store_request {
    sender_info from;
    std::vector<store_item> items;
    friend bool operator==(const store_request&, const store_request&) = default;
};

/// One status per item of the request, in the same order.
struct store_response {
    std::vector<store_status> statuses;
    friend bool operator==(const store_response&, const store_response&) = default;
};

/// Asks for up to `max_peers` nearest peers of each of `keys`, and their values when
/// `want_values`; the receiver also stores `items`, as a store_request would (after reading
/// the values it answers).
struct find_request {
    sender_info from;
    std::vector<dht::id> keys;
    std::uint32_t max_peers = 20;
    std::vector<store_item> items = {};
    bool want_values = true;
    friend bool operator==(const find_request&, const find_request&) = default;
};

/// What a node knows about one key: its entry if it holds one, and the nearest peers.
struct find_result {
    std::optional<key_entry> entry;
    std::vector<peer_info> nearest;
    friend bool operator==(const find_result&, const find_result&) = default;
};

/// One result per key of the request, in the same order, and one status per item.
struct find_response {
    std::vector<find_result> results;
    std::vector<store_status> statuses = {};
    friend bool operator==(const find_response&, const find_response&) = default;
};

/// The type byte of each message; part of the wire format.
enum class message_type : std::uint8_t {
    ping_request = 1,
    ping_response = 2,
    store_request = 3,
    store_response = 4,
    find_request = 5,
    find_response = 6,
};

inline constexpr std::uint8_t message_version = 3;

namespace detail {

// Smallest encodings, used to bound counts by the bytes that remain.
inline constexpr std::size_t min_store_item_size = 4 + 1 + 4 + 8 + 4 + 1;
inline constexpr std::size_t min_stored_value_size = 4 + 8 + 4;
inline constexpr std::size_t min_subkey_entry_size = 4 + min_stored_value_size;
inline constexpr std::size_t min_find_result_size = 1 + 4;
inline constexpr std::size_t min_address_size = 1 + 1 + 1 + 2 + 1;
inline constexpr std::size_t min_peer_info_size = 1 + crypto::peer_id::size + min_address_size;

[[noreturn]] inline void refuse_encoding(const char* what) {
    throw std::system_error(errc::invalid_argument, std::string("hivemesh::dht::encode: ") + what);
}

inline void check_size(std::size_t size, std::size_t max, const char* what) {
    if (size > max) refuse_encoding(what);
}

inline void write_header(binary_writer& w, message_type type) {
    w.write(message_version);
    w.write(static_cast<std::uint8_t>(type));
}

inline void write_time(binary_writer& w, time_point t) {
    w.write(static_cast<std::int64_t>(t.time_since_epoch().count()));
}

inline void write_sized(binary_writer& w, byte_view bytes, std::size_t max, const char* what) {
    check_size(bytes.size(), max, what);
    w.write_sized_bytes(bytes);
}

inline void write_count(binary_writer& w, std::size_t count, std::size_t max, const char* what) {
    check_size(count, max, what);
    check_size(count, std::numeric_limits<std::uint32_t>::max(), what);
    w.write(static_cast<std::uint32_t>(count));
}

inline void write_sender(binary_writer& w, const sender_info& from) {
    w.write_flag(from.listen.has_value());
    if (from.listen) from.listen->write_without_peer(w);
}

inline void write_stored_value(binary_writer& w, const stored_value& v,
                               const message_limits& limits) {
    write_sized(w, v.value, limits.max_value_size, "value too large");
    write_time(w, v.expiration);
    write_sized(w, v.signature, limits.max_signature_size, "signature too large");
}

inline void write_store_item(binary_writer& w, const store_item& item,
                             const message_limits& limits) {
    const record& r = item.item;
    write_sized(w, r.key, limits.max_key_size, "key too large");
    w.write_flag(r.subkey.has_value());
    if (r.subkey) write_sized(w, *r.subkey, limits.max_subkey_size, "subkey too large");
    write_sized(w, r.value, limits.max_value_size, "value too large");
    write_time(w, r.expiration);
    write_sized(w, r.signature, limits.max_signature_size, "signature too large");
    w.write_flag(item.in_cache);
}

inline void write_store_items(binary_writer& w, const std::vector<store_item>& items,
                              const message_limits& limits) {
    write_count(w, items.size(), limits.max_items, "too many items");
    for (const auto& item : items)
        write_store_item(w, item, limits);
}

inline void write_statuses(binary_writer& w, const std::vector<store_status>& statuses,
                           const message_limits& limits) {
    write_count(w, statuses.size(), limits.max_items, "too many statuses");
    for (const auto status : statuses) {
        const auto byte = static_cast<std::uint8_t>(status);
        if (byte > max_store_status) refuse_encoding("unknown store_status");
        w.write(byte);
    }
}

inline void write_key_entry(binary_writer& w, const key_entry& entry,
                            const message_limits& limits) {
    if (entry.plain && !entry.dictionary.empty())
        refuse_encoding("key_entry has both a plain value and a dictionary");
    write_sized(w, entry.key, limits.max_key_size, "key too large");
    w.write_flag(entry.plain.has_value());
    if (entry.plain) write_stored_value(w, *entry.plain, limits);
    write_count(w, entry.dictionary.size(), limits.max_subkeys, "too many subkeys");
    for (const auto& [subkey, value] : entry.dictionary) { // std::map order: canonical
        write_sized(w, subkey, limits.max_subkey_size, "subkey too large");
        write_stored_value(w, value, limits);
    }
}

inline void write_find_result(binary_writer& w, const find_result& result,
                              const message_limits& limits) {
    w.write_flag(result.entry.has_value());
    if (result.entry) write_key_entry(w, *result.entry, limits);
    write_count(w, result.nearest.size(), limits.max_peers, "too many peers");
    for (const auto& p : result.nearest) {
        if (p.key && !(p.key->id() == p.peer))
            refuse_encoding("a key that does not prove its peer");
        w.write_flag(p.key.has_value());
        w.write_bytes(p.key ? p.key->view() : p.peer.view());
        p.address.write_without_peer(w);
    }
}

inline time_point read_time(binary_reader& r) noexcept {
    return time_point{duration{r.read<std::int64_t>()}};
}

inline void read_sized(binary_reader& r, std::size_t max, byte_buffer& out) {
    const byte_view bytes = r.read_sized_bytes(max);
    out.assign(bytes.begin(), bytes.end());
}

/// A u32 count, at most `max`, of elements of at least `min_element_size` bytes each.
inline std::size_t read_count(binary_reader& r, std::size_t min_element_size,
                              std::size_t max) noexcept {
    const auto count = r.read<std::uint32_t>();
    if (!r.check_count(count, min_element_size, max)) return 0;
    return count;
}

inline void read_sender(binary_reader& r, sender_info& out) {
    if (r.read_flag() && r.ok()) out.listen = net::peer_address::read_without_peer(r);
}

inline void read_stored_value(binary_reader& r, const message_limits& limits, stored_value& out) {
    read_sized(r, limits.max_value_size, out.value);
    out.expiration = read_time(r);
    read_sized(r, limits.max_signature_size, out.signature);
}

inline void read_store_item(binary_reader& r, const message_limits& limits, store_item& out) {
    record& rec = out.item;
    read_sized(r, limits.max_key_size, rec.key);
    if (r.read_flag() && r.ok()) {
        rec.subkey.emplace();
        read_sized(r, limits.max_subkey_size, *rec.subkey);
    }
    read_sized(r, limits.max_value_size, rec.value);
    rec.expiration = read_time(r);
    read_sized(r, limits.max_signature_size, rec.signature);
    out.in_cache = r.read_flag();
}

inline void read_store_items(binary_reader& r, const message_limits& limits,
                             std::vector<store_item>& out) {
    const auto count = read_count(r, min_store_item_size, limits.max_items);
    out.reserve(count);
    for (std::size_t i = 0; i < count && r.ok(); ++i)
        read_store_item(r, limits, out.emplace_back());
}

inline void read_statuses(binary_reader& r, const message_limits& limits,
                          std::vector<store_status>& out) {
    const auto count = read_count(r, 1, limits.max_items);
    out.reserve(count);
    for (std::size_t i = 0; i < count && r.ok(); ++i) {
        const auto byte = r.read<std::uint8_t>();
        if (byte > max_store_status) r.fail(errc::corrupt_data);
        out.push_back(static_cast<store_status>(byte));
    }
}

inline void read_key_entry(binary_reader& r, const message_limits& limits, key_entry& out) {
    read_sized(r, limits.max_key_size, out.key);
    if (r.read_flag() && r.ok()) {
        out.plain.emplace();
        read_stored_value(r, limits, *out.plain);
    }
    const std::size_t count = read_count(r, min_subkey_entry_size, limits.max_subkeys);
    if (out.plain && count != 0) {
        r.fail(errc::corrupt_data); // a key holds a plain value or a dictionary, never both
        return;
    }
    for (std::size_t i = 0; i < count && r.ok(); ++i) {
        const byte_view subkey = r.read_sized_bytes(limits.max_subkey_size);
        stored_value value;
        read_stored_value(r, limits, value);
        if (!r.ok()) return;
        if (!out.dictionary.empty()) {
            const auto& last = std::prev(out.dictionary.end())->first;
            if (!subkey_less{}(last, subkey)) {
                r.fail(errc::corrupt_data); // unsorted or duplicate subkey
                return;
            }
        }
        out.dictionary.emplace_hint(out.dictionary.end(), to_buffer(subkey), std::move(value));
    }
}

inline void read_find_result(binary_reader& r, const message_limits& limits, find_result& out) {
    if (r.read_flag() && r.ok()) {
        out.entry.emplace();
        read_key_entry(r, limits, *out.entry);
    }
    const std::size_t count = read_count(r, min_peer_info_size, limits.max_peers);
    out.nearest.reserve(count);
    for (std::size_t i = 0; i < count && r.ok(); ++i) {
        const bool has_key = r.read_flag();
        const byte_view peer = r.read_bytes(crypto::peer_id::size);
        if (!r.ok()) return;
        crypto::peer_id::bytes_type bytes;
        std::copy(peer.begin(), peer.end(), bytes.begin());
        net::peer_address address = net::peer_address::read_without_peer(r);
        if (!r.ok()) return;
        if (has_key) {
            const crypto::public_key key(bytes);
            out.nearest.push_back({key.id(), std::move(address), key});
        } else {
            out.nearest.push_back({crypto::peer_id(bytes), std::move(address)});
        }
    }
}

template <class Body>
byte_buffer encode_message(message_type type, Body&& body) {
    byte_buffer out;
    binary_writer w(out);
    write_header(w, type);
    body(w);
    return out;
}

/// Checks the header, parses the body into a fresh message and moves it to `out` only if
/// the whole input was valid and consumed.
template <class Message, class Body>
std::error_code decode_message(byte_view bytes, message_type type, Message& out,
                               Body&& body) noexcept {
    try {
        binary_reader r(bytes);
        const auto version = r.read<std::uint8_t>();
        if (!r.ok()) return r.error();
        if (version != message_version) return errc::unsupported_version;
        const auto type_byte = r.read<std::uint8_t>();
        if (!r.ok()) return r.error();
        if (type_byte != static_cast<std::uint8_t>(type)) return errc::protocol_violation;
        Message message;
        body(r, message);
        if (const auto ec = r.finish()) return ec;
        out = std::move(message);
        return {};
    } catch (const std::bad_alloc&) {
        // Allocations are bounded by the input, so this means the process is out of memory.
        return std::make_error_code(std::errc::not_enough_memory);
    }
}

} // namespace detail

// Encoders: throw std::system_error(errc::invalid_argument) if the message exceeds
// `limits` (a peer would refuse it), an address is invalid or carries a PeerId, a status
// is above max_store_status, or a key_entry has both a plain value and a dictionary.
//
// Decoders: never throw; on success `out` holds the message, on failure it is untouched.
// Errors: truncated_input, length_limit_exceeded (a length or count over `limits`),
// corrupt_data (bad flag or status byte, non-canonical field, plain value and
// dictionary, unsorted or duplicate subkeys, invalid address), trailing_data,
// unsupported_version, protocol_violation (another message type), and
// std::errc::not_enough_memory if an allocation the input justifies still fails.

/// Encodes a ping request: the sender only.
inline byte_buffer encode(const ping_request& m, const message_limits& = {}) {
    return detail::encode_message(message_type::ping_request,
                                  [&](binary_writer& w) { detail::write_sender(w, m.from); });
}

/// Decodes a ping request (errors above).
inline std::error_code decode(byte_view bytes, ping_request& out,
                              const message_limits& = {}) noexcept {
    return detail::decode_message(
        bytes, message_type::ping_request, out,
        [](binary_reader& r, ping_request& m) { detail::read_sender(r, m.from); });
}

/// Encodes a ping response: the header only.
inline byte_buffer encode(const ping_response&, const message_limits& = {}) {
    return detail::encode_message(message_type::ping_response, [](binary_writer&) {});
}

/// Decodes a ping response (errors above).
inline std::error_code decode(byte_view bytes, ping_response& out,
                              const message_limits& = {}) noexcept {
    return detail::decode_message(bytes, message_type::ping_response, out,
                                  [](binary_reader&, ping_response&) {});
}

/// Encodes a batch of records to store.
inline byte_buffer encode(const store_request& m, const message_limits& limits = {}) {
    return detail::encode_message(message_type::store_request, [&](binary_writer& w) {
        detail::write_sender(w, m.from);
        detail::write_store_items(w, m.items, limits);
    });
}

/// Decodes a store request (errors above).
inline std::error_code decode(byte_view bytes, store_request& out,
                              const message_limits& limits = {}) noexcept {
    return detail::decode_message(bytes, message_type::store_request, out,
                                  [&](binary_reader& r, store_request& m) {
                                      detail::read_sender(r, m.from);
                                      detail::read_store_items(r, limits, m.items);
                                  });
}

/// Encodes the per-item outcomes of a store.
inline byte_buffer encode(const store_response& m, const message_limits& limits = {}) {
    return detail::encode_message(message_type::store_response, [&](binary_writer& w) {
        detail::write_statuses(w, m.statuses, limits);
    });
}

/// Decodes a store response (errors above).
inline std::error_code decode(byte_view bytes, store_response& out,
                              const message_limits& limits = {}) noexcept {
    return detail::decode_message(
        bytes, message_type::store_response, out,
        [&](binary_reader& r, store_response& m) { detail::read_statuses(r, limits, m.statuses); });
}

/// Encodes a batch of lookups, with the records they carry.
inline byte_buffer encode(const find_request& m, const message_limits& limits = {}) {
    return detail::encode_message(message_type::find_request, [&](binary_writer& w) {
        detail::write_sender(w, m.from);
        w.write_flag(m.want_values);
        detail::check_size(m.max_peers, limits.max_peers, "max_peers over the limit");
        w.write(m.max_peers);
        detail::write_count(w, m.keys.size(), limits.max_items, "too many keys");
        for (const auto& key : m.keys)
            w.write_bytes(key.view());
        detail::write_store_items(w, m.items, limits);
    });
}

/// Decodes a find request (errors above; max_peers over the limit is
/// length_limit_exceeded).
inline std::error_code decode(byte_view bytes, find_request& out,
                              const message_limits& limits = {}) noexcept {
    return detail::decode_message(
        bytes, message_type::find_request, out, [&](binary_reader& r, find_request& m) {
            detail::read_sender(r, m.from);
            m.want_values = r.read_flag();
            m.max_peers = r.read<std::uint32_t>();
            if (r.ok() && m.max_peers > limits.max_peers) r.fail(errc::length_limit_exceeded);
            const auto count = detail::read_count(r, id::size, limits.max_items);
            m.keys.reserve(count);
            for (std::size_t i = 0; i < count; ++i) {
                const auto key = id::from_bytes(r.read_bytes(id::size));
                if (!key) return; // cannot happen: the count was checked against the input
                m.keys.push_back(*key);
            }
            detail::read_store_items(r, limits, m.items);
        });
}

/// Encodes the per-key results of a find.
inline byte_buffer encode(const find_response& m, const message_limits& limits = {}) {
    return detail::encode_message(message_type::find_response, [&](binary_writer& w) {
        detail::write_count(w, m.results.size(), limits.max_items, "too many results");
        for (const auto& result : m.results)
            detail::write_find_result(w, result, limits);
        detail::write_statuses(w, m.statuses, limits);
    });
}

/// Decodes a find response (errors above).
inline std::error_code decode(byte_view bytes, find_response& out,
                              const message_limits& limits = {}) noexcept {
    return detail::decode_message(
        bytes, message_type::find_response, out, [&](binary_reader& r, find_response& m) {
            const auto count =
                detail::read_count(r, detail::min_find_result_size, limits.max_items);
            m.results.reserve(count);
            for (std::size_t i = 0; i < count && r.ok(); ++i)
                detail::read_find_result(r, limits, m.results.emplace_back());
            detail::read_statuses(r, limits, m.statuses);
        });
}

} // namespace hivemesh::dht
