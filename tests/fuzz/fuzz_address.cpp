// libFuzzer target: peer addresses in printable and binary form. Every input parses or is
// refused; a parsed address prints and encodes to forms that parse back to it.
#include <hivemesh/net/address.hpp>

#include <cstdint>
#include <cstdlib>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using namespace hivemesh;
    const byte_view input(reinterpret_cast<const std::byte*>(data), size);

    if (const auto parsed = net::peer_address::parse(as_string_view(input))) {
        const auto again = net::peer_address::parse(parsed->to_string());
        if (!again || !(*again == *parsed)) std::abort();
    }

    binary_reader reader(input);
    const auto decoded = net::peer_address::read(reader);
    if (reader.ok()) {
        byte_buffer encoded;
        binary_writer writer(encoded);
        decoded.write(writer);
        binary_reader back(encoded);
        const auto again = net::peer_address::read(back);
        if (back.finish() || !(again == decoded)) std::abort();
    }
    return 0;
}
