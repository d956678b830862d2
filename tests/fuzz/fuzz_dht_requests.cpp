// libFuzzer target: the DHT request decoders (ping, store, find) on arbitrary input. Every
// input decodes or is refused; whatever decodes re-encodes to exactly the input bytes.
#include "dht_canonical.hpp"

#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using namespace hivemesh::dht;
    using hivemesh::fuzz::check_canonical;
    const hivemesh::byte_view input(reinterpret_cast<const std::byte*>(data), size);
    check_canonical<ping_request>(input);
    check_canonical<store_request>(input);
    check_canonical<find_request>(input);
    return 0;
}
