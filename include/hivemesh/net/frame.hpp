// Wire format of the stream multiplexer: one frame per secure record.
//
// Every frame starts with `u8 type | u32 stream id` (little-endian), then:
//   settings (stream 0): u32 initial_window | u32 max_streams | u32 max_message_size |
//                        sized bytes hello (at most max_hello_size; opaque to the mux)
//   data:                u8 flags (open, end_message, end_stream) | payload (rest of record)
//   window:              u32 increment
//   reset:               u16 error code (a hivemesh::errc value)
//   ping, pong (stream 0): u64 token
//   goaway (stream 0):   nothing
// Stream ids are odd when the dialer opened the stream and even for the listener; 0 is the
// connection itself. Decoding checks every field; see decode_frame().
#pragma once

#include "hivemesh/core/binary.hpp"
#include "hivemesh/core/error.hpp"

#include <cstdint>
#include <system_error>

namespace hivemesh::net {

enum class frame_type : std::uint8_t {
    settings = 1,
    data = 2,
    window = 3,
    reset = 4,
    ping = 5,
    pong = 6,
    goaway = 7,
};

/// Flags of a data frame.
namespace frame_flags {
inline constexpr std::uint8_t open = 1;        ///< first frame of a stream opened by the sender
inline constexpr std::uint8_t end_message = 2; ///< the payload completes a message
inline constexpr std::uint8_t end_stream = 4;  ///< the sender will send nothing more
inline constexpr std::uint8_t all = open | end_message | end_stream;
} // namespace frame_flags

/// What a peer announces about itself right after the secure handshake.
struct mux_settings {
    std::uint32_t initial_window = 0;   ///< bytes it buffers per stream before crediting
    std::uint32_t max_streams = 0;      ///< streams the sender accepts at once
    std::uint32_t max_message_size = 0; ///< largest message it accepts
    byte_buffer hello;                  ///< opaque to the mux (listen addresses, ...)
};

/// A decoded frame; `payload` views the record it came from.
struct frame {
    frame_type type = frame_type::data;
    std::uint32_t stream = 0;
    std::uint8_t flags = 0;  ///< data
    std::uint32_t value = 0; ///< window increment, or reset code
    std::uint64_t token = 0; ///< ping, pong
    byte_view payload;       ///< data
    mux_settings settings;   ///< settings
};

namespace detail {
inline constexpr std::size_t frame_header_size = 5; // type + stream id
inline constexpr std::size_t data_header_size = frame_header_size + 1;
inline constexpr std::size_t max_hello_size = 4096;
} // namespace detail

inline void write_frame_header(binary_writer& w, frame_type type, std::uint32_t stream) {
    w.write(static_cast<std::uint8_t>(type));
    w.write(stream);
}

inline void write_settings_frame(binary_writer& w, const mux_settings& s) {
    write_frame_header(w, frame_type::settings, 0);
    w.write(s.initial_window);
    w.write(s.max_streams);
    w.write(s.max_message_size);
    w.write_sized_bytes(s.hello);
}

/// Writes the header of a data frame; the payload follows.
inline void write_data_header(binary_writer& w, std::uint32_t stream, std::uint8_t flags) {
    write_frame_header(w, frame_type::data, stream);
    w.write(flags);
}

inline void write_window_frame(binary_writer& w, std::uint32_t stream, std::uint32_t increment) {
    write_frame_header(w, frame_type::window, stream);
    w.write(increment);
}

inline void write_reset_frame(binary_writer& w, std::uint32_t stream, std::uint16_t code) {
    write_frame_header(w, frame_type::reset, stream);
    w.write(code);
}

inline void write_ping_frame(binary_writer& w, frame_type type, std::uint64_t token) {
    write_frame_header(w, type, 0);
    w.write(token);
}

/// Decodes one frame from a whole record. Errors (all errc::protocol_violation unless
/// said): unknown type, a field missing or left over, connection-level frames on a stream
/// or stream frames on stream 0, unknown data flags, a zero window increment, a hello over
/// max_hello_size (message_too_large), a data payload over `max_payload`
/// (message_too_large).
inline std::error_code decode_frame(byte_view record, frame& out, std::size_t max_payload) {
    binary_reader r(record);
    const auto type = r.read<std::uint8_t>();
    out.stream = r.read<std::uint32_t>();
    if (!r.ok()) return errc::protocol_violation;
    out.type = static_cast<frame_type>(type);
    const bool connection_level = out.stream == 0;
    switch (out.type) {
    case frame_type::settings:
        if (!connection_level) return errc::protocol_violation;
        out.settings.initial_window = r.read<std::uint32_t>();
        out.settings.max_streams = r.read<std::uint32_t>();
        out.settings.max_message_size = r.read<std::uint32_t>();
        {
            const auto length = r.read<std::uint32_t>();
            if (r.ok() && length > detail::max_hello_size) return errc::message_too_large;
            if (!r.check_count(length, 1, detail::max_hello_size)) return errc::protocol_violation;
            const auto hello = r.read_bytes(length);
            out.settings.hello.assign(hello.begin(), hello.end());
        }
        break;
    case frame_type::data:
        if (connection_level) return errc::protocol_violation;
        out.flags = r.read<std::uint8_t>();
        if (!r.ok() || (out.flags & ~frame_flags::all) != 0) return errc::protocol_violation;
        if (r.remaining() > max_payload) return errc::message_too_large;
        out.payload = r.rest();
        return {};
    case frame_type::window:
        if (connection_level) return errc::protocol_violation;
        out.value = r.read<std::uint32_t>();
        if (r.ok() && out.value == 0) return errc::protocol_violation;
        break;
    case frame_type::reset:
        if (connection_level) return errc::protocol_violation;
        out.value = r.read<std::uint16_t>();
        break;
    case frame_type::ping:
    case frame_type::pong:
        if (!connection_level) return errc::protocol_violation;
        out.token = r.read<std::uint64_t>();
        break;
    case frame_type::goaway:
        if (!connection_level) return errc::protocol_violation;
        break;
    default:
        return errc::protocol_violation;
    }
    return r.finish() ? std::error_code(errc::protocol_violation) : std::error_code{};
}

} // namespace hivemesh::net
