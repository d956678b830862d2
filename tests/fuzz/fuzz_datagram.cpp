// libFuzzer target: crypto::datagram_sealer::open on an arbitrary datagram, received by the
// listener's fixed identity at the fixed time (crypto_seeds.hpp). Every input must open or be
// refused with an error code; one that opens must come from the dialer (no one else shares
// the key) and its payload must lie inside it. make_corpus.cpp seeds datagrams the dialer
// sealed for the listener at that time.
#include "crypto_seeds.hpp"

#include <hivemesh/crypto/datagram.hpp>

#include <cstdint>
#include <cstdlib>
#include <cstring>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using namespace hivemesh::crypto;
    using namespace hivemesh::fuzz;
    static const identity dialer = identity::from_seed(filled(dialer_seed));
    static datagram_sealer listener(identity::from_seed(filled(listener_seed)), {});
    const hivemesh::time_point now{datagram_sent_at};

    // Opened in place, so the datagram is a mutable copy.
    hivemesh::byte_buffer datagram(size);
    if (size != 0) std::memcpy(datagram.data(), data, size);
    datagram_sealer::opened opened;
    if (listener.open(datagram, now, opened)) return 0;
    if (!(opened.sender == dialer.public_key())) std::abort();
    if (opened.payload.data() < datagram.data() ||
        opened.payload.data() + opened.payload.size() > datagram.data() + datagram.size() ||
        opened.payload.size() + datagram_overhead != datagram.size())
        std::abort();
    return 0;
}
