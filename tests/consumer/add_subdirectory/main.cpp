// A consumer that builds hivemesh from source with add_subdirectory(). Prints
// "hivemesh consumer: ok" and returns 0 when every check passes.
#include <hivemesh/core.hpp>

#include "../consumer_checks.hpp"

#include <cstdint>
#include <limits>
#include <string>
#include <system_error>

using consumer::check;

int main() {
    hivemesh::byte_buffer buf;
    hivemesh::binary_writer writer(buf);
    writer.write(std::int16_t{-2});
    writer.write(std::uint64_t{3}); // an element count ...
    for (std::uint32_t v : {7u, 8u, 9u})
        writer.write(v); // ... and the elements
    writer.write_f32(1.5f);
    check(buf.size() == 2 + 8 + 12 + 4, "encoded size");
    check(buf[0] == std::byte{0xFE} && buf[1] == std::byte{0xFF}, "little-endian layout");

    hivemesh::binary_reader reader(buf);
    check(reader.read<std::int16_t>() == -2, "i16 round trip");
    const std::size_t n = reader.read_count(sizeof(std::uint32_t), 16);
    check(n == 3, "element count");
    std::uint32_t sum = 0;
    for (std::size_t i = 0; i < n; ++i)
        sum += reader.read<std::uint32_t>();
    check(sum == 24, "elements round trip");
    check(reader.read_f32() == 1.5f, "f32 round trip");
    check(!reader.finish(), "whole message consumed");

    // A hostile count is refused before anything is allocated.
    hivemesh::byte_buffer hostile;
    hivemesh::binary_writer(hostile).write(std::numeric_limits<std::uint64_t>::max());
    hivemesh::binary_reader bad(hostile);
    check(bad.read_count(sizeof(std::uint32_t), 1u << 20) == 0, "hostile count refused");
    check(bad.error() == hivemesh::errc::length_limit_exceeded, "length_limit_exceeded");
    try {
        hivemesh::throw_if_error(bad.error(), "consumer");
        check(false, "throw_if_error throws");
    } catch (const std::system_error& e) {
        check(e.code() == hivemesh::errc::length_limit_exceeded, "system_error carries errc");
    }

    consumer::check_dependencies();
    return consumer::finish();
}
