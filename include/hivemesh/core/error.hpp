// Error codes shared by every layer. Expected failures travel as std::error_code;
// throwing APIs wrap them in std::system_error.
#pragma once

#include <string>
#include <system_error>

namespace hivemesh {

/// Error conditions raised by hivemesh itself.
enum class errc : int {
    truncated_input = 1,   ///< a buffer ended before a field it announced
    length_limit_exceeded, ///< a length read from input exceeds a configured maximum
    bad_magic,             ///< a buffer does not start with the expected magic bytes
    unsupported_version,   ///< a format version this build does not understand
    unknown_codec,         ///< a codec id outside the known set
    invalid_argument,      ///< an out-of-range parameter (block size, index, ...)
    corrupt_data,          ///< fields are individually valid but inconsistent
    trailing_data,         ///< bytes left over after a complete message
    size_mismatch,         ///< output buffer size differs from the encoded element count
    non_finite_input,      ///< NaN or infinity given to a codec that cannot represent it
    compression_failed,    ///< the zstd library reported an error
    // crypto
    insecure_permissions,  ///< a secret file is readable by group or others
    bad_signature,         ///< an Ed25519 signature does not verify
    handshake_failed,      ///< the secure handshake failed (bad key, swarm key, mode, tamper)
    peer_id_mismatch,      ///< the remote peer is not the one the dialer expected
    authentication_failed, ///< an encrypted record failed its tag: tampered, replayed, reordered
    connection_truncated,  ///< the byte stream ended without a closing record
    // net and rpc
    timeout,            ///< a deadline passed before the operation completed
    unreachable,        ///< no route to the peer, or it did not answer a dial
    refused,            ///< the peer refused: nothing listening, unknown method, over limit
    protocol_violation, ///< the peer broke the wire protocol
    message_too_large,  ///< a frame or message exceeds the configured maximum
    cancelled,          ///< the caller or the peer cancelled the operation
    connection_closed,  ///< the connection closed while the operation was under way
    remote_error,       ///< the remote handler failed
    // dht
    not_found,     ///< no node holds a value for the key
    no_peers,      ///< the routing table is empty: bootstrap first
    store_refused, ///< no replica accepted the value (see the per-item status)
    rate_limited,  ///< the peer sent more requests than its allowance
    storage_full,  ///< a storage limit (total bytes, keys) would be exceeded
    wrong_thread,  ///< a blocking call was made on an io thread, which would deadlock
    // averaging
    too_few_peers, ///< no group of at least the minimum size could be formed in time
    unknown_group, ///< the message names a group this peer is not averaging with
    not_a_donor,   ///< the peer does not serve state (any more)
    // core
    internal_error, ///< an exception escaped an operation: a bug or exhausted memory (logged)
};

/// The largest errc value (the wire carries errc values; decoders refuse larger ones).
inline constexpr errc last_errc = errc::internal_error;

namespace detail {

class hivemesh_category final : public std::error_category {
public:
    const char* name() const noexcept override { return "hivemesh"; }
    std::string message(int value) const override {
        switch (static_cast<errc>(value)) {
        case errc::truncated_input:
            return "input truncated";
        case errc::length_limit_exceeded:
            return "length exceeds limit";
        case errc::bad_magic:
            return "bad magic bytes";
        case errc::unsupported_version:
            return "unsupported format version";
        case errc::unknown_codec:
            return "unknown codec";
        case errc::invalid_argument:
            return "invalid argument";
        case errc::corrupt_data:
            return "corrupt data";
        case errc::trailing_data:
            return "unexpected trailing data";
        case errc::size_mismatch:
            return "size mismatch";
        case errc::non_finite_input:
            return "non-finite input (NaN or infinity)";
        case errc::compression_failed:
            return "compression library failure";
        case errc::insecure_permissions:
            return "secret file is readable by others";
        case errc::bad_signature:
            return "signature does not verify";
        case errc::handshake_failed:
            return "secure handshake failed";
        case errc::peer_id_mismatch:
            return "remote peer is not the expected one";
        case errc::authentication_failed:
            return "record authentication failed";
        case errc::connection_truncated:
            return "connection truncated";
        case errc::timeout:
            return "deadline exceeded";
        case errc::unreachable:
            return "peer unreachable";
        case errc::refused:
            return "refused by peer";
        case errc::protocol_violation:
            return "protocol violation";
        case errc::message_too_large:
            return "message too large";
        case errc::cancelled:
            return "operation cancelled";
        case errc::connection_closed:
            return "connection closed";
        case errc::remote_error:
            return "remote handler failed";
        case errc::not_found:
            return "not found";
        case errc::no_peers:
            return "no known peers";
        case errc::store_refused:
            return "store refused by every replica";
        case errc::rate_limited:
            return "rate limit exceeded";
        case errc::storage_full:
            return "storage limit reached";
        case errc::wrong_thread:
            return "blocking call on an io thread";
        case errc::too_few_peers:
            return "too few peers to form a group";
        case errc::unknown_group:
            return "unknown averaging group";
        case errc::not_a_donor:
            return "peer does not serve state";
        case errc::internal_error:
            return "internal error (see the log)";
        }
        return "unknown hivemesh error";
    }
};

} // namespace detail

/// The category of every hivemesh::errc value.
inline const std::error_category& hivemesh_category() noexcept {
    static const detail::hivemesh_category category;
    return category;
}

inline std::error_code make_error_code(errc e) noexcept {
    return {static_cast<int>(e), hivemesh_category()};
}

/// Throws std::system_error carrying `ec` (with `what` as context) if `ec` is set.
inline void throw_if_error(std::error_code ec, const char* what) {
    if (ec) throw std::system_error(ec, what);
}

} // namespace hivemesh

template <>
struct std::is_error_code_enum<hivemesh::errc> : std::true_type {};
