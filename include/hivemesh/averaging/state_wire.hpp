// State sharing's data and wire formats: the state a donor shares, the messages of the
// "<prefix>.state" call, the chunking of a state and its checking on arrival, and the donor
// records under "<prefix>_state_donors". See state_sharing.hpp for the protocol.
#pragma once

#include "hivemesh/compression/compress.hpp"
#include "hivemesh/core/binary.hpp"
#include "hivemesh/core/bytes.hpp"
#include "hivemesh/core/clock.hpp"
#include "hivemesh/core/error.hpp"
#include "hivemesh/core/log.hpp"
#include "hivemesh/crypto/peer_id.hpp"
#include "hivemesh/dht/messages.hpp"
#include "hivemesh/dht/validator.hpp"
#include "hivemesh/net/address.hpp"

#include <sodium.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace hivemesh::averaging {

// ---- the state -----------------------------------------------------------------------------

/// What a donor shares and a newcomer receives: opaque user bytes (e.g. epoch and step, as
/// the user encodes them) and float32 tensors (parameters, then optimizer state, in an order
/// both sides agree on). A newcomer copies the tensors into its own with
/// tensor::unflatten_from or tensor::copy_from.
struct state_snapshot {
    byte_buffer metadata;
    std::vector<std::vector<float>> tensors;
};

/// True if both states have equal metadata and tensors of equal sizes with identical float32
/// bit patterns (unlike ==, NaN payloads and the sign of zero count).
inline bool bitwise_equal(const state_snapshot& a, const state_snapshot& b) noexcept {
    if (a.metadata != b.metadata || a.tensors.size() != b.tensors.size()) return false;
    for (std::size_t i = 0; i < a.tensors.size(); ++i) {
        const auto& x = a.tensors[i];
        const auto& y = b.tensors[i];
        if (x.size() != y.size()) return false;
        if (!x.empty() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) != 0)
            return false;
    }
    return true;
}

/// The DHT key donors advertise under: "<prefix>_state_donors".
inline std::string donors_key(std::string_view prefix) {
    return std::string(prefix) + "_state_donors";
}
/// The streaming RPC method a donor serves: "<prefix>.state".
inline std::string state_method(std::string_view prefix) {
    return std::string(prefix) + ".state";
}

// ---- wire messages -------------------------------------------------------------------------

inline constexpr std::uint8_t state_wire_version = 1;
inline constexpr std::size_t chunk_hash_size = 32; // BLAKE2b-256
static_assert(chunk_hash_size >= crypto_generichash_BYTES_MIN &&
              chunk_hash_size <= crypto_generichash_BYTES_MAX);
using chunk_hash = std::array<std::byte, chunk_hash_size>;

/// Decoder limits for messages from untrusted donors; every count is checked against them
/// (and against the bytes that remain) before anything is allocated. A newcomer that knows
/// its model should lower max_total_elements to its size: the tensors are allocated from
/// the sizes the header announces.
struct state_limits {
    std::size_t max_tensors = 1 << 16;
    std::uint64_t max_total_elements = std::uint64_t{1} << 32; ///< 16 GiB of float32
    std::size_t max_metadata_bytes = 1 << 20;
    /// Payload bytes of one chunk (its compressed form, compression header included).
    std::size_t max_chunk_bytes = 16u << 20;
    std::size_t max_chunks = 1 << 18;
};

/// The newcomer's only message.
/// Wire: u8 version (1).
struct state_request {
    friend bool operator==(const state_request&, const state_request&) = default;
};

/// The donor's first message: everything but the tensor values.
/// Wire: u8 version (1) | u8 codec (compression::kind) | u32 chunk_elements (>= 1) |
/// u32 metadata length | metadata | u32 tensor count | u64 element count per tensor |
/// u64 chunk count (= ceil(total elements / chunk_elements)) | 32-byte hash per chunk.
struct state_header {
    compression::kind codec = compression::kind::none;
    /// Elements per chunk of the concatenated tensors; the last chunk may be shorter.
    std::uint32_t chunk_elements = 1;
    byte_buffer metadata;
    std::vector<std::uint64_t> tensor_sizes;
    /// BLAKE2b-256 (unkeyed) of each chunk's payload, in chunk order.
    std::vector<chunk_hash> chunk_hashes;

    std::uint64_t total_elements() const noexcept {
        std::uint64_t total = 0;
        for (const auto n : tensor_sizes)
            total += n;
        return total;
    }
    friend bool operator==(const state_header&, const state_header&) = default;
};

/// One chunk as decoded: it views the message it was decoded from.
/// Wire: u64 index | u32 payload length | payload (the chunk's elements compressed with the
/// header's codec: a self-describing hivemesh::compression buffer).
struct state_chunk {
    std::uint64_t index = 0;
    byte_view payload;
};

/// A donor's advertisement, the value of its subkey in the DHT (the subkey is its owner
/// marker, from which readers derive its PeerId).
/// Wire: u8 version (1) | f64 priority (finite) | listen address (net::peer_address binary
/// form, canonical, without PeerId).
struct donor_record {
    /// Higher is preferred, e.g. the donor's epoch.
    double priority = 0;
    net::peer_address address;
    friend bool operator==(const donor_record&, const donor_record&) = default;
};

/// Number of chunks of `chunk_elements` elements covering `total` elements.
constexpr std::uint64_t chunk_count_for(std::uint64_t total,
                                        std::uint32_t chunk_elements) noexcept {
    if (chunk_elements == 0) return 0;
    return total / chunk_elements + (total % chunk_elements != 0 ? 1 : 0);
}

/// Number of elements in chunk `index` (the last one may be shorter).
constexpr std::uint64_t chunk_length(std::uint64_t total, std::uint32_t chunk_elements,
                                     std::uint64_t index) noexcept {
    const std::uint64_t begin = index * chunk_elements;
    return begin >= total ? 0 : std::min<std::uint64_t>(chunk_elements, total - begin);
}

/// BLAKE2b-256 of a chunk payload.
inline chunk_hash hash_chunk(byte_view payload) {
    crypto::ensure_sodium_initialized();
    chunk_hash out;
    crypto_generichash(reinterpret_cast<unsigned char*>(out.data()), out.size(),
                       reinterpret_cast<const unsigned char*>(payload.data()), payload.size(),
                       nullptr, 0);
    return out;
}

namespace detail {

[[noreturn]] inline void refuse_state_encoding(const char* what) {
    throw std::system_error(errc::invalid_argument,
                            std::string("hivemesh::averaging::encode: ") + what);
}

inline constexpr std::size_t chunk_message_overhead = 8 + 4;

inline void check_version(binary_reader& r) {
    const auto version = r.read<std::uint8_t>();
    if (r.ok() && version != state_wire_version) r.fail(errc::unsupported_version);
}

} // namespace detail

inline byte_buffer encode(const state_request&) {
    return byte_buffer{std::byte{state_wire_version}};
}

/// Throws std::system_error(errc::invalid_argument) for a header no decoder would accept:
/// unknown codec, chunk_elements 0, a chunk count that does not match the sizes, more than
/// 2^32-1 tensors or metadata bytes.
inline byte_buffer encode(const state_header& h) {
    if (!compression::is_known(h.codec)) detail::refuse_state_encoding("unknown codec");
    if (h.chunk_elements == 0) detail::refuse_state_encoding("chunk_elements is 0");
    if (h.tensor_sizes.size() > std::numeric_limits<std::uint32_t>::max())
        detail::refuse_state_encoding("too many tensors");
    if (h.chunk_hashes.size() != chunk_count_for(h.total_elements(), h.chunk_elements))
        detail::refuse_state_encoding("chunk count does not match the tensor sizes");
    byte_buffer out;
    out.reserve(2 + 4 + 4 + h.metadata.size() + 4 + 8 * h.tensor_sizes.size() + 8 +
                chunk_hash_size * h.chunk_hashes.size());
    binary_writer w(out);
    w.write(state_wire_version);
    w.write(static_cast<std::uint8_t>(h.codec));
    w.write(h.chunk_elements);
    w.write_sized_bytes(h.metadata); // throws length_limit_exceeded over 4 GiB
    w.write(static_cast<std::uint32_t>(h.tensor_sizes.size()));
    for (const auto n : h.tensor_sizes)
        w.write(n);
    w.write(static_cast<std::uint64_t>(h.chunk_hashes.size()));
    for (const auto& hash : h.chunk_hashes)
        w.write_bytes(hash);
    return out;
}

inline byte_buffer encode(const state_chunk& c) {
    if (c.payload.size() > std::numeric_limits<std::uint32_t>::max())
        detail::refuse_state_encoding("chunk payload over 4 GiB");
    byte_buffer out;
    out.reserve(detail::chunk_message_overhead + c.payload.size());
    binary_writer w(out);
    w.write(c.index);
    w.write_sized_bytes(c.payload);
    return out;
}

/// Throws std::system_error(errc::invalid_argument) for a non-finite priority, an address
/// that carries a PeerId or is invalid.
inline byte_buffer encode(const donor_record& d) {
    if (!std::isfinite(d.priority)) detail::refuse_state_encoding("priority is not finite");
    byte_buffer out;
    binary_writer w(out);
    w.write(state_wire_version);
    w.write_f64(d.priority);
    d.address.write_without_peer(w);
    return out;
}

/// Decoders: on error `out` is unspecified. Errors: truncated_input, trailing_data,
/// unsupported_version, length_limit_exceeded (a count over its limit, found before any
/// allocation), corrupt_data (inconsistent fields: unknown codec, zero chunk size, a chunk
/// count that does not match the sizes, a non-finite priority, a non-canonical address).
inline std::error_code decode(byte_view message, state_request&) {
    binary_reader r(message);
    detail::check_version(r);
    return r.finish();
}

inline std::error_code decode(byte_view message, state_header& out,
                              const state_limits& limits = {}) {
    binary_reader r(message);
    out = {};
    detail::check_version(r);
    const auto codec = r.read<std::uint8_t>();
    out.chunk_elements = r.read<std::uint32_t>();
    if (!r.ok()) return r.error();
    out.codec = static_cast<compression::kind>(codec);
    if (!compression::is_known(out.codec) || out.chunk_elements == 0) {
        r.fail(errc::corrupt_data);
        return r.error();
    }
    // A full chunk must fit the payload limit.
    if (compression::compressed_size(out.codec, out.chunk_elements) > limits.max_chunk_bytes) {
        r.fail(errc::length_limit_exceeded);
        return r.error();
    }
    const byte_view metadata = r.read_sized_bytes(limits.max_metadata_bytes);
    out.metadata.assign(metadata.begin(), metadata.end());
    const auto tensor_count = r.read<std::uint32_t>();
    if (!r.check_count(tensor_count, 8, limits.max_tensors)) return r.error();
    out.tensor_sizes.resize(tensor_count);
    std::uint64_t total = 0;
    for (auto& n : out.tensor_sizes) {
        n = r.read<std::uint64_t>();
        if (n > limits.max_total_elements - total) { // no overflow: total <= max
            r.fail(errc::length_limit_exceeded);
            return r.error();
        }
        total += n;
    }
    const auto chunk_count = r.read<std::uint64_t>();
    if (!r.check_count(chunk_count, chunk_hash_size, limits.max_chunks)) return r.error();
    if (chunk_count != chunk_count_for(total, out.chunk_elements)) {
        r.fail(errc::corrupt_data);
        return r.error();
    }
    out.chunk_hashes.resize(static_cast<std::size_t>(chunk_count));
    for (auto& hash : out.chunk_hashes) {
        const byte_view bytes = r.read_bytes(chunk_hash_size);
        if (!r.ok()) break;
        std::copy(bytes.begin(), bytes.end(), hash.begin());
    }
    return r.finish();
}

inline std::error_code decode(byte_view message, state_chunk& out,
                              const state_limits& limits = {}) {
    binary_reader r(message);
    out.index = r.read<std::uint64_t>();
    if (r.ok() && out.index >= limits.max_chunks) r.fail(errc::length_limit_exceeded);
    out.payload = r.read_sized_bytes(limits.max_chunk_bytes);
    return r.finish();
}

inline std::error_code decode(byte_view message, donor_record& out) {
    binary_reader r(message);
    detail::check_version(r);
    out.priority = r.read_f64();
    if (r.ok() && !std::isfinite(out.priority)) r.fail(errc::corrupt_data);
    if (r.ok()) out.address = net::peer_address::read_without_peer(r);
    return r.finish();
}

// ---- chunking ------------------------------------------------------------------------------

namespace detail {

/// Reads the concatenated tensors chunk after chunk: a view into a tensor when the chunk
/// lies inside one, else the elements gathered into a scratch buffer of one chunk.
class chunk_source {
public:
    explicit chunk_source(const std::vector<std::vector<float>>& tensors) noexcept
        : tensors_(&tensors) {}

    /// The next `n` elements; the caller never asks for more than remain.
    std::span<const float> next(std::size_t n) {
        skip_exhausted();
        if (tensor_ < tensors_->size() && (*tensors_)[tensor_].size() - offset_ >= n) {
            const std::span<const float> view((*tensors_)[tensor_].data() + offset_, n);
            offset_ += n;
            return view;
        }
        scratch_.resize(n);
        std::size_t filled = 0;
        while (filled < n) {
            skip_exhausted();
            if (tensor_ == tensors_->size()) throw std::logic_error("chunk_source: past the end");
            const auto& t = (*tensors_)[tensor_];
            const std::size_t take = std::min(n - filled, t.size() - offset_);
            std::memcpy(scratch_.data() + filled, t.data() + offset_, take * sizeof(float));
            filled += take;
            offset_ += take;
        }
        return scratch_;
    }

private:
    void skip_exhausted() noexcept {
        while (tensor_ < tensors_->size() && offset_ == (*tensors_)[tensor_].size()) {
            ++tensor_;
            offset_ = 0;
        }
    }

    const std::vector<std::vector<float>>* tensors_;
    std::size_t tensor_ = 0;
    std::size_t offset_ = 0;
    std::vector<float> scratch_;
};

inline std::uint32_t chunk_elements_for(std::size_t chunk_size_bytes) noexcept {
    const std::size_t elements = std::max<std::size_t>(1, chunk_size_bytes / sizeof(float));
    return static_cast<std::uint32_t>(
        std::min<std::size_t>(elements, std::numeric_limits<std::uint32_t>::max()));
}

} // namespace detail

/// Appends chunk message `index` to `out`: `values` compressed with `codec`. On error (from
/// compression: invalid_argument, non_finite_input for a statistical codec, or
/// length_limit_exceeded for a payload over 4 GiB) `out` is unchanged.
inline std::error_code append_chunk_message(std::uint64_t index, compression::kind codec,
                                            std::span<const float> values, byte_buffer& out) {
    const std::size_t payload_size = compression::compressed_size(codec, values.size());
    if (payload_size > std::numeric_limits<std::uint32_t>::max())
        return errc::length_limit_exceeded;
    const std::size_t start = out.size();
    binary_writer w(out);
    w.write(index);
    w.write(static_cast<std::uint32_t>(payload_size));
    if (auto ec = compression::compress_into(codec, values, out)) {
        out.resize(start);
        return ec;
    }
    if (out.size() != start + detail::chunk_message_overhead + payload_size) {
        out.resize(start);
        return errc::size_mismatch; // compressed_size() and the codec disagree: a bug
    }
    return {};
}

/// The header describing `s` cut into chunks of `chunk_elements`, compressed with `codec`.
/// Compresses every chunk once to hash it, keeping one chunk in memory at a time.
/// Errors: invalid_argument (chunk_elements 0, unknown codec), non_finite_input.
inline std::error_code make_header(const state_snapshot& s, compression::kind codec,
                                   std::uint32_t chunk_elements, state_header& out) {
    if (chunk_elements == 0 || !compression::is_known(codec)) return errc::invalid_argument;
    out = {};
    out.codec = codec;
    out.chunk_elements = chunk_elements;
    out.metadata = s.metadata;
    out.tensor_sizes.reserve(s.tensors.size());
    for (const auto& t : s.tensors)
        out.tensor_sizes.push_back(t.size());
    const std::uint64_t total = out.total_elements();
    const std::uint64_t count = chunk_count_for(total, chunk_elements);
    out.chunk_hashes.reserve(static_cast<std::size_t>(count));
    detail::chunk_source source(s.tensors);
    byte_buffer message;
    for (std::uint64_t i = 0; i < count; ++i) {
        message.clear();
        const auto values =
            source.next(static_cast<std::size_t>(chunk_length(total, chunk_elements, i)));
        if (auto ec = append_chunk_message(i, codec, values, message)) return ec;
        out.chunk_hashes.push_back(
            hash_chunk(byte_view(message).subspan(detail::chunk_message_overhead)));
    }
    return {};
}

namespace detail {

/// The newcomer's side: checks chunks against the header as they arrive and writes them into
/// the tensors, each allocated when its first chunk arrives.
class state_assembler {
public:
    explicit state_assembler(state_header header)
        : header_(std::move(header))
        , total_(header_.total_elements()) {
        result_.metadata = std::move(header_.metadata);
        result_.tensors.resize(header_.tensor_sizes.size());
    }

    std::uint64_t next_index() const noexcept { return next_; }
    std::uint64_t chunk_count() const noexcept { return header_.chunk_hashes.size(); }
    bool complete() const noexcept { return next_ == chunk_count(); }

    /// protocol_violation for a chunk out of order or beyond the last; corrupt_data for a
    /// payload whose hash differs from the header's, or that does not decode to exactly the
    /// chunk's elements with the header's codec.
    std::error_code add(const state_chunk& chunk) {
        if (chunk.index != next_ || complete()) return errc::protocol_violation;
        if (hash_chunk(chunk.payload) != header_.chunk_hashes[next_]) return errc::corrupt_data;
        const auto length =
            static_cast<std::size_t>(chunk_length(total_, header_.chunk_elements, next_));
        compression::header h;
        if (compression::read_header(chunk.payload, h) || h.codec != header_.codec ||
            h.count != length)
            return errc::corrupt_data;
        const compression::limits lim{.max_elements = length};
        skip_exhausted();
        if (tensor_ < result_.tensors.size() && header_.tensor_sizes[tensor_] - offset_ >= length) {
            auto& t = allocate(tensor_);
            if (compression::decompress_into(chunk.payload,
                                             std::span<float>(t.data() + offset_, length), lim))
                return errc::corrupt_data;
            offset_ += length;
        } else {
            scratch_.resize(length);
            if (compression::decompress_into(chunk.payload, scratch_, lim))
                return errc::corrupt_data;
            std::size_t done = 0;
            while (done < length) {
                skip_exhausted();
                auto& t = allocate(tensor_);
                const std::size_t take =
                    std::min<std::size_t>(length - done, header_.tensor_sizes[tensor_] - offset_);
                std::memcpy(t.data() + offset_, scratch_.data() + done, take * sizeof(float));
                done += take;
                offset_ += take;
            }
        }
        ++next_;
        return {};
    }

    /// The state; call once, after complete().
    state_snapshot take() { return std::move(result_); }

private:
    void skip_exhausted() noexcept {
        while (tensor_ < result_.tensors.size() && offset_ == header_.tensor_sizes[tensor_]) {
            ++tensor_;
            offset_ = 0;
        }
    }
    std::vector<float>& allocate(std::size_t i) {
        auto& t = result_.tensors[i];
        if (t.size() != header_.tensor_sizes[i])
            t.resize(static_cast<std::size_t>(header_.tensor_sizes[i]));
        return t;
    }

    state_header header_;
    std::uint64_t total_;
    state_snapshot result_;
    std::uint64_t next_ = 0;
    std::size_t tensor_ = 0;
    std::uint64_t offset_ = 0;
    std::vector<float> scratch_;
};

} // namespace detail

// ---- donors --------------------------------------------------------------------------------

/// One donor as read from the DHT.
struct donor_info {
    crypto::peer_id id;
    double priority = 0;
    net::peer_address address;
    friend bool operator==(const donor_info&, const donor_info&) = default;
};

/// The donors in a `<prefix>_state_donors` entry, best first: priority descending, ties by
/// PeerId ascending. A donor's PeerId is that of the key its subkey's owner marker names.
/// Skipped: subkeys that are not exactly one owner marker, tombstones (empty values),
/// records that do not decode, and `exclude` (the caller itself). The signatures are the
/// DHT's to check (a dht::node keeps and returns only signed marker records).
inline std::vector<donor_info> parse_donors(const dht::key_entry& entry,
                                            const std::optional<crypto::peer_id>& exclude = {}) {
    std::vector<donor_info> out;
    for (const auto& [subkey, value] : entry.dictionary) {
        if (value.value.empty()) continue;
        const auto owner = dht::parse_owner_marker(subkey);
        if (!owner) continue;
        const crypto::peer_id id = owner->id();
        if (exclude && id == *exclude) continue;
        donor_record record;
        if (auto ec = decode(value.value, record)) {
            log::debug("averaging", "skipping a malformed donor record of ", id.short_string(),
                       ": ", ec.message());
            continue;
        }
        out.push_back({id, record.priority, std::move(record.address)});
    }
    std::sort(out.begin(), out.end(), [](const donor_info& a, const donor_info& b) {
        if (a.priority != b.priority) return a.priority > b.priority;
        return a.id < b.id;
    });
    return out;
}

} // namespace hivemesh::averaging
