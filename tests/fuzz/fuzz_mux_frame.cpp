// libFuzzer target: net::decode_frame on arbitrary records. Every input decodes or is
// refused with an error code; a decoded frame re-encodes to exactly the input.
#include <hivemesh/net/frame.hpp>

#include <cstdint>
#include <cstdlib>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using namespace hivemesh;
    const byte_view input(reinterpret_cast<const std::byte*>(data), size);
    net::frame f;
    if (net::decode_frame(input, f, 1 << 16)) return 0;
    byte_buffer again;
    binary_writer w(again);
    switch (f.type) {
    case net::frame_type::settings:
        net::write_settings_frame(w, f.settings);
        break;
    case net::frame_type::data:
        net::write_data_header(w, f.stream, f.flags);
        w.write_bytes(f.payload);
        break;
    case net::frame_type::window:
        net::write_window_frame(w, f.stream, f.value);
        break;
    case net::frame_type::reset:
        net::write_reset_frame(w, f.stream, static_cast<std::uint16_t>(f.value));
        break;
    case net::frame_type::ping:
    case net::frame_type::pong:
        net::write_ping_frame(w, f.type, f.token);
        break;
    case net::frame_type::goaway:
        net::write_frame_header(w, f.type, 0);
        break;
    }
    if (again.size() != input.size() || !std::equal(again.begin(), again.end(), input.begin()))
        std::abort();
    return 0;
}
