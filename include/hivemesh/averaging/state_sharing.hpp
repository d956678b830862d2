// State sharing: peers that hold the training state (parameters, optimizer state and opaque
// metadata such as the epoch) advertise themselves as donors in the DHT, and a newcomer
// downloads the state from the best of them as a chunked, hash-verified stream, falling back
// to the next donor when a download fails.
//
// DHT: key "<prefix>_state_donors" is a dictionary; subkey = the donor's 32 PeerId bytes,
// value = a donor_record (priority, listen address). A donor refreshes its record while it
// serves; on stop it stores an empty value (a tombstone) with a later expiration, which
// readers skip, so it disappears at once instead of when its record would have expired.
//
// RPC: one streaming call "<prefix>.state". The newcomer sends a state_request and closes
// its side; the donor answers with a state_header (metadata, tensor sizes, chunk geometry
// and the BLAKE2b-256 hash of every chunk's payload), then every chunk in order. The
// newcomer checks each chunk against the header as it arrives (a mismatch is corrupt_data
// at once) and, once all have arrived, has verified the whole state. The wire formats are
// documented beside their encoders and in docs/architecture.md ("State sharing").
//
// Threading: as the RPC and DHT nodes: everything runs on their executor. The asynchronous
// API may be called from any thread; state_server's other members on the executor or while
// it does not run. The blocking load_state() must not be called on an io thread.
#pragma once

#include "hivemesh/averaging/launch.hpp"
#include "hivemesh/compression/compress.hpp"
#include "hivemesh/core/binary.hpp"
#include "hivemesh/core/bytes.hpp"
#include "hivemesh/core/clock.hpp"
#include "hivemesh/core/error.hpp"
#include "hivemesh/core/log.hpp"
#include "hivemesh/crypto/peer_id.hpp"
#include "hivemesh/dht/messages.hpp"
#include "hivemesh/dht/node.hpp"
#include "hivemesh/net/address.hpp"
#include "hivemesh/net/node.hpp"
#include "hivemesh/net/rpc_wire.hpp"

#include <asio/async_result.hpp>
#include <asio/bind_cancellation_slot.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/post.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>

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

using namespace std::chrono_literals;

// ---- the state -----------------------------------------------------------------------------

/// What a donor shares and a newcomer receives: opaque user bytes (e.g. epoch and step, as
/// the user encodes them) and float32 tensors (parameters, then optimizer state, in an order
/// both sides agree on). A newcomer copies the tensors into its own with
/// tensor::unflatten_from or tensor::copy_from.
struct state {
    byte_buffer metadata;
    std::vector<std::vector<float>> tensors;
};

/// True if both states have equal metadata and tensors of equal sizes with identical float32
/// bit patterns (unlike ==, NaN payloads and the sign of zero count).
inline bool bitwise_equal(const state& a, const state& b) noexcept {
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

/// A donor's advertisement, the value of its subkey in the DHT (the subkey is its PeerId).
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
    dht::detail::write_address(w, d.address);
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
    if (r.ok()) out.address = dht::detail::read_address(r);
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
inline std::error_code make_header(const state& s, compression::kind codec,
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
    state take() { return std::move(result_); }

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
    state result_;
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
/// PeerId ascending. Skipped: subkeys that are not 32 bytes, tombstones (empty values),
/// records that do not decode, and `exclude` (the caller itself).
inline std::vector<donor_info> parse_donors(const dht::key_entry& entry,
                                            const std::optional<crypto::peer_id>& exclude = {}) {
    std::vector<donor_info> out;
    for (const auto& [subkey, value] : entry.dictionary) {
        if (subkey.size() != crypto::peer_id::size || value.value.empty()) continue;
        crypto::peer_id::bytes_type bytes;
        std::copy(subkey.begin(), subkey.end(), bytes.begin());
        const crypto::peer_id id(bytes);
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

/// How a donor serves.
struct server_options {
    /// Codec of the chunk payloads; `none` keeps every bit. A lossy codec gives the newcomer
    /// the codec's approximation (and costs the donor two compressions per chunk: one to hash
    /// it for the header, one to send it). Statistical codecs refuse non-finite values.
    compression::kind codec = compression::kind::none;
    /// Uncompressed float32 bytes per chunk (rounded down to whole elements, at least one).
    /// A chunk and the header (32 bytes per chunk) each travel as one RPC message, so keep
    /// both under the multiplexer's max_message_size (16 MiB) and the newcomers' limits.
    std::size_t chunk_size_bytes = 1 << 20;
    /// Lifetime of the DHT advertisement; it is refreshed every refresh_period.
    duration advertisement_ttl = 60s;
    duration refresh_period = 20s;
    /// Uploads served at once; more are refused (errc::refused), so the newcomer tries the
    /// next donor. Each upload holds one state from the provider.
    std::size_t max_concurrent_uploads = 4;
};

/// Counters of one server.
struct server_statistics {
    std::uint64_t advertisements = 0;         ///< successful stores of our record
    std::uint64_t advertisement_failures = 0; ///< stores no replica accepted
    std::uint64_t uploads_started = 0;
    std::uint64_t uploads_completed = 0;
    std::uint64_t uploads_failed = 0;  ///< the newcomer left, the connection failed, stopped
    std::uint64_t uploads_refused = 0; ///< not serving, busy, or a malformed request
    std::uint64_t chunks_sent = 0;
    std::uint64_t bytes_sent = 0; ///< header and chunk messages
};

/// Serves this peer's state to newcomers: registers "<prefix>.state" on the RPC node and
/// advertises (priority, `announce`) in the DHT under "<prefix>_state_donors", refreshing the
/// record while serving. Uses (does not own) the RPC and DHT nodes, which must outlive it.
///
/// Each upload calls `provider` once on the executor and streams the state it returns chunk
/// by chunk (the multiplexer's send completes when a chunk is written, so at most about one
/// chunk is buffered besides the provider's state). Compressing and hashing the chunks run
/// on `compute` when given (e.g. a thread pool), else on the node's executor. The provider may
/// throw; the newcomer then sees remote_error (or the std::system_error's code).
template <class Transport>
class state_server {
public:
    using rpc_node = net::node<Transport>;
    using dht_node = dht::node<Transport>;
    using endpoint_type = typename Transport::endpoint_type;
    using timer_type = typename Transport::timer_type;
    using state_provider = std::function<state()>;

    /// Starts serving and advertising at once. Throws std::invalid_argument when
    /// "<prefix>.state" is not a valid method name, `priority` is not finite, or the options
    /// are out of range; std::system_error if `announce` has no valid address.
    state_server(rpc_node& rpc, dht_node& dht, std::string prefix, endpoint_type announce,
                 state_provider provider, double priority, server_options options = {},
                 std::optional<asio::any_io_executor> compute = std::nullopt)
        : state_(std::make_shared<shared>(rpc, dht)) {
        if (!net::is_valid_method(state_method(prefix)))
            throw std::invalid_argument("hivemesh::averaging::state_server: bad prefix \"" +
                                        prefix + "\"");
        if (!std::isfinite(priority))
            throw std::invalid_argument("hivemesh::averaging::state_server: priority not finite");
        if (!provider)
            throw std::invalid_argument("hivemesh::averaging::state_server: no state provider");
        if (options.max_concurrent_uploads == 0 || options.refresh_period <= duration::zero() ||
            options.advertisement_ttl <= duration::zero() || !compression::is_known(options.codec))
            throw std::invalid_argument("hivemesh::averaging::state_server: bad options");
        auto& st = *state_;
        st.prefix = std::move(prefix);
        const std::string key = donors_key(st.prefix);
        st.key = to_buffer(as_bytes(key));
        st.subkey = to_buffer(rpc.id().view());
        st.address = Transport::to_address(announce).without_peer();
        st.provider = std::move(provider);
        st.priority = priority;
        st.options = options;
        st.compute = std::move(compute);
        st.record = encode(donor_record{st.priority, st.address}); // validates the address
        rpc.add_stream_handler(state_method(st.prefix),
                               [weak = std::weak_ptr<shared>(state_)](
                                   const net::call_context&,
                                   net::call_stream& stream) -> asio::awaitable<std::error_code> {
                                   auto st = weak.lock();
                                   if (!st) co_return errc::not_a_donor;
                                   co_return co_await serve(std::move(st), stream);
                               });
        asio::co_spawn(st.executor, refresh_loop(state_), asio::detached);
    }
    state_server(const state_server&) = delete;
    state_server& operator=(const state_server&) = delete;
    /// Stops serving and withdraws the advertisement without waiting (see stop()).
    ~state_server() { stop(); }

    const std::string& prefix() const noexcept { return state_->prefix; }
    double priority() const noexcept { return state_->priority; }
    bool serving() const noexcept { return state_->serving; }
    const server_statistics& statistics() const noexcept { return state_->stats; }

    /// Changes the advertised priority from the next advertisement on (async_advertise()
    /// publishes it now). Throws std::invalid_argument if it is not finite.
    void set_priority(double priority) {
        if (!std::isfinite(priority))
            throw std::invalid_argument("hivemesh::averaging::state_server: priority not finite");
        state_->priority = priority;
        state_->record = encode(donor_record{priority, state_->address});
    }

    /// Stores the advertisement now (the server also does it every refresh_period).
    /// Completion: void(std::error_code): store_refused when no replica accepted it,
    /// not_a_donor after stop(), no_peers, cancelled (the token's cancellation slot).
    template <class Token>
    auto async_advertise(Token&& token) {
        return asio::async_initiate<Token, void(std::error_code)>(
            [st = state_](auto handler) {
                auto slot = asio::get_associated_cancellation_slot(handler);
                asio::co_spawn(
                    st->executor, advertise(st),
                    asio::bind_cancellation_slot(
                        slot, [handler = std::move(handler)](std::exception_ptr failure,
                                                             std::error_code ec) mutable {
                            std::move(handler)(failure ? make_error_code(errc::cancelled) : ec);
                        }));
            },
            token);
    }

    /// Stops serving: newcomers (also those mid-download, at their next chunk) get
    /// not_a_donor, the refresh stops, and the advertisement is withdrawn by storing an empty
    /// value (a tombstone readers skip) that expires 1 s after the last advertisement would
    /// have. Completion: void(std::error_code), the tombstone store's error (store_refused
    /// if no replica took it: the record then simply expires). Idempotent: a later call
    /// completes at once with no error.
    template <class Token>
    auto async_stop(Token&& token) {
        return asio::async_initiate<Token, void(std::error_code)>(
            [st = state_](auto handler) {
                const bool was_serving = std::exchange(st->serving, false);
                asio::post(st->executor, [st] { st->timer.cancel(); });
                if (!was_serving || st->last_expiration == time_point{}) {
                    asio::post(st->executor, [handler = std::move(handler)]() mutable {
                        std::move(handler)(std::error_code{});
                    });
                    return;
                }
                // Started here, not on the executor: the DHT node must still exist.
                dht::record tombstone{st->key, st->subkey, {}, st->last_expiration + 1s, {}};
                st->dht->async_store(
                    std::move(tombstone),
                    [handler = std::move(handler)](std::error_code ec, dht::store_outcome) mutable {
                        std::move(handler)(ec);
                    });
            },
            token);
    }

    /// async_stop() without waiting for the tombstone.
    void stop() { async_stop(asio::detached); }

private:
    struct shared {
        shared(rpc_node& r, dht_node& d)
            : rpc(&r)
            , dht(&d)
            , executor(r.get_executor())
            , timer(executor) {}

        rpc_node* rpc;
        dht_node* dht;
        asio::any_io_executor executor;
        std::string prefix;
        byte_buffer key;
        byte_buffer subkey;
        net::peer_address address;
        state_provider provider;
        double priority = 0;
        byte_buffer record;
        server_options options;
        std::optional<asio::any_io_executor> compute;
        timer_type timer;
        time_point last_expiration{};
        bool serving = true;
        std::size_t active_uploads = 0;
        server_statistics stats;
    };
    using shared_ptr_type = std::shared_ptr<shared>;

    static asio::awaitable<std::error_code> advertise(shared_ptr_type st) {
        if (!st->serving) co_return errc::not_a_donor;
        // Strictly later than any earlier advertisement, or the replicas refuse it.
        const time_point expiration = std::max(net::detail::transport_now<Transport>(st->executor) +
                                                   st->options.advertisement_ttl,
                                               st->last_expiration + duration(1));
        st->last_expiration = expiration;
        dht::record r{st->key, st->subkey, st->record, expiration, {}};
        auto [ec, outcome] = co_await st->dht->async_store(
            std::move(r), asio::experimental::as_tuple(asio::use_awaitable));
        // Outdated: a later advertisement of ours (started meanwhile) got there first.
        if (ec == errc::store_refused && outcome.refusal == dht::store_status::outdated) ec = {};
        if (ec) {
            ++st->stats.advertisement_failures;
            log::debug("averaging", "state donor advertisement failed: ", ec.message());
        } else {
            ++st->stats.advertisements;
        }
        co_return ec;
    }

    static asio::awaitable<void> refresh_loop(shared_ptr_type st) {
        while (st->serving) {
            co_await advertise(st);
            if (!st->serving) break;
            st->timer.expires_after(st->options.refresh_period);
            co_await st->timer.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
        }
    }

    struct upload_slot {
        explicit upload_slot(shared* s) noexcept
            : st(s) {
            ++st->active_uploads;
        }
        upload_slot(const upload_slot&) = delete;
        upload_slot& operator=(const upload_slot&) = delete;
        ~upload_slot() { --st->active_uploads; }
        shared* st;
    };

    static asio::awaitable<std::error_code> serve(shared_ptr_type st, net::call_stream& stream) {
        if (!st->serving || st->active_uploads >= st->options.max_concurrent_uploads) {
            ++st->stats.uploads_refused;
            co_return st->serving ? errc::refused : errc::not_a_donor;
        }
        const upload_slot slot(st.get());
        byte_buffer raw;
        if (auto ec = co_await stream.read(raw)) {
            ++st->stats.uploads_refused;
            if (ec == asio::error::eof) co_return errc::protocol_violation;
            co_return ec;
        }
        state_request request;
        if (auto ec = decode(raw, request)) {
            ++st->stats.uploads_refused;
            co_return ec == errc::unsupported_version ? ec
                                                      : make_error_code(errc::protocol_violation);
        }
        ++st->stats.uploads_started;
        const std::error_code ec = co_await upload(st, stream);
        if (ec)
            ++st->stats.uploads_failed;
        else
            ++st->stats.uploads_completed;
        co_return ec;
    }

    static asio::awaitable<std::error_code> upload(shared_ptr_type st, net::call_stream& stream) {
        const state snapshot = st->provider();
        const compression::kind codec = st->options.codec;
        const std::uint32_t chunk_elements =
            detail::chunk_elements_for(st->options.chunk_size_bytes);
        state_header header;
        std::error_code made;
        auto hash_chunks = [&] { made = make_header(snapshot, codec, chunk_elements, header); };
        co_await detail::offload(st->compute, hash_chunks);
        if (made) co_return made;
        const std::uint64_t total = header.total_elements();
        const std::uint64_t count = header.chunk_hashes.size();
        byte_buffer first = encode(header);
        header = {};
        st->stats.bytes_sent += first.size();
        if (auto ec = co_await stream.write(std::move(first))) co_return ec;
        detail::chunk_source source(snapshot.tensors);
        for (std::uint64_t i = 0; i < count; ++i) {
            if (!st->serving) co_return errc::not_a_donor;
            byte_buffer message;
            std::error_code packed;
            auto pack = [&] {
                const auto values =
                    source.next(static_cast<std::size_t>(chunk_length(total, chunk_elements, i)));
                packed = append_chunk_message(i, codec, values, message);
            };
            co_await detail::offload(st->compute, pack);
            if (packed) co_return packed;
            st->stats.bytes_sent += message.size();
            if (auto ec = co_await stream.write(std::move(message))) co_return ec;
            ++st->stats.chunks_sent;
        }
        co_return std::error_code{};
    }

    shared_ptr_type state_;
};

// ---- newcomers -----------------------------------------------------------------------------

/// How a newcomer downloads.
struct load_options {
    /// The whole operation: DHT lookup and every donor tried.
    duration timeout = 600s;
    /// One donor, from dialing to the last chunk.
    duration donor_timeout = 300s;
    state_limits limits;
    /// Where chunks are hashed and decoded (e.g. a thread pool); none: the node's executor.
    std::optional<asio::any_io_executor> compute;
};

/// A donor that failed, and why.
struct donor_failure {
    crypto::peer_id donor;
    double priority = 0;
    std::error_code error;
};

/// What async_load_state delivers.
struct downloaded_state {
    averaging::state contents;
    /// The donor it came from, and its advertised priority.
    crypto::peer_id donor;
    double priority = 0;
    std::uint64_t chunks = 0;
    /// Donors tried before (or, on error, instead), best first.
    std::vector<donor_failure> failures;
};

namespace detail {

/// One download from one donor over one streaming call.
template <class Transport>
asio::awaitable<std::error_code> download_from(net::node<Transport>& rpc,
                                               typename net::node<Transport>::peer target,
                                               std::string method, duration timeout,
                                               const load_options& options, downloaded_state& out) {
    const state_limits& limits = options.limits;
    net::call_stream call;
    if (auto ec = co_await rpc.open_call(std::move(target), std::move(method), timeout, call))
        co_return ec;
    byte_buffer request = encode(state_request{});
    if (auto ec = co_await call.write(std::move(request))) co_return ec;
    if (auto ec = co_await call.close_write()) co_return ec;

    const auto fail = [&call](errc code) -> std::error_code {
        call.cancel(code);
        return code;
    };
    byte_buffer message;
    if (auto ec = co_await call.read(message))
        co_return ec == asio::error::eof ? make_error_code(errc::protocol_violation) : ec;
    state_header header;
    if (auto ec = decode(message, header, limits)) {
        log::debug("averaging", "bad state header from ", call.remote().short_string(), ": ",
                   ec.message());
        co_return fail(errc::protocol_violation);
    }
    state_assembler assembler(std::move(header));
    while (!assembler.complete()) {
        if (auto ec = co_await call.read(message))
            co_return ec == asio::error::eof ? make_error_code(errc::protocol_violation) : ec;
        state_chunk chunk;
        if (decode(message, chunk, limits)) co_return fail(errc::protocol_violation);
        std::error_code added;
        auto add = [&] { added = assembler.add(chunk); };
        co_await offload(options.compute, add);
        if (auto ec = added) {
            log::debug("averaging", "chunk ", chunk.index, " from ", call.remote().short_string(),
                       ": ", ec.message());
            co_return fail(static_cast<errc>(ec.value()));
        }
    }
    // The donor's final status: anything but a clean end is a failure.
    const std::error_code end = co_await call.read(message);
    if (!end) co_return fail(errc::protocol_violation);
    if (end != asio::error::eof) co_return end;
    out.chunks = assembler.chunk_count();
    out.contents = assembler.take();
    co_return std::error_code{};
}

/// download_from() within `timeout`, whatever the peer does.
template <class Transport>
asio::awaitable<std::error_code>
download_within(net::node<Transport>& rpc, typename net::node<Transport>::peer target,
                std::string method, duration timeout, const load_options& options,
                downloaded_state& out) {
    using namespace asio::experimental::awaitable_operators;
    typename Transport::timer_type timer(rpc.get_executor());
    timer.expires_after(timeout);
    auto outcome =
        co_await (download_from(rpc, std::move(target), std::move(method), timeout, options, out) ||
                  timer.async_wait(asio::experimental::as_tuple(asio::use_awaitable)));
    if (outcome.index() == 0) co_return std::get<0>(outcome);
    co_return errc::timeout;
}

template <class Transport>
asio::awaitable<std::pair<std::error_code, std::vector<donor_info>>>
list_donors(dht::node<Transport>& dht, std::string prefix) {
    const std::string key_text = donors_key(prefix);
    const byte_buffer key = to_buffer(as_bytes(key_text));
    const dht::get_options how{.latest = true};
    auto [ec, entry] =
        co_await dht.async_get(key, how, asio::experimental::as_tuple(asio::use_awaitable));
    std::pair<std::error_code, std::vector<donor_info>> result;
    if (ec) {
        result.first = ec;
        co_return result;
    }
    const std::optional<crypto::peer_id> self = dht.peer_id();
    for (auto& donor : parse_donors(entry, self))
        if (Transport::to_endpoint(donor.address)) result.second.push_back(std::move(donor));
    if (result.second.empty()) result.first = errc::not_found;
    co_return result;
}

template <class Transport>
asio::awaitable<std::pair<std::error_code, downloaded_state>>
load_state(net::node<Transport>& rpc, dht::node<Transport>& dht, std::string prefix,
           load_options options) {
    std::pair<std::error_code, downloaded_state> result;
    const std::string method = state_method(prefix);
    if (!net::is_valid_method(method)) {
        result.first = errc::invalid_argument;
        co_return result;
    }
    const auto executor = rpc.get_executor();
    const time_point deadline = net::detail::transport_now<Transport>(executor) + options.timeout;
    std::vector<donor_info> donors;
    {
        using namespace asio::experimental::awaitable_operators;
        typename Transport::timer_type timer(executor);
        timer.expires_after(options.timeout);
        auto listed =
            co_await (list_donors(dht, std::move(prefix)) ||
                      timer.async_wait(asio::experimental::as_tuple(asio::use_awaitable)));
        if (listed.index() == 1) {
            result.first = errc::timeout;
            co_return result;
        }
        auto& [list_error, found] = std::get<0>(listed);
        if (list_error) {
            result.first = list_error;
            co_return result;
        }
        donors = std::move(found);
    }
    for (const auto& donor : donors) {
        const duration remaining = deadline - net::detail::transport_now<Transport>(executor);
        if (remaining <= duration::zero()) {
            result.first = errc::timeout;
            break;
        }
        typename net::node<Transport>::peer target{donor.id,
                                                   *Transport::to_endpoint(donor.address)};
        const duration limit = std::min(options.donor_timeout, remaining);
        downloaded_state attempt;
        const std::error_code ec =
            co_await download_within(rpc, std::move(target), method, limit, options, attempt);
        const asio::cancellation_state cancellation = co_await asio::this_coro::cancellation_state;
        if (cancellation.cancelled() != asio::cancellation_type::none) {
            result.first = errc::cancelled;
            break;
        }
        if (!ec) {
            result.first = {};
            result.second.contents = std::move(attempt.contents);
            result.second.chunks = attempt.chunks;
            result.second.donor = donor.id;
            result.second.priority = donor.priority;
            break;
        }
        log::info("averaging", "state download from ", donor.id.short_string(),
                  " failed: ", ec.message());
        result.second.failures.push_back({donor.id, donor.priority, ec});
        result.first = ec;
    }
    co_return result;
}

} // namespace detail

/// The donors advertised under `prefix`, best first (see parse_donors), without this peer and
/// without addresses `Transport` cannot dial. Completion: void(std::error_code,
/// std::vector<donor_info>); not_found when there is none, or the DHT's error (no_peers,
/// cancelled). The DHT node must outlive the operation; the token's cancellation slot
/// cancels it.
template <class Transport, class Token>
auto async_list_donors(dht::node<Transport>& dht, std::string prefix, Token&& token) {
    return asio::async_initiate<Token, void(std::error_code, std::vector<donor_info>)>(
        [&dht](auto handler, std::string prefix) {
            auto slot = asio::get_associated_cancellation_slot(handler);
            asio::co_spawn(
                dht.get_executor(), detail::list_donors(dht, std::move(prefix)),
                asio::bind_cancellation_slot(
                    slot, [handler = std::move(handler)](
                              std::exception_ptr failure,
                              std::pair<std::error_code, std::vector<donor_info>> result) mutable {
                        if (failure) result = {make_error_code(errc::cancelled), {}};
                        std::move(handler)(result.first, std::move(result.second));
                    }));
        },
        token, std::move(prefix));
}

/// Downloads the state advertised under `prefix`: reads the donors from the DHT, then tries
/// them best first (excluding this peer), each within options.donor_timeout and all within
/// options.timeout, until one delivers a complete, verified state.
///
/// Completion: void(std::error_code, downloaded_state). Errors: not_found when no donor is
/// advertised; otherwise, when every donor failed, the error of the last one tried
/// (result.failures lists each donor's error): timeout, unreachable, refused, not_a_donor,
/// connection_closed, corrupt_data (a chunk whose hash or decoding does not match the
/// header), protocol_violation (a malformed or out-of-order message), or the donor's own
/// status; timeout also when options.timeout ran out before a donor could be tried;
/// invalid_argument for a bad prefix. On error the contents are empty: a partial or
/// unverified state is never delivered.
///
/// Cancellation: the token's cancellation slot (any type) ends the operation with cancelled.
/// The RPC and DHT nodes must outlive the operation.
template <class Transport, class Token>
auto async_load_state(net::node<Transport>& rpc, dht::node<Transport>& dht, std::string prefix,
                      load_options options, Token&& token) {
    return asio::async_initiate<Token, void(std::error_code, downloaded_state)>(
        [&rpc, &dht](auto handler, std::string prefix, load_options options) {
            auto slot = asio::get_associated_cancellation_slot(handler);
            asio::co_spawn(
                rpc.get_executor(),
                detail::load_state(rpc, dht, std::move(prefix), std::move(options)),
                asio::bind_cancellation_slot(
                    slot, [handler = std::move(handler)](
                              std::exception_ptr failure,
                              std::pair<std::error_code, downloaded_state> result) mutable {
                        if (failure) result = {make_error_code(errc::cancelled), {}};
                        std::move(handler)(result.first, std::move(result.second));
                    }));
        },
        token, std::move(prefix), std::move(options));
}

/// Blocking async_load_state(), for training loops. Throws std::system_error with the
/// operation's error, or errc::wrong_thread when called on the nodes' io thread.
template <class Transport>
downloaded_state load_state(net::node<Transport>& rpc, dht::node<Transport>& dht,
                            std::string prefix, load_options options = {}) {
    if (dht::detail::running_in_this_thread(rpc.get_executor()))
        throw std::system_error(errc::wrong_thread, "hivemesh::averaging::load_state: blocking "
                                                    "call on an io thread; use async_load_state");
    return async_load_state(rpc, dht, std::move(prefix), std::move(options), asio::use_future)
        .get();
}

} // namespace hivemesh::averaging

// With HIVEMESH_SEPARATE_COMPILATION (the hivemesh::compiled target) the TCP and sim
// instantiations are compiled once, in src/averaging_tcp.cpp and src/averaging_sim.cpp, not in every translation unit.
#if defined(HIVEMESH_SEPARATE_COMPILATION)
#include "hivemesh/net/sim.hpp"
#include "hivemesh/net/tcp.hpp"

namespace hivemesh::averaging {
extern template class state_server<net::tcp::transport>;
extern template class state_server<net::sim::transport>;
} // namespace hivemesh::averaging
#endif
