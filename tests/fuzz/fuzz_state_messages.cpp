// libFuzzer target: the state-sharing decoders (request, header, chunk, donor record, and the
// collaborative optimizer's state metadata) on arbitrary input. Every input decodes or is refused;
// whatever decodes re-encodes to exactly the input bytes. Small limits keep the fuzzer near the
// boundaries.
#include <hivemesh/averaging/state_wire.hpp>
#include <hivemesh/optim/state_metadata.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdlib>

namespace {

using namespace hivemesh;

template <class Message, class... Limits>
void check_canonical(byte_view input, const Limits&... limits) {
    Message message;
    if (averaging::decode(input, message, limits...)) return;
    byte_buffer again;
    try {
        again = averaging::encode(message);
    } catch (...) {
        std::abort(); // the encoder refused what the decoder accepted
    }
    if (again.size() != input.size() || !std::equal(again.begin(), again.end(), input.begin()))
        std::abort();
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const byte_view input(reinterpret_cast<const std::byte*>(data), size);
    averaging::state_limits limits;
    limits.max_tensors = 64;
    limits.max_total_elements = 1 << 16;
    limits.max_metadata_bytes = 1024;
    limits.max_chunk_bytes = 1 << 16;
    limits.max_chunks = 256;
    check_canonical<averaging::state_request>(input);
    check_canonical<averaging::state_header>(input, limits);
    check_canonical<averaging::state_header>(input); // default limits
    check_canonical<averaging::state_chunk>(input, limits);
    check_canonical<averaging::donor_record>(input);
    optim::state_metadata metadata;
    if (!optim::decode(input, metadata)) {
        const byte_buffer again = optim::encode(metadata);
        if (again.size() != input.size() || !std::equal(again.begin(), again.end(), input.begin()))
            std::abort();
    }
    return 0;
}
