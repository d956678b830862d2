// The fixed keys and seeds of the crypto fuzz targets (fuzz_secure_record.cpp,
// fuzz_handshake.cpp, fuzz_datagram.cpp), shared with make_corpus.cpp so that its seed inputs
// are valid for them.
#pragma once

#include <hivemesh/crypto/secure_channel.hpp>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>

namespace hivemesh::fuzz {

// fuzz_secure_record: records sealed with record_key() and at most max_record_size long.
inline constexpr std::uint8_t record_key_byte = 0x5A;
inline constexpr std::size_t max_record_size = 1 << 16;

// fuzz_handshake: identities, ephemeral keys and the swarm key are 32 bytes of these values.
inline constexpr std::uint8_t dialer_seed = 0x01, listener_seed = 0x02;
inline constexpr std::uint8_t dialer_ephemeral_seed = 0x11, listener_ephemeral_seed = 0x22;
inline constexpr std::uint8_t swarm_key_byte = 0x33;

/// 32 bytes of `value`.
inline std::array<std::byte, 32> filled(std::uint8_t value) {
    std::array<std::byte, 32> bytes;
    bytes.fill(std::byte{value});
    return bytes;
}

inline crypto::symmetric_key record_key() {
    return crypto::symmetric_key(filled(record_key_byte));
}

// fuzz_datagram: datagrams the dialer's identity sealed for the listener's at this time.
inline constexpr std::chrono::milliseconds datagram_sent_at{1'800'000'000'000};

/// fuzz_handshake's ticket, when its selector's bit 4 is set: id and secret 32 bytes of these.
inline constexpr std::uint8_t ticket_id_byte = 0x44, ticket_secret_byte = 0x55;

/// The fixed ticket, naming `remote` (the other fixed peer) as the one who holds it sees it.
inline crypto::resumption_ticket fixed_ticket(const crypto::identity& remote) {
    crypto::resumption_ticket ticket;
    ticket.id.fill(std::byte{ticket_id_byte});
    ticket.secret = crypto::symmetric_key(filled(ticket_secret_byte));
    ticket.remote_key = remote.public_key();
    return ticket;
}

/// What fuzz_handshake's selector bit 4 gives each side: the dialer offers the fixed ticket
/// (naming `remote`, the listener) and the listener finds it (naming `remote`, the dialer).
inline crypto::resumption resumption_for(std::uint8_t selector, crypto::role side,
                                         const crypto::identity& remote) {
    crypto::resumption resume;
    if ((selector & 16) == 0) return resume;
    const auto ticket = fixed_ticket(remote);
    if (side == crypto::role::dialer)
        resume.offer = ticket;
    else
        resume.find =
            [ticket](const crypto::ticket_id& id) -> std::optional<crypto::resumption_ticket> {
            if (id == ticket.id) return ticket;
            return std::nullopt;
        };
    return resume;
}

/// The handshake options that fuzz_handshake's selector byte picks (bit 2 plaintext, bit 3
/// swarm key), with the ephemeral key of seed `ephemeral`.
inline crypto::secure_options options_for(std::uint8_t selector, std::uint8_t ephemeral) {
    crypto::secure_options options;
    options.plaintext = (selector & 4) != 0;
    if (selector & 8) options.swarm_key = filled(swarm_key_byte);
    options.ephemeral_seed_for_testing = filled(ephemeral);
    return options;
}

} // namespace hivemesh::fuzz
