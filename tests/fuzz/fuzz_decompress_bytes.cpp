// libFuzzer target: compression::decompress_bytes (zstd payloads) on arbitrary bytes.
#include <hivemesh/compression/zstd.hpp>

#include <cstdint>
#include <cstdlib>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const hivemesh::byte_view input(reinterpret_cast<const std::byte*>(data), size);
    constexpr std::size_t limit = 1 << 20;
    std::error_code ec;
    const auto out = hivemesh::compression::decompress_bytes(input, limit, ec);
    if (!ec && out.size() > limit) std::abort();
    if (ec && !out.empty()) std::abort();
    return 0;
}
