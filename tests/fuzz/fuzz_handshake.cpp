// libFuzzer target: the secure handshake fed arbitrary messages. The first input byte picks
// the step (bits 0-1: 0 message 1 to a listener, 1 message 2 to a dialer, 2 message 3 to a
// listener that answered a valid hello) and the options (bit 2 plaintext, bit 3 swarm key,
// bit 4 resumption: the dialer offers the fixed ticket and the listener holds it); the rest is
// the message. Every message must be refused with handshake_failed or accepted, and an
// accepted message 2 or 3 must come from the fixed peer, whose keys the fuzzer does not have
// (a resumed one proves the ticket's secret instead). Identities, ephemeral keys and the
// ticket are fixed (crypto_seeds.hpp) so that make_corpus.cpp can seed the corpus with the
// valid messages.
#include "crypto_seeds.hpp"

#include <hivemesh/crypto/secure_channel.hpp>

#include <cstdint>
#include <cstdlib>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using namespace hivemesh::crypto;
    using namespace hivemesh::fuzz;
    if (size == 0) return 0;
    static const identity dialer_identity = identity::from_seed(filled(dialer_seed));
    static const identity listener_identity = identity::from_seed(filled(listener_seed));
    const std::uint8_t selector = data[0];
    const hivemesh::byte_view message(reinterpret_cast<const std::byte*>(data + 1), size - 1);
    const auto dialer_options = options_for(selector, dialer_ephemeral_seed);
    const auto listener_options = options_for(selector, listener_ephemeral_seed);

    const bool resumable = (selector & 16) != 0;
    handshake dialer(dialer_identity, role::dialer, dialer_options, std::nullopt,
                     resumption_for(selector, role::dialer, listener_identity));
    handshake listener(listener_identity, role::listener, listener_options, std::nullopt,
                       resumption_for(selector, role::listener, dialer_identity));
    hivemesh::byte_buffer out;
    std::error_code ec;
    switch (selector & 3) {
    case 0:
        ec = listener.on_message(message, out);
        if (!ec && out.size() != 145 && !(resumable && out.size() == 49)) std::abort();
        break;
    case 1: {
        hivemesh::byte_buffer hello;
        if (dialer.start(hello)) std::abort();
        ec = dialer.on_message(message, out);
        if (!ec &&
            (!dialer.done() || dialer.remote_id() != listener_identity.id() ||
             out.size() != (dialer.resumed() ? 16u : 112u) || (dialer.resumed() && !resumable)))
            std::abort();
        break;
    }
    default: {
        hivemesh::byte_buffer hello, reply;
        if (dialer.start(hello) || listener.on_message(hello, reply)) std::abort();
        ec = listener.on_message(message, out);
        if (!ec &&
            (!listener.done() || !out.empty() || listener.remote_id() != dialer_identity.id()))
            std::abort();
        break;
    }
    }
    if (ec && ec != hivemesh::errc::handshake_failed) std::abort();
    return 0;
}
