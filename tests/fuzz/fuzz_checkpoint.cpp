// libFuzzer target: the checkpoint file decoder on arbitrary input, as it is and with its last
// eight bytes replaced by the checksum of the rest, so that the fields behind the checksum
// are explored too. Every input decodes or is refused; whatever decodes re-encodes to exactly
// the input bytes.
#include <hivemesh/optim/checkpoint.hpp>

#include <xxhash.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace {

void check(hivemesh::byte_view input) {
    using namespace hivemesh;
    optim::checkpoint c;
    if (optim::decode(input, c)) return;
    const byte_buffer again = optim::encode(c);
    if (again.size() != input.size() || !std::equal(again.begin(), again.end(), input.begin()))
        std::abort();
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using namespace hivemesh;
    const byte_view input(reinterpret_cast<const std::byte*>(data), size);
    check(input);
    if (size >= 8) {
        byte_buffer sealed(input.begin(), input.end());
        const std::uint64_t sum = XXH3_64bits(sealed.data(), size - 8);
        std::memcpy(sealed.data() + size - 8, &sum, 8); // little-endian hosts, as the fuzzers run
        check(sealed);
    }
    return 0;
}
