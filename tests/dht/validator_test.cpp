#include <hivemesh/dht/storage.hpp>
#include <hivemesh/dht/validator.hpp>

#include <catch2/catch.hpp>

#include "dht/records.hpp"
#include "support/bytes.hpp"
#include "support/identities.hpp"
#include "support/time.hpp"

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

using hivemesh::byte_buffer;
using hivemesh::errc;
using hivemesh::time_point;
using hivemesh::crypto::identity;
using hivemesh::crypto::public_key;
using hivemesh::dht::owner_marker;
using hivemesh::dht::owner_validator;
using hivemesh::dht::record;
using hivemesh::dht::record_owner;
using hivemesh::dht::schema_validator;
using hivemesh::dht::signing_payload;
using hivemesh::dht::validator_chain;

namespace {

using hivemesh::test::at_seconds;
using hivemesh::test::bytes_of;
using hivemesh::test::identity_of;
using hivemesh::test::item;
using hivemesh::test::plain;

std::error_code code(errc e) {
    return make_error_code(e);
}

} // namespace

TEST_CASE("signing payload: exact, delimited encoding", "[dht][validator]") {
    record r = plain("k", "vw", time_point{std::chrono::nanoseconds(0x0102030405060708)});
    byte_buffer expected;
    const auto push = [&](std::initializer_list<int> values) {
        for (int v : values)
            expected.push_back(static_cast<std::byte>(v));
    };
    const auto push_text = [&](std::string_view s) {
        for (char c : s)
            expected.push_back(static_cast<std::byte>(c));
    };
    push({22, 0, 0, 0});
    push_text("hivemesh.dht.record.v1");
    push({1, 0, 0, 0});
    push_text("k");
    push({0}); // no subkey
    push({2, 0, 0, 0});
    push_text("vw");
    push({8, 7, 6, 5, 4, 3, 2, 1});
    CHECK(signing_payload(r) == expected);

    // With a subkey: presence byte, then the length-prefixed subkey.
    r.subkey = bytes_of("s");
    byte_buffer with_subkey(expected.begin(), expected.begin() + 4 + 22 + 4 + 1);
    for (int v : {1, 1, 0, 0, 0})
        with_subkey.push_back(static_cast<std::byte>(v));
    with_subkey.push_back(static_cast<std::byte>('s'));
    with_subkey.insert(with_subkey.end(), expected.begin() + 4 + 22 + 4 + 1 + 1, expected.end());
    CHECK(signing_payload(r) == with_subkey);

    // Field boundaries matter: none of these share a payload.
    const time_point t = at_seconds(5);
    const std::vector<record> distinct = {
        plain("ab", "c", t),
        plain("a", "bc", t),
        item("a", "b", "c", t),
        item("ab", "", "c", t),
        item("a", "", "bc", t),
        item("", "ab", "c", t),
        plain("ab", "c", at_seconds(6)),
        plain("", "", t),
        item("", "", "", t),
    };
    for (std::size_t i = 0; i < distinct.size(); ++i)
        for (std::size_t j = i + 1; j < distinct.size(); ++j)
            CHECK(signing_payload(distinct[i]) != signing_payload(distinct[j]));
    // The signature is not signed.
    record signed_record = plain("ab", "c", t);
    signed_record.signature = bytes_of("sig");
    CHECK(signing_payload(signed_record) == signing_payload(plain("ab", "c", t)));
}

TEST_CASE("owner markers: format and parsing", "[dht][validator]") {
    // Base58 of 32 zero bytes is 32 '1's.
    CHECK(owner_marker(public_key{}) == "[owner:" + std::string(32, '1') + "]");
    const identity alice = identity_of(1);
    const identity bob = identity_of(2);
    const std::string a = owner_marker(alice.public_key());
    const std::string b = owner_marker(bob.public_key());
    CHECK(a == "[owner:" + hivemesh::crypto::base58_encode(alice.public_key().view()) + "]");

    std::error_code ec = code(errc::corrupt_data);
    CHECK_FALSE(record_owner(plain("plain key", "v", at_seconds(1)), ec));
    CHECK_FALSE(ec);
    CHECK_FALSE(record_owner(item("key", "sub", "v", at_seconds(1)), ec));
    CHECK_FALSE(ec);
    // "owner" without the bracket form is no marker.
    CHECK_FALSE(record_owner(plain("owner:x] [owner", "v", at_seconds(1)), ec));
    CHECK_FALSE(ec);

    const auto owner_of = [&](const record& r) {
        auto owner = record_owner(r, ec);
        return owner;
    };
    CHECK(owner_of(plain("x" + a + "y", "v", at_seconds(1))) == alice.public_key());
    CHECK_FALSE(ec);
    CHECK(owner_of(item("key", a, "v", at_seconds(1))) == alice.public_key());
    CHECK(owner_of(item(a, "sub" + a, "v", at_seconds(1))) == alice.public_key());
    CHECK(owner_of(plain(a + a, "v", at_seconds(1))) == alice.public_key());
    CHECK_FALSE(ec);
    // A marker in the value protects nothing.
    CHECK_FALSE(owner_of(plain("key", a, at_seconds(1))));
    CHECK_FALSE(ec);

    // Conflicting markers, anywhere in key and subkey.
    CHECK_FALSE(owner_of(plain(a + b, "v", at_seconds(1))));
    CHECK(ec == code(errc::invalid_argument));
    CHECK_FALSE(owner_of(item(a, b, "v", at_seconds(1))));
    CHECK(ec == code(errc::invalid_argument));
    CHECK_FALSE(owner_of(item("k", a + "," + b, "v", at_seconds(1))));
    CHECK(ec == code(errc::invalid_argument));

    // Malformed markers make the record invalid rather than unprotected.
    for (const std::string& key :
         {std::string("[owner:]"), std::string("[owner:abc]"), std::string("[owner:0OIl]"),
          std::string("x[owner:"), a.substr(0, a.size() - 1),
          "[owner:1" + a.substr(7), // non-canonical leading '1'
          "[owner:" + a}) {
        INFO(key);
        CHECK_FALSE(owner_of(plain(key, "v", at_seconds(1))));
        CHECK(ec == code(errc::invalid_argument));
    }
}

TEST_CASE("parse_owner_marker: exactly one canonical marker names its key", "[dht][validator]") {
    using hivemesh::dht::parse_owner_marker;
    const identity alice = identity_of(1);
    const std::string a = owner_marker(alice.public_key());
    const auto parsed = parse_owner_marker(bytes_of(a));
    REQUIRE(parsed);
    CHECK(*parsed == alice.public_key());
    CHECK(parsed->id() == alice.id()); // the writer's PeerId, as readers derive it
    CHECK(parse_owner_marker(bytes_of("[owner:" + std::string(32, '1') + "]")) == public_key{});
    for (const std::string& text :
         {std::string(), std::string("[owner:]"), std::string("[owner:abc]"),
          std::string("[owner:0OIl]"), a.substr(0, a.size() - 1), "x" + a, a + "x", a + a,
          "[owner:1" + a.substr(7), // non-canonical leading '1'
          "[OWNER:" + a.substr(7), std::string(alice.id().view().size(), '1')}) {
        INFO(text);
        CHECK_FALSE(parse_owner_marker(bytes_of(text)));
    }
    // A PeerId's raw bytes are no marker.
    CHECK_FALSE(parse_owner_marker(alice.id().view()));
}

TEST_CASE("owner validator: unprotected records carry no signature", "[dht][validator]") {
    const owner_validator v(identity_of(1));
    record r = item("key", "sub", "value", at_seconds(10));
    CHECK_FALSE(v.validate(r));
    v.sign(r); // unprotected: nothing to sign
    CHECK(r.signature.empty());
    r.signature = byte_buffer(64, std::byte{7});
    CHECK(v.validate(r) == code(errc::bad_signature));
    CHECK(v.validate(plain("", "", at_seconds(1))) == std::error_code{});
}

TEST_CASE("owner validator: a signed protected record is accepted, any change refused",
          "[dht][validator]") {
    const identity alice = identity_of(1);
    const owner_validator mine(alice);
    const owner_validator other(identity_of(2));
    CHECK(mine.public_key() == alice.public_key());
    CHECK(mine.marker() == owner_marker(alice.public_key()));

    for (const bool with_subkey : {false, true}) {
        INFO("with subkey " << with_subkey);
        record r = with_subkey ? item("key" + mine.marker(), "sub", "value", at_seconds(10))
                               : plain("key" + mine.marker(), "value", at_seconds(10));
        CHECK(mine.validate(r) == code(errc::bad_signature)); // not signed yet
        mine.sign(r);
        const auto expected = alice.sign(signing_payload(r));
        CHECK(r.signature == byte_buffer(expected.view().begin(), expected.view().end()));
        CHECK_FALSE(mine.validate(r));
        CHECK_FALSE(other.validate(r)); // any node verifies it

        record changed = r;
        changed.value = bytes_of("valuf");
        CHECK(other.validate(changed) == code(errc::bad_signature));
        changed = r;
        changed.key = bytes_of("kez" + mine.marker());
        CHECK(other.validate(changed) == code(errc::bad_signature));
        changed = r;
        changed.expiration += std::chrono::nanoseconds(1);
        CHECK(other.validate(changed) == code(errc::bad_signature));
        changed = r;
        changed.subkey = with_subkey ? std::nullopt : std::optional<byte_buffer>(bytes_of("sub"));
        CHECK(other.validate(changed) == code(errc::bad_signature));
        if (with_subkey) {
            changed = r;
            changed.subkey = bytes_of("sua");
            CHECK(other.validate(changed) == code(errc::bad_signature));
        }
        changed = r;
        changed.signature[5] ^= std::byte{1};
        CHECK(other.validate(changed) == code(errc::bad_signature));
        changed = r;
        changed.signature.pop_back();
        CHECK(other.validate(changed) == code(errc::bad_signature));
        changed = r;
        changed.signature.push_back(std::byte{0});
        CHECK(other.validate(changed) == code(errc::bad_signature));
        changed = r;
        changed.signature.clear();
        CHECK(other.validate(changed) == code(errc::bad_signature));
    }
}

TEST_CASE("owner validator: a signature that verified is taken from the cache, nothing else is",
          "[dht][validator]") {
    const owner_validator mine(identity_of(1));
    const owner_validator reader(identity_of(2));
    record r = item("key" + mine.marker(), "sub", "value", at_seconds(10));
    mine.sign(r);
    CHECK_FALSE(reader.validate(r));
    CHECK_FALSE(reader.validate(r));
    CHECK_FALSE(reader.validate(r));
    CHECK(reader.verifications().verified == 1);
    CHECK(reader.verifications().hits == 2);
    // The same signature over other bytes is a new check, and fails each time.
    record forged = r;
    forged.value = bytes_of("valuf");
    CHECK(reader.validate(forged) == code(errc::bad_signature));
    CHECK(reader.validate(forged) == code(errc::bad_signature));
    CHECK(reader.verifications().verified == 3);
    CHECK(reader.verifications().hits == 2);
    // Unprotected records need no signature check at all.
    CHECK_FALSE(reader.validate(plain("open", "v", at_seconds(10))));
    CHECK(reader.verifications().verified == 3);
}

TEST_CASE("verified signatures: the oldest is forgotten past the capacity", "[dht][validator]") {
    hivemesh::dht::detail::verified_signatures cache(2);
    const identity alice = identity_of(1);
    std::vector<byte_buffer> messages{bytes_of("a"), bytes_of("b"), bytes_of("c")};
    std::vector<hivemesh::crypto::signature> signatures;
    for (const auto& m : messages)
        signatures.push_back(alice.sign(m));
    for (std::size_t i = 0; i < 3; ++i)
        CHECK(cache.verify(alice.public_key(), messages[i], signatures[i]));
    CHECK(cache.verify(alice.public_key(), messages[2], signatures[2])); // kept
    CHECK(cache.verify(alice.public_key(), messages[1], signatures[1])); // kept
    CHECK(cache.statistics().hits == 2);
    CHECK(cache.verify(alice.public_key(), messages[0], signatures[0])); // forgotten: verified
    CHECK(cache.statistics().verified == 4);
    // Another key with a valid signature of someone else's message: refused.
    CHECK_FALSE(cache.verify(identity_of(2).public_key(), messages[0], signatures[0]));
    CHECK(cache.statistics().verified == 5);
}

TEST_CASE("owner validator: another identity cannot write a protected subkey", "[dht][validator]") {
    const identity alice = identity_of(1);
    const identity bob = identity_of(2);
    const owner_validator alice_v(alice);
    const owner_validator bob_v(bob);

    // A shared dictionary where each subkey belongs to its writer.
    record by_alice = item("peers", alice_v.marker(), "alice's address", at_seconds(10));
    alice_v.sign(by_alice);
    CHECK_FALSE(bob_v.validate(by_alice));

    // Bob cannot sign it: his sign() leaves the record alone...
    record by_bob = item("peers", alice_v.marker(), "bob's lie", at_seconds(11));
    bob_v.sign(by_bob);
    CHECK(by_bob.signature.empty());
    CHECK(alice_v.validate(by_bob) == code(errc::bad_signature));
    // ...and signing it with his own key directly does not help.
    const auto forged = bob.sign(signing_payload(by_bob));
    by_bob.signature.assign(forged.view().begin(), forged.view().end());
    CHECK(alice_v.validate(by_bob) == code(errc::bad_signature));
    CHECK(bob_v.validate(by_bob) == code(errc::bad_signature));
    // Nor does replaying Alice's signature with a later expiration.
    record replayed = by_alice;
    replayed.expiration = at_seconds(11);
    CHECK(bob_v.validate(replayed) == code(errc::bad_signature));
    // Bob's sign() keeps a signature that is already there.
    record kept = by_alice;
    bob_v.sign(kept);
    CHECK(kept.signature == by_alice.signature);

    // Bob writes his own subkey of the same key.
    record own = item("peers", bob_v.marker(), "bob's address", at_seconds(10));
    bob_v.sign(own);
    CHECK_FALSE(alice_v.validate(own));

    // Through storage: only validated records reach store().
    hivemesh::dht::storage s;
    for (const record* r : {&by_alice, &by_bob, &own})
        if (!alice_v.validate(*r))
            CHECK(s.store(*r, at_seconds(0)) == hivemesh::dht::store_status::stored);
    const auto entry = s.get(hivemesh::dht::id::of_key(std::string_view("peers")), at_seconds(0));
    REQUIRE(entry);
    REQUIRE(entry->dictionary.size() == 2);
    CHECK(entry->dictionary.at(bytes_of(alice_v.marker())).value == bytes_of("alice's address"));
    CHECK(entry->dictionary.at(bytes_of(bob_v.marker())).value == bytes_of("bob's address"));
}

TEST_CASE("owner validator: conflicting markers are refused", "[dht][validator]") {
    const owner_validator alice_v(identity_of(1));
    const owner_validator bob_v(identity_of(2));
    record r = item(alice_v.marker(), bob_v.marker(), "v", at_seconds(10));
    alice_v.sign(r);
    CHECK(r.signature.empty());
    CHECK(alice_v.validate(r) == code(errc::invalid_argument));
    // Even with a valid signature by one of them.
    const identity alice = identity_of(1);
    const auto sig = alice.sign(signing_payload(r));
    r.signature.assign(sig.view().begin(), sig.view().end());
    CHECK(bob_v.validate(r) == code(errc::invalid_argument));
    CHECK(alice_v.validate(plain(alice_v.marker() + bob_v.marker(), "v", at_seconds(10))) ==
          code(errc::invalid_argument));
    CHECK(alice_v.validate(plain("[owner:nonsense]", "v", at_seconds(10))) ==
          code(errc::invalid_argument));
}

TEST_CASE("owner validator keeps its own copy of the identity", "[dht][validator]") {
    std::optional<owner_validator> v;
    public_key key;
    {
        identity temporary = identity_of(3);
        key = temporary.public_key();
        v.emplace(temporary);
    }
    record r = plain("x" + owner_marker(key), "v", at_seconds(10));
    v->sign(r);
    CHECK_FALSE(v->validate(r));
    identity moved_from = identity_of(4);
    const identity taken = std::move(moved_from);
    CHECK(taken.public_key() != key);
    CHECK_THROWS_AS(owner_validator(moved_from), std::logic_error);
}

TEST_CASE("schema validator: hook runs on keys under its prefix", "[dht][validator]") {
    int calls = 0;
    const schema_validator v(
        [&](const record& r) -> std::error_code {
            ++calls;
            return r.value.empty() ? code(errc::corrupt_data) : std::error_code{};
        },
        bytes_of("typed/"));
    CHECK(v.key_prefix() == bytes_of("typed/"));
    CHECK(v.validate(plain("typed/x", "", at_seconds(1))) == code(errc::corrupt_data));
    CHECK_FALSE(v.validate(plain("typed/x", "1", at_seconds(1))));
    CHECK_FALSE(v.validate(item("typed/", "s", "1", at_seconds(1))));
    CHECK(calls == 3);
    CHECK_FALSE(v.validate(plain("other/x", "", at_seconds(1))));
    CHECK_FALSE(v.validate(plain("typed", "", at_seconds(1))));
    CHECK_FALSE(v.validate(plain("", "", at_seconds(1))));
    CHECK(calls == 3);

    const schema_validator everything([](const record&) { return code(errc::invalid_argument); });
    CHECK(everything.validate(plain("", "", at_seconds(1))) == code(errc::invalid_argument));
    CHECK(everything.validate(plain("anything", "v", at_seconds(1))) ==
          code(errc::invalid_argument));
    record r = plain("k", "v", at_seconds(1));
    everything.sign(r); // the default sign() does nothing
    CHECK(r == plain("k", "v", at_seconds(1)));

    CHECK_THROWS_AS(schema_validator(nullptr), std::system_error);
}

TEST_CASE("validator chain: first error wins, signing runs every validator", "[dht][validator]") {
    validator_chain empty;
    CHECK(empty.empty());
    record garbage = plain("[owner:nonsense]", "", at_seconds(1));
    garbage.signature = bytes_of("not a signature");
    CHECK_FALSE(empty.validate(garbage));
    record untouched = garbage;
    empty.sign(untouched);
    CHECK(untouched == garbage);

    const identity alice = identity_of(1);
    std::vector<std::string> order;
    validator_chain chain;
    chain.add(std::make_shared<schema_validator>([&](const record& r) -> std::error_code {
        order.push_back("schema");
        return r.value == bytes_of("bad") ? code(errc::corrupt_data) : std::error_code{};
    }));
    chain.add(std::make_shared<owner_validator>(alice));
    chain.add(std::make_shared<schema_validator>(
        [&](const record&) -> std::error_code {
            order.push_back("last");
            return code(errc::remote_error);
        },
        bytes_of("fail/")));
    CHECK(chain.size() == 3);
    CHECK_FALSE(chain.empty());

    record r = plain("ok" + owner_marker(alice.public_key()), "good", at_seconds(10));
    CHECK(chain.validate(r) == code(errc::bad_signature));
    CHECK(order == std::vector<std::string>{"schema"});
    chain.sign(r);
    CHECK(r.signature.size() == 64);
    CHECK_FALSE(chain.validate(r));

    order.clear();
    record bad = plain("fail/" + owner_marker(alice.public_key()), "bad", at_seconds(10));
    chain.sign(bad);
    CHECK(chain.validate(bad) == code(errc::corrupt_data));
    CHECK(order == std::vector<std::string>{"schema"});
    bad.value = bytes_of("fine");
    chain.sign(bad); // re-signed over the new value
    order.clear();
    CHECK(chain.validate(bad) == code(errc::remote_error));
    CHECK(order == std::vector<std::string>{"schema", "last"});

    CHECK_THROWS_AS(chain.add(nullptr), std::system_error);
    CHECK(chain.size() == 3);
}
