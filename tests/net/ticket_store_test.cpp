#include "support/identities.hpp"

#include <hivemesh/net/ticket_store.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>

using namespace hivemesh;
using namespace std::chrono_literals;
using hivemesh::test::identity_of;

namespace {

/// A ticket for the peer of identity `peer`, its id and secret filled with `fill`.
crypto::resumption_ticket ticket_for(std::uint8_t peer, std::uint8_t fill) {
    crypto::resumption_ticket ticket;
    ticket.id.fill(std::byte{fill});
    std::array<std::byte, 32> secret;
    secret.fill(std::byte{fill});
    ticket.secret = crypto::symmetric_key(secret);
    ticket.remote_key = identity_of(peer).public_key();
    return ticket;
}

} // namespace

TEST_CASE("the ticket store finds a peer's ticket by peer and by id until it expires",
          "[net][tickets]") {
    net::detail::ticket_store store(8);
    const time_point t0{};
    store.insert(ticket_for(1, 0xA1), t0, 10s);
    store.insert(ticket_for(2, 0xB2), t0 + 1s, 10s);
    CHECK(store.size() == 2);
    const auto by_peer = store.for_peer(identity_of(1).id(), t0 + 9s);
    REQUIRE(by_peer);
    CHECK(by_peer->id == ticket_for(1, 0xA1).id);
    CHECK(by_peer->remote_key == identity_of(1).public_key());
    const auto by_id = store.with_id(ticket_for(2, 0xB2).id, t0 + 10s);
    REQUIRE(by_id);
    CHECK(by_id->remote_key == identity_of(2).public_key());
    CHECK_FALSE(store.with_id(ticket_for(3, 0xC3).id, t0));
    CHECK_FALSE(store.for_peer(identity_of(3).id(), t0));

    // A peer's new ticket replaces its old one, under both lookups.
    store.insert(ticket_for(1, 0xA2), t0 + 2s, 10s);
    CHECK(store.size() == 2);
    CHECK_FALSE(store.with_id(ticket_for(1, 0xA1).id, t0 + 2s));
    CHECK(store.for_peer(identity_of(1).id(), t0 + 2s)->id == ticket_for(1, 0xA2).id);

    // At its expiry a ticket is gone, and looking for it forgets it.
    CHECK_FALSE(store.for_peer(identity_of(2).id(), t0 + 11s));
    CHECK(store.size() == 1);
    CHECK_FALSE(store.with_id(ticket_for(1, 0xA2).id, t0 + 12s));
    CHECK(store.size() == 0);

    store.insert(ticket_for(4, 0xD4), t0, 10s);
    store.erase(identity_of(4).id());
    CHECK_FALSE(store.with_id(ticket_for(4, 0xD4).id, t0));
    store.erase(identity_of(4).id()); // nothing left to forget
    CHECK(store.size() == 0);
}

TEST_CASE("a full ticket store drops the expired tickets, else the one that expires first",
          "[net][tickets]") {
    net::detail::ticket_store store(3);
    const time_point t0{};
    store.insert(ticket_for(1, 1), t0 + 2s, 10s); // expires at 12 s
    store.insert(ticket_for(2, 2), t0, 10s);      // at 10 s
    store.insert(ticket_for(3, 3), t0 + 1s, 10s); // at 11 s
    store.insert(ticket_for(4, 4), t0 + 3s, 10s);
    CHECK(store.size() == 3);
    CHECK_FALSE(store.for_peer(identity_of(2).id(), t0 + 3s));
    CHECK_FALSE(store.with_id(ticket_for(2, 2).id, t0 + 3s));
    for (const std::uint8_t kept : {1, 3, 4})
        CHECK(store.for_peer(identity_of(kept).id(), t0 + 3s));

    // At 11.5 s peer 3's ticket has expired: it goes, and both others stay.
    store.insert(ticket_for(5, 5), t0 + 11500ms, 10s);
    CHECK(store.size() == 3);
    CHECK_FALSE(store.with_id(ticket_for(3, 3).id, t0 + 11500ms));
    for (const std::uint8_t kept : {1, 4, 5})
        CHECK(store.for_peer(identity_of(kept).id(), t0 + 11500ms));

    net::detail::ticket_store none(0);
    none.insert(ticket_for(1, 1), t0, 10s);
    CHECK(none.size() == 0);
    CHECK_FALSE(none.for_peer(identity_of(1).id(), t0));
}
