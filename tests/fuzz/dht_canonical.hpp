// Shared by the DHT fuzz targets: a message that decodes must re-encode to the same bytes.
#pragma once

#include <hivemesh/dht/messages.hpp>

#include <algorithm>
#include <cstdlib>

namespace hivemesh::fuzz {

/// Aborts if `input` decodes as a Message whose encoding differs from `input`, or that the
/// encoder refuses.
template <class Message>
void check_canonical(byte_view input) {
    Message message;
    if (dht::decode(input, message)) return;
    byte_buffer again;
    try {
        again = dht::encode(message);
    } catch (...) {
        std::abort(); // the encoder refused what the decoder accepted
    }
    if (again.size() != input.size() || !std::equal(again.begin(), again.end(), input.begin()))
        std::abort();
}

} // namespace hivemesh::fuzz
