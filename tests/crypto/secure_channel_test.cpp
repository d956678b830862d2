#include "support/bytes.hpp"
#include "support/identities.hpp"

#include <hivemesh/core/random.hpp>
#include <hivemesh/crypto/secure_channel.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <functional>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

using hivemesh::byte_buffer;
using hivemesh::byte_view;
using hivemesh::errc;
using namespace hivemesh::crypto;

namespace {

using hivemesh::test::identity_of;
using hivemesh::test::random_bytes;

std::array<std::byte, 32> key_bytes(std::uint8_t fill) {
    std::array<std::byte, 32> key;
    key.fill(std::byte{fill});
    return key;
}

/// Options with reproducible ephemeral keys, so every run sends the same messages.
secure_options deterministic(secure_options options, std::uint8_t ephemeral) {
    options.ephemeral_seed_for_testing = key_bytes(ephemeral);
    return options;
}

struct outcome {
    std::error_code dialer_error;
    std::error_code listener_error;
    std::vector<byte_buffer> messages; // as delivered, in order
    std::optional<secure_session> dialer;
    std::optional<secure_session> listener;
    std::optional<resumption_ticket> dialer_ticket, listener_ticket; // what each side kept
    bool done() const { return dialer && listener; }
};

using mutator = std::function<void(std::size_t message_index, byte_buffer& message)>;

/// Runs a whole handshake in memory; `mutate` may change each message in transit.
outcome run_handshake(const identity& dialer_identity, const identity& listener_identity,
                      const secure_options& dialer_options = {},
                      const secure_options& listener_options = {},
                      std::optional<peer_id> dialer_expects = {},
                      std::optional<peer_id> listener_expects = {}, const mutator& mutate = {},
                      const resumption& dialer_resume = {},
                      const resumption& listener_resume = {}) {
    outcome result;
    const auto keeping = [](resumption resume, std::optional<resumption_ticket>& kept) {
        resume.keep = [&kept](const resumption_ticket& ticket) {
            REQUIRE_FALSE(kept); // once
            kept = ticket;
        };
        return resume;
    };
    handshake dialer(dialer_identity, role::dialer, dialer_options, dialer_expects,
                     keeping(dialer_resume, result.dialer_ticket));
    handshake listener(listener_identity, role::listener, listener_options, listener_expects,
                       keeping(listener_resume, result.listener_ticket));
    byte_buffer message, reply;
    REQUIRE_FALSE(listener.start(reply));
    CHECK(reply.empty());
    REQUIRE_FALSE(dialer.start(message));
    for (std::size_t index = 0; index < 3; ++index) {
        if (mutate) mutate(index, message);
        result.messages.push_back(message);
        auto& receiver = index == 1 ? dialer : listener;
        const auto ec = receiver.on_message(message, reply);
        (index == 1 ? result.dialer_error : result.listener_error) = ec;
        if (ec) {
            CHECK(reply.empty());
            return result;
        }
        std::swap(message, reply);
        if (index == 2) CHECK(message.empty());
    }
    REQUIRE(dialer.done());
    REQUIRE(listener.done());
    result.dialer.emplace(dialer.result());
    result.listener.emplace(listener.result());
    return result;
}

/// A listener's resumption that knows `ticket` alone.
resumption knowing(const resumption_ticket& ticket) {
    return {.find = [ticket](const ticket_id& id) -> std::optional<resumption_ticket> {
        if (id == ticket.id) return ticket;
        return std::nullopt;
    }};
}

/// The tickets a full handshake leaves the dialer and the listener.
std::pair<resumption_ticket, resumption_ticket>
tickets_of(const identity& dialer_identity, const identity& listener_identity,
           const secure_options& dialer_options = {}, const secure_options& listener_options = {}) {
    auto full = run_handshake(dialer_identity, listener_identity, dialer_options, listener_options);
    REQUIRE(full.done());
    REQUIRE(full.dialer_ticket);
    REQUIRE(full.listener_ticket);
    return {*full.dialer_ticket, *full.listener_ticket};
}

/// Seals `payload` with `from` and opens it with `to`; returns the opened payload.
byte_buffer pass(record_sealer& from, record_opener& to, byte_view payload) {
    byte_buffer wire;
    REQUIRE_FALSE(from.append(payload, wire));
    std::size_t size = 0;
    REQUIRE_FALSE(to.peek(wire, size));
    REQUIRE(size == wire.size());
    record_type type{};
    std::span<std::byte> opened;
    REQUIRE_FALSE(to.open(wire, type, opened));
    CHECK(type == record_type::data);
    return byte_buffer(opened.begin(), opened.end());
}

/// Opens one whole record with `opener`; returns the error.
std::error_code open_one(record_opener& opener, byte_buffer record) {
    std::size_t size = 0;
    if (auto ec = opener.peek(record, size)) return ec;
    REQUIRE(size == record.size());
    record_type type{};
    std::span<std::byte> payload;
    return opener.open(record, type, payload);
}

bool same_bytes(byte_view a, byte_view b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
}

std::vector<cipher> record_ciphers() {
    std::vector<cipher> ciphers{cipher::plaintext, cipher::chacha20_poly1305};
    if (aes256_gcm_available()) ciphers.push_back(cipher::aes256_gcm);
    return ciphers;
}

std::vector<cipher> aead_ciphers() {
    std::vector<cipher> ciphers{cipher::chacha20_poly1305};
    if (aes256_gcm_available()) ciphers.push_back(cipher::aes256_gcm);
    return ciphers;
}

/// The key schedule as documented at the top of secure_channel.hpp, written from that text.
namespace documented {

byte_buffer label(std::string_view name) {
    const std::string full = "hivemesh/secure/v1 " + std::string(name);
    byte_buffer out{static_cast<std::byte>(full.size())};
    const auto bytes = hivemesh::as_bytes(full);
    out.insert(out.end(), bytes.begin(), bytes.end());
    return out;
}

template <std::size_t N>
std::array<unsigned char, N> blake2b(byte_view key, std::initializer_list<byte_view> parts) {
    byte_buffer input;
    for (const auto part : parts)
        input.insert(input.end(), part.begin(), part.end());
    std::array<unsigned char, N> out;
    crypto_generichash(out.data(), N, reinterpret_cast<const unsigned char*>(input.data()),
                       input.size(), reinterpret_cast<const unsigned char*>(key.data()),
                       key.size());
    return out;
}

template <std::size_t N>
byte_view view(const std::array<unsigned char, N>& bytes) {
    return {reinterpret_cast<const std::byte*>(bytes.data()), N};
}

using hash = std::array<unsigned char, 32>;

hash transcript(std::initializer_list<byte_view> messages) {
    byte_buffer all = label("transcript");
    for (const auto m : messages)
        all.insert(all.end(), m.begin(), m.end());
    return blake2b<32>({}, {all});
}

/// prk from the ephemeral secret of the side that computes it; a resumed handshake's when
/// `ticket_secret` is given.
std::array<unsigned char, 64> prk(role side, std::uint8_t ephemeral_seed, byte_view peer_ephemeral,
                                  byte_view swarm_key, byte_view ticket_secret = {}) {
    const auto seed = key_bytes(ephemeral_seed);
    std::array<unsigned char, 32> pk, sk, rx, tx;
    crypto_kx_seed_keypair(pk.data(), sk.data(),
                           reinterpret_cast<const unsigned char*>(seed.data()));
    const auto* peer = reinterpret_cast<const unsigned char*>(peer_ephemeral.data());
    const int ok =
        side == role::dialer
            ? crypto_kx_client_session_keys(rx.data(), tx.data(), pk.data(), sk.data(), peer)
            : crypto_kx_server_session_keys(rx.data(), tx.data(), pk.data(), sk.data(), peer);
    REQUIRE(ok == 0);
    // Client tx || client rx; the server's rx is the client's tx.
    const auto& client_tx = side == role::dialer ? tx : rx;
    const auto& client_rx = side == role::dialer ? rx : tx;
    if (!ticket_secret.empty())
        return blake2b<64>(swarm_key, {label("resumed key material"), ticket_secret,
                                       view(client_tx), view(client_rx)});
    return blake2b<64>(swarm_key, {label("key material"), view(client_tx), view(client_rx)});
}

hash key(const std::array<unsigned char, 64>& prk, std::string_view name, const hash& th) {
    return blake2b<32>(view(prk), {label(name), view(th)});
}

byte_buffer signed_content(std::string_view name, const hash& th, const public_key& signer) {
    byte_buffer out = label(name);
    const auto t = view(th), k = signer.view();
    out.insert(out.end(), t.begin(), t.end());
    out.insert(out.end(), k.begin(), k.end());
    return out;
}

/// seal()/open() of the handshake: ChaCha20-Poly1305-IETF, nonce 0, no associated data.
byte_buffer seal(const hash& k, byte_view text) {
    byte_buffer out(text.size() + 16);
    const std::array<unsigned char, 12> nonce{};
    crypto_aead_chacha20poly1305_ietf_encrypt(reinterpret_cast<unsigned char*>(out.data()), nullptr,
                                              reinterpret_cast<const unsigned char*>(text.data()),
                                              text.size(), nullptr, 0, nullptr, nonce.data(),
                                              k.data());
    return out;
}

/// seal(k, ""): the tag alone (libsodium wants a pointer even for an empty text).
byte_buffer seal_empty(const hash& k) {
    byte_buffer tag(16);
    unsigned char none = 0;
    const std::array<unsigned char, 12> nonce{};
    crypto_aead_chacha20poly1305_ietf_encrypt_detached(
        &none, reinterpret_cast<unsigned char*>(tag.data()), nullptr, &none, 0, nullptr, 0, nullptr,
        nonce.data(), k.data());
    return tag;
}

std::optional<byte_buffer> open(const hash& k, byte_view sealed) {
    byte_buffer out(sealed.size() - 16);
    const std::array<unsigned char, 12> nonce{};
    if (crypto_aead_chacha20poly1305_ietf_decrypt(
            reinterpret_cast<unsigned char*>(out.data()), nullptr, nullptr,
            reinterpret_cast<const unsigned char*>(sealed.data()), sealed.size(), nullptr, 0,
            nonce.data(), k.data()) != 0)
        return std::nullopt;
    return out;
}

} // namespace documented

} // namespace

TEST_CASE("the handshake authenticates both peers and negotiates the cipher",
          "[crypto][secure_channel]") {
    const auto alice = identity_of(1), bob = identity_of(2);
    const bool aes = aes256_gcm_available();
    struct configuration {
        bool plaintext, dialer_aes, listener_aes;
        cipher expected;
    };
    const std::vector<configuration> configurations = {
        {false, true, true, aes ? cipher::aes256_gcm : cipher::chacha20_poly1305},
        {false, false, true, cipher::chacha20_poly1305},
        {false, true, false, cipher::chacha20_poly1305},
        {false, false, false, cipher::chacha20_poly1305},
        {true, true, true, cipher::plaintext},
    };
    if (!aes) WARN("AES-256-GCM is not available on this CPU: only ChaCha20-Poly1305 is tested");
    for (const auto& c : configurations) {
        CAPTURE(c.plaintext, c.dialer_aes, c.listener_aes);
        secure_options dialer_options, listener_options;
        dialer_options.plaintext = listener_options.plaintext = c.plaintext;
        dialer_options.allow_aes_gcm = c.dialer_aes;
        listener_options.allow_aes_gcm = c.listener_aes;
        auto result = run_handshake(alice, bob, dialer_options, listener_options, bob.id());
        REQUIRE(result.done());
        CHECK(result.messages[0].size() == 39);
        CHECK(result.messages[1].size() == 145);
        CHECK(result.messages[2].size() == 112);
        CHECK(result.dialer->suite == c.expected);
        CHECK(result.listener->suite == c.expected);
        CHECK(result.dialer->remote_id == bob.id());
        CHECK(result.dialer->remote_key == bob.public_key());
        CHECK(result.listener->remote_id == alice.id());
        CHECK(result.listener->remote_key == alice.public_key());

        const auto ping = hivemesh::as_bytes("ping from the dialer");
        const auto pong = hivemesh::as_bytes("pong from the listener");
        CHECK(pass(result.dialer->sealer, result.listener->opener, ping) ==
              hivemesh::to_buffer(ping));
        CHECK(pass(result.listener->sealer, result.dialer->opener, pong) ==
              hivemesh::to_buffer(pong));
        // Plaintext mode sends the payload as it is; the AEAD modes do not.
        byte_buffer wire;
        REQUIRE_FALSE(result.dialer->sealer.append(ping, wire));
        const bool visible =
            std::search(wire.begin(), wire.end(), ping.begin(), ping.end()) != wire.end();
        CHECK(visible == c.plaintext);
    }
}

TEST_CASE("the handshake refuses a peer that is not the expected one", "[crypto][secure_channel]") {
    const auto alice = identity_of(1), bob = identity_of(2), mallory = identity_of(3);
    SECTION("dialer expects another PeerId") {
        const auto result = run_handshake(alice, mallory, {}, {}, bob.id());
        CHECK(result.dialer_error == errc::peer_id_mismatch);
        CHECK(result.messages.size() == 2); // message 3 is never sent
    }
    SECTION("listener expects another PeerId") {
        const auto result = run_handshake(mallory, bob, {}, {}, bob.id(), alice.id());
        CHECK(result.listener_error == errc::peer_id_mismatch);
        CHECK_FALSE(result.done());
    }
    SECTION("both expectations met") {
        CHECK(run_handshake(alice, bob, {}, {}, bob.id(), alice.id()).done());
    }
}

TEST_CASE("the swarm key keeps outsiders out", "[crypto][secure_channel]") {
    const auto alice = identity_of(1), bob = identity_of(2);
    secure_options swarm_a, swarm_b, none;
    swarm_a.swarm_key = key_bytes(0xA1);
    swarm_b.swarm_key = key_bytes(0xB2);
    for (const bool plaintext : {false, true}) {
        CAPTURE(plaintext);
        swarm_a.plaintext = swarm_b.plaintext = none.plaintext = plaintext;
        CHECK(run_handshake(alice, bob, swarm_a, swarm_a).done());
        CHECK(run_handshake(alice, bob, swarm_a, swarm_b).dialer_error == errc::handshake_failed);
        CHECK(run_handshake(alice, bob, swarm_a, none).dialer_error == errc::handshake_failed);
        CHECK(run_handshake(alice, bob, none, swarm_a).dialer_error == errc::handshake_failed);
    }
    // The swarm key also changes the session keys.
    swarm_a.plaintext = none.plaintext = false;
    auto with = run_handshake(alice, bob, deterministic(swarm_a, 1), deterministic(swarm_a, 2));
    auto without = run_handshake(alice, bob, deterministic(none, 1), deterministic(none, 2));
    REQUIRE(with.done());
    REQUIRE(without.done());
    byte_buffer record;
    REQUIRE_FALSE(with.dialer->sealer.append(hivemesh::as_bytes("x"), record));
    CHECK(open_one(without.listener->opener, record) == errc::authentication_failed);
}

TEST_CASE("plaintext and secure peers do not talk", "[crypto][secure_channel]") {
    const auto alice = identity_of(1), bob = identity_of(2);
    secure_options plaintext;
    plaintext.plaintext = true;
    CHECK(run_handshake(alice, bob, plaintext, {}).listener_error == errc::handshake_failed);
    CHECK(run_handshake(alice, bob, {}, plaintext).listener_error == errc::handshake_failed);
}

TEST_CASE("every single-bit flip of every handshake message is refused",
          "[crypto][secure_channel]") {
    const auto alice = identity_of(1), bob = identity_of(2);
    for (const bool plaintext : {false, true})
        for (const bool resuming : {false, true}) {
            CAPTURE(plaintext, resuming);
            secure_options base;
            base.plaintext = plaintext;
            const auto dialer_options = deterministic(base, 11);
            const auto listener_options = deterministic(base, 22);
            resumption dialer_resume, listener_resume;
            if (resuming) {
                const auto [dialer_ticket, listener_ticket] = tickets_of(alice, bob, base, base);
                dialer_resume.offer = dialer_ticket;
                listener_resume = knowing(listener_ticket);
            }
            const auto run = [&](const mutator& mutate) {
                return run_handshake(alice, bob, dialer_options, listener_options, {}, {}, mutate,
                                     dialer_resume, listener_resume);
            };
            const auto honest = run({});
            REQUIRE(honest.done());
            CHECK(honest.dialer->resumed == resuming);
            // Reproducible ephemeral keys: an unmodified run sends the same bytes again.
            CHECK(run({}).messages == honest.messages);

            std::size_t flips = 0;
            for (std::size_t index = 0; index < 3; ++index) {
                for (std::size_t bit = 0; bit < honest.messages[index].size() * 8; ++bit) {
                    const auto result = run([&](std::size_t at, byte_buffer& message) {
                        if (at == index)
                            message[bit / 8] ^=
                                std::byte{static_cast<unsigned char>(1u << (bit % 8))};
                    });
                    ++flips;
                    CAPTURE(index, bit);
                    REQUIRE_FALSE(result.done());
                    if (index == 0) {
                        // The listener may not see the change (an ephemeral key bit, or a ticket
                        // id bit, which makes the handshake full), but then the transcripts
                        // differ and the dialer cannot open message 2.
                        CHECK((result.listener_error == errc::handshake_failed ||
                               result.dialer_error == errc::handshake_failed));
                    } else if (index == 1) {
                        CHECK(result.dialer_error == errc::handshake_failed);
                    } else {
                        CHECK(result.listener_error == errc::handshake_failed);
                    }
                }
            }
            CHECK(flips == (resuming ? 71 + 49 + 16 : 39 + 145 + 112) * 8);

            // One byte short or one byte long is refused too.
            for (std::size_t index = 0; index < 3; ++index) {
                for (const bool longer : {false, true}) {
                    CAPTURE(index, longer);
                    const auto result = run([&](std::size_t at, byte_buffer& message) {
                        if (at != index) return;
                        if (longer)
                            message.push_back(std::byte{0});
                        else
                            message.pop_back();
                    });
                    CHECK_FALSE(result.done());
                    CHECK((result.listener_error == errc::handshake_failed ||
                           result.dialer_error == errc::handshake_failed));
                }
            }
        }
}

TEST_CASE("the handshake follows the documented key schedule", "[crypto][secure_channel]") {
    const auto alice = identity_of(1), bob = identity_of(2);
    for (const bool with_swarm_key : {false, true}) {
        CAPTURE(with_swarm_key);
        secure_options options;
        if (with_swarm_key) options.swarm_key = key_bytes(0x5F);
        const byte_view swarm = with_swarm_key ? byte_view(*options.swarm_key) : byte_view{};
        auto result =
            run_handshake(alice, bob, deterministic(options, 1), deterministic(options, 2));
        REQUIRE(result.done());
        const byte_view m1 = result.messages[0], m2 = result.messages[1], m3 = result.messages[2];

        // Message 1 carries the ephemeral key of seed 1.
        std::array<unsigned char, 32> pk, sk;
        const auto seed = key_bytes(1);
        crypto_kx_seed_keypair(pk.data(), sk.data(),
                               reinterpret_cast<const unsigned char*>(seed.data()));
        CHECK(same_bytes(m1.subspan(7), documented::view(pk)));

        const auto prk = documented::prk(role::dialer, 1, m2.subspan(1, 32), swarm);
        CHECK(prk == documented::prk(role::listener, 2, m1.subspan(7), swarm));

        const auto th2 = documented::transcript({m1, m2.first(33)});
        const auto listener_part =
            documented::open(documented::key(prk, "listener handshake", th2), m2.subspan(33));
        REQUIRE(listener_part);
        const byte_view listener_text = *listener_part;
        CHECK(same_bytes(listener_text.first(32), bob.public_key().view()));
        CHECK(verify(bob.public_key(),
                     documented::signed_content("listener signature", th2, bob.public_key()),
                     *signature::from_bytes(listener_text.subspan(32))));

        const auto th3 = documented::transcript({m1, m2});
        const auto dialer_part =
            documented::open(documented::key(prk, "dialer handshake", th3), m3);
        REQUIRE(dialer_part);
        const byte_view dialer_text = *dialer_part;
        CHECK(same_bytes(dialer_text.first(32), alice.public_key().view()));
        CHECK(verify(alice.public_key(),
                     documented::signed_content("dialer signature", th3, alice.public_key()),
                     *signature::from_bytes(dialer_text.subspan(32))));

        const auto th4 = documented::transcript({m1, m2, m3});
        const auto to_listener = documented::key(prk, "dialer to listener", th4);
        const auto to_dialer = documented::key(prk, "listener to dialer", th4);
        const auto suite = result.dialer->suite;
        record_opener listener_side(suite, symmetric_key(documented::view(to_listener)));
        record_opener dialer_side(suite, symmetric_key(documented::view(to_dialer)));
        byte_buffer record;
        REQUIRE_FALSE(result.dialer->sealer.append(hivemesh::as_bytes("up"), record));
        CHECK_FALSE(open_one(listener_side, record));
        record.clear();
        REQUIRE_FALSE(result.listener->sealer.append(hivemesh::as_bytes("down"), record));
        CHECK_FALSE(open_one(dialer_side, record));
    }
}

TEST_CASE("a full handshake leaves both peers one ticket, and a handshake with it resumes",
          "[crypto][secure_channel]") {
    const auto alice = identity_of(1), bob = identity_of(2);
    for (const bool plaintext : {false, true})
        for (const bool with_swarm_key : {false, true}) {
            CAPTURE(plaintext, with_swarm_key);
            secure_options options;
            options.plaintext = plaintext;
            if (with_swarm_key) options.swarm_key = key_bytes(0x5F);
            const auto [alice_ticket, bob_ticket] = tickets_of(alice, bob, options, options);
            CHECK(alice_ticket.id == bob_ticket.id);
            CHECK(same_bytes(alice_ticket.secret.view(), bob_ticket.secret.view()));
            CHECK(alice_ticket.remote_key == bob.public_key());
            CHECK(bob_ticket.remote_key == alice.public_key());
            CHECK_FALSE(same_bytes(alice_ticket.id, alice_ticket.secret.view()));
            // Another full handshake between the same two gives another ticket.
            CHECK(tickets_of(alice, bob, options, options).first.id != alice_ticket.id);

            // Either peer may dial with it; the listener is asked for the offered id once.
            for (const bool alice_dials : {true, false}) {
                CAPTURE(alice_dials);
                const auto& dialer = alice_dials ? alice : bob;
                const auto& listener = alice_dials ? bob : alice;
                int asked = 0;
                resumption listener_resume = knowing(alice_dials ? bob_ticket : alice_ticket);
                listener_resume.find = [&, inner = listener_resume.find](const ticket_id& id) {
                    ++asked;
                    return inner(id);
                };
                auto result = run_handshake(
                    dialer, listener, options, options, listener.id(), dialer.id(), {},
                    {.offer = alice_dials ? alice_ticket : bob_ticket}, listener_resume);
                REQUIRE(result.done());
                CHECK(asked == 1);
                CHECK(result.messages[0].size() == 71);
                CHECK(result.messages[1].size() == 49);
                CHECK(result.messages[2].size() == 16);
                CHECK(result.dialer->resumed);
                CHECK(result.listener->resumed);
                CHECK(result.dialer->remote_id == listener.id());
                CHECK(result.listener->remote_id == dialer.id());
                CHECK(result.dialer->remote_key == listener.public_key());
                CHECK_FALSE(result.dialer_ticket); // the old ticket stays
                CHECK_FALSE(result.listener_ticket);
                CHECK(result.dialer->suite ==
                      (plaintext ? cipher::plaintext
                                 : (aes256_gcm_available() ? cipher::aes256_gcm
                                                           : cipher::chacha20_poly1305)));
                for (const auto* text : {"up", "and up"})
                    CHECK(same_bytes(pass(result.dialer->sealer, result.listener->opener,
                                          hivemesh::as_bytes(text)),
                                     hivemesh::as_bytes(text)));
                CHECK(same_bytes(pass(result.listener->sealer, result.dialer->opener,
                                      hivemesh::as_bytes("down")),
                                 hivemesh::as_bytes("down")));
            }
        }
}

TEST_CASE("a listener that does not hold the offered ticket makes the handshake full",
          "[crypto][secure_channel]") {
    const auto alice = identity_of(1), bob = identity_of(2);
    const auto [alice_ticket, bob_ticket] = tickets_of(alice, bob);
    const auto other = tickets_of(alice, bob).second;
    for (const bool listener_resumes : {false, true}) {
        CAPTURE(listener_resumes);
        // It knows another ticket, or takes none at all.
        const resumption listener_resume = listener_resumes ? knowing(other) : resumption{};
        const auto result = run_handshake(alice, bob, {}, {}, bob.id(), {}, {},
                                          {.offer = alice_ticket}, listener_resume);
        REQUIRE(result.done());
        CHECK(result.messages[0].size() == 71);
        CHECK(result.messages[1].size() == 145);
        CHECK(result.messages[2].size() == 112);
        CHECK_FALSE(result.dialer->resumed);
        CHECK_FALSE(result.listener->resumed);
        CHECK(result.listener->remote_id == alice.id());
        // A new ticket, the same on both sides.
        REQUIRE(result.dialer_ticket);
        REQUIRE(result.listener_ticket);
        CHECK(result.dialer_ticket->id == result.listener_ticket->id);
        CHECK(result.dialer_ticket->id != alice_ticket.id);
    }
}

TEST_CASE("a resumed handshake proves the ticket's secret and names the ticket's peer",
          "[crypto][secure_channel]") {
    const auto alice = identity_of(1), bob = identity_of(2), carol = identity_of(3);
    const auto [alice_ticket, bob_ticket] = tickets_of(alice, bob);

    SECTION("a listener whose ticket of that id has another secret") {
        auto forged = bob_ticket;
        forged.secret = symmetric_key(key_bytes(0x33));
        const auto result = run_handshake(alice, bob, {}, {}, bob.id(), {}, {},
                                          {.offer = alice_ticket}, knowing(forged));
        CHECK(result.dialer_error == errc::handshake_failed);
        CHECK_FALSE(result.done());
    }
    SECTION("a dialer whose ticket of that id has another secret") {
        auto forged = alice_ticket;
        forged.secret = symmetric_key(key_bytes(0x33));
        const auto result = run_handshake(alice, bob, {}, {}, bob.id(), {}, {}, {.offer = forged},
                                          knowing(bob_ticket));
        CHECK(result.dialer_error == errc::handshake_failed);
        CHECK_FALSE(result.done());
    }
    SECTION("carol cannot resume alice's ticket, even knowing its id") {
        const auto result = run_handshake(
            carol, bob, {}, {}, {}, {}, {},
            {.offer = resumption_ticket{alice_ticket.id, symmetric_key(key_bytes(0x44)),
                                        bob.public_key()}},
            knowing(bob_ticket));
        CHECK(result.dialer_error == errc::handshake_failed);
        CHECK_FALSE(result.done());
    }
    SECTION("a listener expecting another peer") {
        const auto result = run_handshake(alice, bob, {}, {}, bob.id(), carol.id(), {},
                                          {.offer = alice_ticket}, knowing(bob_ticket));
        CHECK(result.listener_error == errc::peer_id_mismatch);
    }
    SECTION("the swarm key is mixed in") {
        secure_options keyed;
        keyed.swarm_key = key_bytes(0x5F);
        const auto result = run_handshake(alice, bob, keyed, {}, bob.id(), {}, {},
                                          {.offer = alice_ticket}, knowing(bob_ticket));
        CHECK(result.dialer_error == errc::handshake_failed);
    }
    SECTION("a resumed reply to a dialer that offered no ticket") {
        const auto resumed =
            run_handshake(alice, bob, deterministic({}, 1), deterministic({}, 2), {}, {}, {},
                          {.offer = alice_ticket}, knowing(bob_ticket));
        REQUIRE(resumed.done());
        handshake dialer(alice, role::dialer, deterministic({}, 1));
        byte_buffer hello, out;
        REQUIRE_FALSE(dialer.start(hello));
        CHECK(dialer.on_message(resumed.messages[1], out) == errc::handshake_failed);
    }
    SECTION("a ticket is offered only by a dialer, and only for the peer it names") {
        CHECK_THROWS_AS(handshake(alice, role::dialer, {}, carol.id(), {.offer = alice_ticket}),
                        std::invalid_argument);
        CHECK_THROWS_AS(handshake(bob, role::listener, {}, {}, {.offer = bob_ticket}),
                        std::invalid_argument);
    }
}

TEST_CASE("a resumed handshake follows the documented key schedule", "[crypto][secure_channel]") {
    const auto alice = identity_of(1), bob = identity_of(2);
    for (const bool with_swarm_key : {false, true}) {
        CAPTURE(with_swarm_key);
        secure_options options;
        if (with_swarm_key) options.swarm_key = key_bytes(0x5F);
        const byte_view swarm = with_swarm_key ? byte_view(*options.swarm_key) : byte_view{};

        // The full handshake's ticket: id and secret from its prk and th4.
        const auto full =
            run_handshake(alice, bob, deterministic(options, 1), deterministic(options, 2));
        REQUIRE(full.done());
        const auto full_prk =
            documented::prk(role::dialer, 1, byte_view(full.messages[1]).subspan(1, 32), swarm);
        const auto full_th4 =
            documented::transcript({full.messages[0], full.messages[1], full.messages[2]});
        REQUIRE(full.dialer_ticket);
        REQUIRE(full.listener_ticket);
        const auto& ticket = *full.dialer_ticket;
        CHECK(same_bytes(
            ticket.id, documented::view(documented::key(full_prk, "resumption ticket", full_th4))));
        const auto secret = documented::key(full_prk, "resumption secret", full_th4);
        CHECK(same_bytes(ticket.secret.view(), documented::view(secret)));

        auto result =
            run_handshake(alice, bob, deterministic(options, 3), deterministic(options, 4), {}, {},
                          {}, {.offer = ticket}, knowing(*full.listener_ticket));
        REQUIRE(result.done());
        const byte_view m1 = result.messages[0], m2 = result.messages[1], m3 = result.messages[2];
        CHECK(same_bytes(m1.subspan(39), ticket.id));
        const auto suite = result.dialer->suite;
        CHECK(static_cast<std::uint8_t>(m2[0]) == (static_cast<std::uint8_t>(suite) | 0x80));
        const auto prk =
            documented::prk(role::dialer, 3, m2.subspan(1, 32), swarm, documented::view(secret));
        CHECK(prk == documented::prk(role::listener, 4, m1.subspan(7, 32), swarm,
                                     documented::view(secret)));
        const auto th2 = documented::transcript({m1, m2.first(33)});
        CHECK(same_bytes(m2.subspan(33), documented::seal_empty(documented::key(
                                             prk, "resumed listener handshake", th2))));
        const auto th3 = documented::transcript({m1, m2});
        CHECK(same_bytes(
            m3, documented::seal_empty(documented::key(prk, "resumed dialer handshake", th3))));

        const auto th4 = documented::transcript({m1, m2, m3});
        record_opener listener_side(suite, symmetric_key(documented::view(
                                               documented::key(prk, "dialer to listener", th4))));
        record_opener dialer_side(suite, symmetric_key(documented::view(
                                             documented::key(prk, "listener to dialer", th4))));
        byte_buffer record;
        REQUIRE_FALSE(result.dialer->sealer.append(hivemesh::as_bytes("up"), record));
        CHECK_FALSE(open_one(listener_side, record));
        record.clear();
        REQUIRE_FALSE(result.listener->sealer.append(hivemesh::as_bytes("down"), record));
        CHECK_FALSE(open_one(dialer_side, record));
    }
}

TEST_CASE("a signature relayed from another session does not authenticate",
          "[crypto][secure_channel]") {
    // Mallory sits between Alice and Bob: she dials Bob herself, then answers Alice with Bob's
    // key and signature, re-sealed under the keys of her session with Alice.
    const auto alice = identity_of(1), bob = identity_of(2), mallory = identity_of(3);
    handshake dialer(alice, role::dialer, deterministic({}, 1));
    byte_buffer alice_hello;
    REQUIRE_FALSE(dialer.start(alice_hello));

    handshake mallory_dialer(mallory, role::dialer, deterministic({}, 3));
    handshake listener(bob, role::listener, deterministic({}, 2));
    byte_buffer mallory_hello, bob_reply;
    REQUIRE_FALSE(mallory_dialer.start(mallory_hello));
    REQUIRE_FALSE(listener.on_message(mallory_hello, bob_reply));
    const byte_view reply = bob_reply;
    const auto prk_with_bob = documented::prk(role::dialer, 3, reply.subspan(1, 32), {});
    const auto th2_with_bob = documented::transcript({mallory_hello, reply.first(33)});
    const auto bob_identity = documented::open(
        documented::key(prk_with_bob, "listener handshake", th2_with_bob), reply.subspan(33));
    REQUIRE(bob_identity); // Mallory learns Bob's key and signature

    // Mallory answers Alice as a listener with ephemeral seed 4.
    const auto forge_reply = [&](byte_view identity_payload) {
        std::array<unsigned char, 32> pk, sk;
        const auto seed = key_bytes(4);
        crypto_kx_seed_keypair(pk.data(), sk.data(),
                               reinterpret_cast<const unsigned char*>(seed.data()));
        byte_buffer forged{reply[0]};
        const auto ephemeral = documented::view(pk);
        forged.insert(forged.end(), ephemeral.begin(), ephemeral.end());
        const auto prk = documented::prk(role::listener, 4, byte_view(alice_hello).subspan(7), {});
        const auto th2 = documented::transcript({alice_hello, forged});
        const auto sealed =
            documented::seal(documented::key(prk, "listener handshake", th2), identity_payload);
        forged.insert(forged.end(), sealed.begin(), sealed.end());
        return std::pair{forged, th2};
    };
    {
        const auto [forged, th2] = forge_reply(*bob_identity);
        byte_buffer finish;
        CHECK(dialer.on_message(forged, finish) == errc::handshake_failed);
        CHECK(finish.empty());
    }
    {
        // Control: the same forgery signed by Mallory's own key is accepted as Mallory,
        // so the refusal above is the signature's transcript binding at work.
        handshake fresh_dialer(alice, role::dialer, deterministic({}, 1));
        byte_buffer hello;
        REQUIRE_FALSE(fresh_dialer.start(hello));
        REQUIRE(hello == alice_hello);
        const auto th2 = forge_reply(*bob_identity).second;
        byte_buffer payload(mallory.public_key().view().begin(), mallory.public_key().view().end());
        const auto sig = mallory.sign(
            documented::signed_content("listener signature", th2, mallory.public_key()));
        payload.insert(payload.end(), sig.view().begin(), sig.view().end());
        const auto forged = forge_reply(payload).first;
        byte_buffer finish;
        CHECK_FALSE(fresh_dialer.on_message(forged, finish));
        CHECK(fresh_dialer.remote_id() == mallory.id());
    }
}

TEST_CASE("garbage handshake messages are refused cleanly", "[crypto][secure_channel]") {
    const auto bob = identity_of(2);
    hivemesh::random_generator rng(2024);
    byte_buffer reply;
    for (std::size_t size : {0, 1, 4, 38, 39, 40, 112, 145, 4096}) {
        for (int round = 0; round < 20; ++round) {
            CAPTURE(size, round);
            auto garbage = random_bytes(size, rng());
            handshake listener(bob, role::listener);
            CHECK(listener.on_message(garbage, reply) == errc::handshake_failed);
            CHECK(reply.empty());
            // The first error sticks.
            CHECK(listener.on_message(garbage, reply) == errc::handshake_failed);

            handshake dialer(identity_of(1), role::dialer);
            byte_buffer hello;
            REQUIRE_FALSE(dialer.start(hello));
            CHECK(dialer.on_message(garbage, reply) == errc::handshake_failed);
        }
    }
    // A well-formed hello with a low-order (all-zero) ephemeral key fails the key exchange.
    byte_buffer hello;
    handshake dialer(identity_of(1), role::dialer);
    REQUIRE_FALSE(dialer.start(hello));
    std::fill(hello.begin() + 7, hello.end(), std::byte{0});
    handshake listener(bob, role::listener);
    CHECK(listener.on_message(hello, reply) == errc::handshake_failed);
    // Wrong magic, version, unknown mode, or no ChaCha20-Poly1305 in the offer.
    for (const std::size_t offset :
         {std::size_t{0}, std::size_t{4}, std::size_t{5}, std::size_t{6}}) {
        handshake fresh_dialer(identity_of(1), role::dialer);
        REQUIRE_FALSE(fresh_dialer.start(hello));
        hello[offset] = offset == 6 ? std::byte{0x02} : std::byte{0x7F};
        handshake fresh_listener(bob, role::listener);
        CHECK(fresh_listener.on_message(hello, reply) == errc::handshake_failed);
    }
}

TEST_CASE("handshake steps out of turn are refused loudly", "[crypto][secure_channel]") {
    const auto alice = identity_of(1), bob = identity_of(2);
    handshake dialer(alice, role::dialer);
    byte_buffer out;
    CHECK_THROWS_AS(dialer.on_message(byte_view{}, out), std::logic_error); // start() first
    CHECK_THROWS_AS(dialer.result(), std::logic_error);
    CHECK_THROWS_AS(dialer.remote_id(), std::logic_error);
    REQUIRE_FALSE(dialer.start(out));
    CHECK_THROWS_AS(dialer.start(out), std::logic_error);

    handshake listener(bob, role::listener);
    byte_buffer reply, none;
    REQUIRE_FALSE(listener.on_message(out, reply));
    REQUIRE_FALSE(dialer.on_message(reply, out));
    REQUIRE(dialer.done());
    REQUIRE_FALSE(listener.on_message(out, none));
    REQUIRE(listener.done());
    CHECK_THROWS_AS(listener.on_message(out, none), std::logic_error);
    CHECK(listener.remote_id() == alice.id());
    auto session = listener.result();
    CHECK(session.remote_id == alice.id());
    CHECK_THROWS_AS(listener.result(), std::logic_error);
}

TEST_CASE("records follow the documented wire format", "[crypto][secure_channel]") {
    const symmetric_key key(key_bytes(0x42));
    for (const cipher suite : record_ciphers()) {
        CAPTURE(to_string(suite));
        record_sealer sealer(suite, key);
        record_opener opener(suite, key);
        const std::size_t tag = suite == cipher::plaintext ? 0 : 16;
        for (std::size_t size : {0, 1, 15, 16, 17, 1000, 65536}) {
            CAPTURE(size);
            const auto payload = random_bytes(size, size);
            const std::uint64_t counter = sealer.records_sealed();
            byte_buffer record;
            REQUIRE_FALSE(sealer.append(payload, record));
            REQUIRE(record.size() == 4 + 1 + size + tag);
            CHECK(record.size() == sealer.record_size(size));
            const std::uint32_t length = static_cast<std::uint32_t>(1 + size + tag);
            CHECK(record[0] == std::byte(length & 0xFF));
            CHECK(record[1] == std::byte((length >> 8) & 0xFF));
            CHECK(record[2] == std::byte((length >> 16) & 0xFF));
            CHECK(record[3] == std::byte(length >> 24));

            // Independent construction: AEAD(type 0 | payload), AD = header, nonce = counter.
            byte_buffer expected(record.begin(), record.begin() + 4);
            byte_buffer text{std::byte{0}};
            text.insert(text.end(), payload.begin(), payload.end());
            std::array<unsigned char, 12> nonce{};
            for (int i = 0; i < 8; ++i)
                nonce[static_cast<std::size_t>(i)] = static_cast<unsigned char>(counter >> (8 * i));
            expected.resize(4 + text.size() + tag);
            auto* out = reinterpret_cast<unsigned char*>(expected.data() + 4);
            const auto* in = reinterpret_cast<const unsigned char*>(text.data());
            const auto* ad = reinterpret_cast<const unsigned char*>(expected.data());
            if (suite == cipher::plaintext)
                std::copy(text.begin(), text.end(), expected.begin() + 4);
            else if (suite == cipher::chacha20_poly1305)
                crypto_aead_chacha20poly1305_ietf_encrypt(out, nullptr, in, text.size(), ad, 4,
                                                          nullptr, nonce.data(), key.data());
            else
                crypto_aead_aes256gcm_encrypt(out, nullptr, in, text.size(), ad, 4, nullptr,
                                              nonce.data(), key.data());
            CHECK(record == expected);

            std::size_t record_size = 0;
            REQUIRE_FALSE(opener.peek(byte_view(record).first(3), record_size));
            CHECK(record_size == 0); // header incomplete
            REQUIRE_FALSE(opener.peek(byte_view(record).first(4), record_size));
            CHECK(record_size == record.size());
            record_type type{};
            std::span<std::byte> opened;
            REQUIRE_FALSE(opener.open(record, type, opened));
            CHECK(type == record_type::data);
            CHECK(byte_buffer(opened.begin(), opened.end()) == payload);
            CHECK(opened.data() == record.data() + 5); // opened in place
        }

        // In-place sealing: the payload already sits at payload_offset.
        const auto payload = random_bytes(300, 7);
        byte_buffer record(sealer.record_size(payload.size()));
        std::copy(payload.begin(), payload.end(), record.begin() + record_sealer::payload_offset);
        REQUIRE_FALSE(
            sealer.seal(byte_view(record).subspan(record_sealer::payload_offset, 300), record));
        std::size_t size = 0;
        REQUIRE_FALSE(opener.peek(record, size));
        record_type type{};
        std::span<std::byte> opened;
        REQUIRE_FALSE(opener.open(record, type, opened));
        CHECK(byte_buffer(opened.begin(), opened.end()) == payload);
    }
}

TEST_CASE("tampered, replayed, reordered and foreign records fail authentication",
          "[crypto][secure_channel]") {
    const symmetric_key key(key_bytes(0x42)), other_key(key_bytes(0x43));
    for (const cipher suite : aead_ciphers()) {
        CAPTURE(to_string(suite));
        record_sealer sealer(suite, key);
        std::vector<byte_buffer> records(3);
        for (std::size_t i = 0; i < records.size(); ++i)
            REQUIRE_FALSE(sealer.append(random_bytes(40, i), records[i]));

        SECTION("every bit of body and tag") {
            for (std::size_t bit = 4 * 8; bit < records[0].size() * 8; ++bit) {
                CAPTURE(bit);
                auto tampered = records[0];
                tampered[bit / 8] ^= std::byte{static_cast<unsigned char>(1u << (bit % 8))};
                record_opener opener(suite, key);
                CHECK(open_one(opener, tampered) == errc::authentication_failed);
                // Sticky: the untouched next record is refused as well.
                CHECK(open_one(opener, records[1]) == errc::authentication_failed);
            }
        }
        SECTION("the length header is authenticated") {
            auto shorter = records[0];
            shorter[0] = static_cast<std::byte>(static_cast<unsigned char>(shorter[0]) - 1);
            shorter.pop_back();
            record_opener opener(suite, key);
            CHECK(open_one(opener, shorter) == errc::authentication_failed);
        }
        // Records opened in this order: all but the last open, the last is refused.
        struct refused_sequence {
            const char* name;
            const symmetric_key& opener_key;
            std::vector<std::size_t> order;
        };
        const refused_sequence sequences[] = {
            {"replayed", key, {0, 0}},
            {"reordered", key, {1}},
            {"dropped", key, {0, 2}},
            {"from another key or another session", other_key, {0}},
        };
        for (const auto& [name, opener_key, order] : sequences) {
            DYNAMIC_SECTION(name) {
                record_opener opener(suite, opener_key);
                for (std::size_t i = 0; i + 1 < order.size(); ++i)
                    REQUIRE_FALSE(open_one(opener, records[order[i]]));
                CHECK(open_one(opener, records[order.back()]) == errc::authentication_failed);
            }
        }
        SECTION("in order they all open") {
            record_opener opener(suite, key);
            for (const auto& record : records)
                CHECK_FALSE(open_one(opener, record));
            CHECK(opener.records_opened() == 3);
        }
    }
}

TEST_CASE("records of one session do not open in another", "[crypto][secure_channel]") {
    const auto alice = identity_of(1), bob = identity_of(2);
    // Same identities, same options: only the ephemeral keys differ.
    auto first = run_handshake(alice, bob);
    auto second = run_handshake(alice, bob);
    REQUIRE(first.done());
    REQUIRE(second.done());
    byte_buffer record;
    REQUIRE_FALSE(first.dialer->sealer.append(hivemesh::as_bytes("hello"), record));
    CHECK(open_one(second.listener->opener, record) == errc::authentication_failed);
    // Nor does a record come back as valid in the other direction of its own session.
    CHECK(open_one(first.dialer->opener, record) == errc::authentication_failed);
    CHECK_FALSE(open_one(first.listener->opener, record));
}

TEST_CASE("a record stream that ends without a close record is truncated",
          "[crypto][secure_channel]") {
    const symmetric_key key(key_bytes(0x42));
    for (const cipher suite : record_ciphers()) {
        CAPTURE(to_string(suite));
        record_sealer sealer(suite, key);
        record_opener opener(suite, key);
        CHECK(opener.end_of_stream() == errc::connection_truncated);
        CHECK(pass(sealer, opener, hivemesh::as_bytes("data")) ==
              hivemesh::to_buffer(hivemesh::as_bytes("data")));
        CHECK(opener.end_of_stream() == errc::connection_truncated);

        byte_buffer close;
        REQUIRE_FALSE(sealer.append_close(close));
        CHECK(sealer.closed());
        CHECK(sealer.append(hivemesh::as_bytes("late"), close) == errc::connection_closed);
        CHECK(close.size() == sealer.record_size(0));
        std::size_t size = 0;
        REQUIRE_FALSE(opener.peek(close, size));
        record_type type{};
        std::span<std::byte> payload;
        REQUIRE_FALSE(opener.open(close, type, payload));
        CHECK(type == record_type::close);
        CHECK(payload.empty());
        CHECK(opener.closed());
        CHECK_FALSE(opener.end_of_stream());
        // Nothing may follow the close record.
        CHECK(opener.peek(close, size) == errc::protocol_violation);
    }
}

TEST_CASE("malformed records are refused after authentication", "[crypto][secure_channel]") {
    const symmetric_key key(key_bytes(0x42));
    // Builds an authentic record with an arbitrary type byte and payload.
    const auto forge = [&](cipher suite, std::uint8_t type, byte_view payload,
                           std::uint64_t counter) {
        const std::size_t tag = suite == cipher::plaintext ? 0 : 16;
        const auto length = static_cast<std::uint32_t>(1 + payload.size() + tag);
        byte_buffer record(4 + length);
        for (int i = 0; i < 4; ++i)
            record[static_cast<std::size_t>(i)] = static_cast<std::byte>(length >> (8 * i));
        record[4] = std::byte{type};
        std::copy(payload.begin(), payload.end(), record.begin() + 5);
        if (suite == cipher::chacha20_poly1305) {
            std::array<unsigned char, 12> nonce{};
            nonce[0] = static_cast<unsigned char>(counter);
            auto* text = reinterpret_cast<unsigned char*>(record.data() + 4);
            crypto_aead_chacha20poly1305_ietf_encrypt_detached(
                text, text + 1 + payload.size(), nullptr, text, 1 + payload.size(),
                reinterpret_cast<const unsigned char*>(record.data()), 4, nullptr, nonce.data(),
                key.data());
        }
        return record;
    };
    for (const cipher suite : {cipher::plaintext, cipher::chacha20_poly1305}) {
        CAPTURE(to_string(suite));
        {
            record_opener opener(suite, key);
            REQUIRE_FALSE(open_one(opener, forge(suite, 0, hivemesh::as_bytes("ok"), 0)));
            CHECK(open_one(opener, forge(suite, 2, {}, 1)) == errc::protocol_violation);
        }
        {
            record_opener opener(suite, key);
            CHECK(open_one(opener, forge(suite, 1, hivemesh::as_bytes("x"), 0)) ==
                  errc::protocol_violation); // close with a payload
        }
        {
            record_opener opener(suite, key);
            CHECK(open_one(opener, forge(suite, 0x81, {}, 0)) == errc::protocol_violation);
        }
    }
    record_opener plaintext(cipher::plaintext, key);
    CHECK(open_one(plaintext, forge(cipher::plaintext, 0x80, {}, 0)) == errc::protocol_violation);
    record_opener secure(cipher::chacha20_poly1305, key);
    CHECK_FALSE(open_one(secure, forge(cipher::chacha20_poly1305, 0x80, {}, 0))); // key update
    CHECK(secure.key_generation() == 1);
}

TEST_CASE("an oversized record length is refused from its header alone",
          "[crypto][secure_channel]") {
    const symmetric_key key(key_bytes(0x42));
    secure_options options;
    options.max_record_size = 1000;
    for (const cipher suite : record_ciphers()) {
        CAPTURE(to_string(suite));
        const auto header = [](std::uint32_t length) {
            byte_buffer h(4);
            for (int i = 0; i < 4; ++i)
                h[static_cast<std::size_t>(i)] = static_cast<std::byte>(length >> (8 * i));
            return h;
        };
        std::size_t size = 1;
        record_opener at_limit(suite, key, options);
        CHECK_FALSE(at_limit.peek(header(1000), size));
        CHECK(size == 1004);
        for (const std::uint32_t length : {1001u, 0xFFFFFFFFu}) {
            record_opener opener(suite, key, options);
            CHECK(opener.peek(header(length), size) == errc::message_too_large);
            CHECK(size == 0);
            CHECK(opener.peek(header(10), size) == errc::message_too_large); // sticky
        }
        record_opener defaults(suite, key);
        CHECK(defaults.peek(header((16u << 20) + 1025), size) == errc::message_too_large);
        record_opener empty(suite, key);
        CHECK(empty.peek(header(0), size) == errc::protocol_violation);
        if (suite != cipher::plaintext) {
            record_opener short_record(suite, key);
            CHECK(short_record.peek(header(16), size) == errc::protocol_violation);
        }

        record_sealer sealer(suite, key, options);
        CHECK(sealer.max_payload_size() == 1000 - 1 - (suite == cipher::plaintext ? 0 : 16));
        byte_buffer out{std::byte{1}};
        CHECK(sealer.append(byte_buffer(sealer.max_payload_size() + 1), out) ==
              errc::message_too_large);
        CHECK(out.size() == 1); // unchanged
        CHECK(sealer.records_sealed() == 0);
        REQUIRE_FALSE(sealer.append(byte_buffer(sealer.max_payload_size()), out));
        CHECK(out.size() == 1 + 4 + 1000);
    }
}

TEST_CASE("keys rotate on schedule in both directions", "[crypto][secure_channel]") {
    const auto alice = identity_of(1), bob = identity_of(2);
    for (const bool aes : {false, true}) {
        if (aes && !aes256_gcm_available()) continue;
        CAPTURE(aes);
        secure_options options;
        options.allow_aes_gcm = aes;
        options.rekey_interval_records = 3;
        // Only the sender's schedule matters: the listener uses the default interval.
        secure_options listener_options;
        listener_options.allow_aes_gcm = aes;
        listener_options.rekey_interval_bytes = 100;
        auto result = run_handshake(alice, bob, options, listener_options);
        REQUIRE(result.done());
        for (std::size_t i = 0; i < 20; ++i) {
            const auto payload = random_bytes(40, i);
            CHECK(pass(result.dialer->sealer, result.listener->opener, payload) == payload);
            CHECK(pass(result.listener->sealer, result.dialer->opener, payload) == payload);
        }
        // Records: every third one rotates. Bytes: 40, 80, 120 >= 100 also every third.
        CHECK(result.dialer->sealer.key_generation() == 6);
        CHECK(result.listener->opener.key_generation() == 6);
        CHECK(result.listener->sealer.key_generation() == 6);
        CHECK(result.dialer->opener.key_generation() == 6);
    }

    // The key really changes: a sender that did not rotate is refused after the interval.
    const symmetric_key key(key_bytes(0x42));
    secure_options rotating;
    rotating.rekey_interval_records = 3;
    record_sealer rotating_sealer(cipher::chacha20_poly1305, key, rotating);
    record_sealer steady_sealer(cipher::chacha20_poly1305, key);
    std::vector<byte_buffer> rotated(4), steady(4);
    for (std::size_t i = 0; i < 4; ++i) {
        REQUIRE_FALSE(rotating_sealer.append(random_bytes(10, i), rotated[i]));
        REQUIRE_FALSE(steady_sealer.append(random_bytes(10, i), steady[i]));
    }
    CHECK(rotated[1] == steady[1]); // same key, same counter
    CHECK(rotated[3] != steady[3]); // new key after record 2
    record_opener follows(cipher::chacha20_poly1305, key);
    for (std::size_t i = 0; i < 4; ++i)
        CHECK_FALSE(open_one(follows, rotated[i]));
    record_opener stale(cipher::chacha20_poly1305, key);
    for (std::size_t i = 0; i < 3; ++i)
        CHECK_FALSE(open_one(stale, rotated[i]));
    CHECK(open_one(stale, steady[3]) == errc::authentication_failed);
}

TEST_CASE("invalid options and misuse are reported loudly", "[crypto][secure_channel]") {
    const symmetric_key key(key_bytes(0x42));
    secure_options too_small;
    too_small.max_record_size = 16;
    CHECK_THROWS_AS(record_sealer(cipher::chacha20_poly1305, key, too_small),
                    std::invalid_argument);
    secure_options too_large;
    too_large.max_record_size = std::size_t{1} << 32;
    CHECK_THROWS_AS(record_opener(cipher::chacha20_poly1305, key, too_large),
                    std::invalid_argument);
    secure_options no_rekey;
    no_rekey.rekey_interval_records = 0;
    CHECK_THROWS_AS(handshake(identity_of(1), role::dialer, no_rekey), std::invalid_argument);
    CHECK_THROWS_AS(record_sealer(static_cast<cipher>(9), key), std::invalid_argument);
    CHECK_THROWS_AS(symmetric_key(byte_buffer(31)), std::invalid_argument);

    record_sealer sealer(cipher::chacha20_poly1305, key);
    byte_buffer wrong_size(10);
    CHECK_THROWS_AS(sealer.seal(hivemesh::as_bytes("abc"), wrong_size), std::invalid_argument);
    record_sealer moved = std::move(sealer);
    byte_buffer out;
    CHECK_FALSE(moved.append(hivemesh::as_bytes("abc"), out));
    CHECK_THROWS_AS(sealer.append(hivemesh::as_bytes("abc"), out), std::logic_error); // NOLINT
}

TEST_CASE("sealing a head and a body equals sealing them joined", "[crypto][secure_channel]") {
    std::array<std::byte, 32> key_bytes{};
    key_bytes.fill(std::byte{0x42});
    for (std::uint8_t mode = 0; mode < 3; ++mode) {
        const auto suite = static_cast<cipher>(mode);
        if (suite == cipher::aes256_gcm && !aes256_gcm_available()) continue;
        INFO("cipher " << to_string(suite));
        record_sealer joined(suite, symmetric_key(key_bytes), {});
        record_sealer gathered(suite, symmetric_key(key_bytes), {});
        for (const std::size_t head_size : {0, 1, 6, 100})
            for (const std::size_t body_size : {0, 1, 1000, 65536}) {
                byte_buffer head(head_size, std::byte{0x11}), body(body_size, std::byte{0x22});
                byte_buffer whole = head;
                whole.insert(whole.end(), body.begin(), body.end());
                byte_buffer a(joined.record_size(whole.size())), b(a.size());
                REQUIRE_FALSE(joined.seal(whole, a));
                REQUIRE_FALSE(gathered.seal(head, body, b));
                CHECK(a == b);
            }
        // Over the limit counts head and body together.
        const byte_buffer big(gathered.max_payload_size(), std::byte{1});
        byte_buffer record(gathered.record_size(big.size() + 1));
        CHECK(gathered.seal(byte_buffer(1), big, record) == errc::message_too_large);
    }
}

TEST_CASE("a plaintext record's prefix alone, then its payload, equals the sealed record",
          "[crypto][secure_channel]") {
    std::array<std::byte, 32> key_bytes{};
    key_bytes.fill(std::byte{0x42});
    record_sealer whole(cipher::plaintext, symmetric_key(key_bytes), {});
    record_sealer prefixed(cipher::plaintext, symmetric_key(key_bytes), {});
    for (const std::size_t size : {0, 1, 1000, 65536}) {
        const byte_buffer payload(size, std::byte{0x5A});
        byte_buffer expected(whole.record_size(size));
        REQUIRE_FALSE(whole.seal(payload, expected));
        byte_buffer got(record_sealer::payload_offset);
        REQUIRE_FALSE(prefixed.seal_plaintext_prefix(size, got));
        got.insert(got.end(), payload.begin(), payload.end());
        CHECK(got == expected);
    }
    CHECK(prefixed.records_sealed() == whole.records_sealed());
    byte_buffer prefix(record_sealer::payload_offset);
    CHECK(prefixed.seal_plaintext_prefix(prefixed.max_payload_size() + 1, prefix) ==
          errc::message_too_large);
    byte_buffer close(prefixed.record_size(0));
    REQUIRE_FALSE(prefixed.seal_close(close));
    CHECK(prefixed.seal_plaintext_prefix(1, prefix) == errc::connection_closed);
    // Misuse: a sealed suite needs the payload to seal it, and the prefix has a fixed size.
    record_sealer secure(cipher::chacha20_poly1305, symmetric_key(key_bytes), {});
    CHECK_THROWS_AS(secure.seal_plaintext_prefix(1, prefix), std::logic_error);
    record_sealer fresh(cipher::plaintext, symmetric_key(key_bytes), {});
    byte_buffer short_prefix(record_sealer::payload_offset - 1);
    CHECK_THROWS_AS(fresh.seal_plaintext_prefix(1, short_prefix), std::invalid_argument);
}

TEST_CASE("a plaintext record opens from its prefix as it does whole", "[crypto][secure_channel]") {
    std::array<std::byte, 32> key_bytes{};
    key_bytes.fill(std::byte{0x42});
    const symmetric_key key(key_bytes);
    record_sealer sealer(cipher::plaintext, key);
    record_opener whole(cipher::plaintext, key), by_prefix(cipher::plaintext, key);
    for (const std::size_t size : {1, 7, 1000, 65536}) {
        CAPTURE(size);
        const auto payload = random_bytes(size, size);
        byte_buffer record;
        REQUIRE_FALSE(sealer.append(payload, record));
        for (const std::size_t head : {std::size_t{0}, std::size_t{1}, size}) {
            CAPTURE(head);
            record_type type{};
            std::span<std::byte> opened;
            byte_buffer copy = record;
            REQUIRE_FALSE(whole.open(copy, type, opened));
            std::span<std::byte> head_bytes;
            record_type prefix_type{};
            const auto prefix = std::span(record).first(5 + head);
            REQUIRE_FALSE(by_prefix.open_prefix(prefix, record.size(), prefix_type, head_bytes));
            CHECK(prefix_type == type);
            CHECK(head_bytes.data() == record.data() + 5); // a view of the prefix
            CHECK(
                byte_buffer(head_bytes.begin(), head_bytes.end()) ==
                byte_buffer(payload.begin(), payload.begin() + static_cast<std::ptrdiff_t>(head)));
            CHECK(by_prefix.records_opened() == whole.records_opened());
        }
    }
    // The same type checks as open(): a close record with a payload, an unknown type, a
    // key update (plaintext has no keys); each error sticks.
    for (const std::uint8_t type_byte : {1, 2, 0x80}) {
        CAPTURE(int{type_byte});
        record_opener opener(cipher::plaintext, key);
        byte_buffer record = {std::byte{3},         std::byte{0}, std::byte{0}, std::byte{0},
                              std::byte{type_byte}, std::byte{7}, std::byte{7}};
        record_type type{};
        std::span<std::byte> head;
        CHECK(opener.open_prefix(std::span(record).first(6), record.size(), type, head) ==
              errc::protocol_violation);
        CHECK(opener.open_prefix(std::span(record).first(6), record.size(), type, head) ==
              errc::protocol_violation);
    }
    record_opener opener(cipher::plaintext, key);
    byte_buffer record;
    REQUIRE_FALSE(sealer.append(random_bytes(100, 1), record));
    record_type type{};
    std::span<std::byte> head;
    // Misuse: a prefix without the type byte or longer than the record, a wrong record
    // size, an encrypted suite (its records authenticate only whole).
    CHECK_THROWS_AS(opener.open_prefix(std::span(record).first(4), record.size(), type, head),
                    std::invalid_argument);
    CHECK_THROWS_AS(opener.open_prefix(record, record.size() - 1, type, head),
                    std::invalid_argument);
    CHECK_THROWS_AS(opener.open_prefix(std::span(record).first(10), record.size() + 1, type, head),
                    std::invalid_argument);
    record_opener secure(cipher::chacha20_poly1305, key);
    CHECK_THROWS_AS(secure.open_prefix(record, record.size(), type, head), std::logic_error);
}
