// Wire format of RPC calls, carried as messages on one multiplexed stream per call.
//
// Caller -> callee, first message:
//   u8 version (1) | u8 call kind | sized string method | u32 timeout in milliseconds |
//   body (unary: the request; streaming: empty)
// then, for streaming calls, raw body messages; the caller ends its side with end_stream.
// Callee -> caller, every message starts with a u8 tag:
//   data (0):  body                    -- streaming calls only
//   reply (1): body                    -- the last message, status ok
//   status (2): u16 errc value | sized string detail -- the last message, an error
//
// A unary call may instead travel as one sealed datagram each way (crypto/datagram.hpp,
// net::datagram_options), whose payload is
//   u8 datagram kind | u64 call id | message
// request (0): the call header with its body, as above (a unary call);
// reply (1): the reply or status message, as above;
// by_stream (2): no message: the callee does not answer this call by datagram (the
//   method is not served that way, or the reply does not fit); the caller calls by stream.
#pragma once

#include "hivemesh/core/binary.hpp"
#include "hivemesh/core/error.hpp"

#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>

namespace hivemesh::net {

enum class call_kind : std::uint8_t { unary = 0, streaming = 1 };

struct call_header {
    call_kind kind = call_kind::unary;
    std::string method;
    std::uint32_t timeout_ms = 0;
    byte_view body; ///< views the message it was read from
};

enum class reply_tag : std::uint8_t { data = 0, reply = 1, status = 2 };

struct reply_message {
    reply_tag tag = reply_tag::data;
    std::error_code status; ///< status: the callee's error
    std::string detail;     ///< status: a human-readable explanation
    byte_view body;         ///< data, reply
};

namespace detail {
inline constexpr std::uint8_t rpc_version = 1;
inline constexpr std::size_t max_detail_length = 1024;
} // namespace detail

inline constexpr std::size_t max_method_length = 128;

/// Method names are 1..128 characters of [A-Za-z0-9_.:/-].
inline bool is_valid_method(std::string_view name) noexcept {
    if (name.empty() || name.size() > max_method_length) return false;
    for (char c : name) {
        const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                        (c >= '0' && c <= '9') || c == '_' || c == '.' || c == ':' || c == '/' ||
                        c == '-';
        if (!ok) return false;
    }
    return true;
}

inline byte_buffer encode_call_header(call_kind kind, std::string_view method,
                                      std::uint32_t timeout_ms, byte_view body = {}) {
    byte_buffer out;
    out.reserve(11 + method.size() + body.size());
    binary_writer w(out);
    w.write(detail::rpc_version);
    w.write(static_cast<std::uint8_t>(kind));
    w.write_string(method);
    w.write(timeout_ms);
    w.write_bytes(body);
    return out;
}

/// Errors: protocol_violation for anything malformed (bad version, kind or method name,
/// zero timeout, a body on a streaming call's header).
inline std::error_code decode_call_header(byte_view message, call_header& out) {
    binary_reader r(message);
    const auto version = r.read<std::uint8_t>();
    const auto kind = r.read<std::uint8_t>();
    const auto method = r.read_sized_bytes(max_method_length);
    out.timeout_ms = r.read<std::uint32_t>();
    if (!r.ok() || version != detail::rpc_version || kind > 1 || out.timeout_ms == 0)
        return errc::protocol_violation;
    out.kind = static_cast<call_kind>(kind);
    out.method.assign(as_string_view(method));
    if (!is_valid_method(out.method)) return errc::protocol_violation;
    out.body = r.rest();
    if (out.kind == call_kind::streaming && !out.body.empty()) return errc::protocol_violation;
    return {};
}

/// A data or reply message: the tag, then the body.
inline byte_buffer encode_reply(reply_tag tag, byte_view body) {
    byte_buffer out;
    out.reserve(1 + body.size());
    out.push_back(static_cast<std::byte>(tag));
    out.insert(out.end(), body.begin(), body.end());
    return out;
}

/// A status message; codes outside hivemesh's category travel as remote_error.
inline byte_buffer encode_status(std::error_code status, std::string_view detail) {
    const bool ours = status.category() == hivemesh_category();
    const auto code =
        static_cast<std::uint16_t>(ours ? status.value() : static_cast<int>(errc::remote_error));
    byte_buffer out;
    binary_writer w(out);
    w.write(static_cast<std::uint8_t>(reply_tag::status));
    w.write(code);
    w.write_string(detail.substr(0, detail::max_detail_length));
    return out;
}

/// Errors: protocol_violation for an unknown tag, a status of 0 or unknown code, or a
/// malformed detail.
inline std::error_code decode_reply(byte_view message, reply_message& out) {
    binary_reader r(message);
    const auto tag = r.read<std::uint8_t>();
    if (!r.ok() || tag > 2) return errc::protocol_violation;
    out.tag = static_cast<reply_tag>(tag);
    if (out.tag != reply_tag::status) {
        out.body = r.rest();
        return {};
    }
    const auto code = r.read<std::uint16_t>();
    out.detail = r.read_string(detail::max_detail_length);
    if (r.finish() || code == 0 || code > static_cast<std::uint16_t>(last_errc))
        return errc::protocol_violation;
    out.status = static_cast<errc>(code);
    return {};
}

enum class datagram_kind : std::uint8_t { request = 0, reply = 1, by_stream = 2 };

struct datagram_message {
    datagram_kind kind = datagram_kind::request;
    std::uint64_t call = 0;
    byte_view message; ///< views the payload it was read from; empty for by_stream
};

/// Appends the datagram kind and call id; the message follows.
inline void append_datagram_header(datagram_kind kind, std::uint64_t call, byte_buffer& out) {
    binary_writer w(out);
    w.write(static_cast<std::uint8_t>(kind));
    w.write(call);
}

/// Errors: protocol_violation for a short payload, an unknown kind, a by_stream with a
/// message, or a request or reply without one. The message itself is not decoded.
inline std::error_code decode_datagram_message(byte_view payload, datagram_message& out) {
    binary_reader r(payload);
    const auto kind = r.read<std::uint8_t>();
    out.call = r.read<std::uint64_t>();
    if (!r.ok() || kind > 2) return errc::protocol_violation;
    out.kind = static_cast<datagram_kind>(kind);
    out.message = r.rest();
    if ((out.kind == datagram_kind::by_stream) != out.message.empty())
        return errc::protocol_violation;
    return {};
}

} // namespace hivemesh::net
