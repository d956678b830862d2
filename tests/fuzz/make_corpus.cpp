// Writes valid seed inputs for the fuzz targets: every codec at a few sizes, and zstd
// payloads stored and compressed. Usage: make_corpus <decompress dir> <decompress_bytes dir>
#include <hivemesh/compression.hpp>
#include <hivemesh/core/random.hpp>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>

namespace {

void write_file(const std::filesystem::path& path, const hivemesh::byte_buffer& bytes) {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

} // namespace

int main(int argc, char** argv) {
    using namespace hivemesh::compression;
    if (argc != 3) {
        std::cerr << "usage: make_corpus <decompress dir> <decompress_bytes dir>\n";
        return 2;
    }
    const std::filesystem::path tensors = argv[1], bytes = argv[2];
    std::filesystem::create_directories(tensors);
    std::filesystem::create_directories(bytes);
    hivemesh::random_generator rng(1);
    for (kind k : all_kinds)
        for (std::size_t n : {0, 1, 65, 300}) {
            std::vector<float> values(n);
            for (auto& v : values) v = static_cast<float>(rng.normal());
            const options opts{.block_size = 64, .row_length = n % 5 == 0 && n ? 5u : 0u};
            write_file(tensors / (std::string(to_string(k)) + "_" + std::to_string(n)), compress(k, values, opts));
        }
    for (std::size_t n : {0, 100, 2000}) {
        hivemesh::byte_buffer payload(n);
        for (std::size_t i = 0; i < n; ++i) payload[i] = static_cast<std::byte>(i % 13);
        write_file(bytes / ("payload_" + std::to_string(n)), compress_bytes(payload));
    }
    return 0;
}
