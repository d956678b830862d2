#include <hivemesh/core/random.hpp>
#include <hivemesh/dht/storage.hpp>

#include <catch2/catch.hpp>

#include "dht/records.hpp"
#include "support/bytes.hpp"
#include "support/time.hpp"

#include <chrono>
#include <cstdint>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

using hivemesh::byte_buffer;
using hivemesh::time_point;
using hivemesh::dht::id;
using hivemesh::dht::key_entry;
using hivemesh::dht::record;
using hivemesh::dht::storage;
using hivemesh::dht::storage_limits;
using hivemesh::dht::store_status;

namespace {

using hivemesh::test::at_seconds;
using hivemesh::test::bytes_of;
using hivemesh::test::item;
using hivemesh::test::plain;

std::string text(const byte_buffer& b) {
    return std::string(hivemesh::as_string_view(b));
}

id key_of(std::string_view key) {
    return id::of_key(key);
}

// Subkey -> (value, expiration seconds) of a dictionary, for exact comparisons.
std::map<std::string, std::pair<std::string, std::int64_t>> dictionary_of(const key_entry& e) {
    std::map<std::string, std::pair<std::string, std::int64_t>> out;
    for (const auto& [subkey, value] : e.dictionary)
        out[text(subkey)] = {text(value.value), std::chrono::duration_cast<std::chrono::seconds>(
                                                    value.expiration.time_since_epoch())
                                                    .count()};
    return out;
}

} // namespace

TEST_CASE("plain value: only a strictly later expiration replaces it", "[dht][storage]") {
    storage s;
    REQUIRE(s.store(plain("k", "a", at_seconds(10)), at_seconds(0)) == store_status::stored);
    CHECK(s.store(plain("k", "b", at_seconds(10)), at_seconds(0)) == store_status::outdated);
    CHECK(s.store(plain("k", "c", at_seconds(9)), at_seconds(1)) == store_status::outdated);

    auto entry = s.get(key_of("k"), at_seconds(1));
    REQUIRE(entry);
    CHECK(text(entry->key) == "k");
    REQUIRE(entry->plain);
    CHECK(text(entry->plain->value) == "a");
    CHECK(entry->plain->expiration == at_seconds(10));
    CHECK(entry->dictionary.empty());

    CHECK(s.store(plain("k", "d", at_seconds(11)), at_seconds(2)) == store_status::stored);
    entry = s.get(key_of("k"), at_seconds(2));
    REQUIRE(entry);
    REQUIRE(entry->plain);
    CHECK(text(entry->plain->value) == "d");
    CHECK(entry->plain->expiration == at_seconds(11));
    CHECK(s.key_count() == 1);
    CHECK(s.contains(key_of("k"), at_seconds(2)));
    CHECK_FALSE(s.contains(key_of("other"), at_seconds(2)));
    CHECK_FALSE(s.get(key_of("other"), at_seconds(2)));
}

TEST_CASE("expired records are refused and expired items disappear", "[dht][storage]") {
    storage s;
    CHECK(s.store(plain("k", "v", at_seconds(5)), at_seconds(5)) == store_status::expired);
    CHECK(s.store(plain("k", "v", at_seconds(4)), at_seconds(5)) == store_status::expired);
    CHECK(s.store(item("k", "s", "v", at_seconds(5)), at_seconds(5)) == store_status::expired);
    CHECK(s.key_count() == 0);
    CHECK(s.bytes_used() == 0);

    REQUIRE(s.store(plain("k", "v", at_seconds(10)), at_seconds(0)) == store_status::stored);
    // Live until the expiration instant, gone at it.
    CHECK(s.contains(key_of("k"), at_seconds(9)));
    CHECK(s.get(key_of("k"), at_seconds(9)));
    CHECK_FALSE(s.contains(key_of("k"), at_seconds(10)));
    CHECK_FALSE(s.get(key_of("k"), at_seconds(10)));
    // Not purged yet, but a store at the same key sees an empty slot.
    CHECK(s.key_count() == 1);
    CHECK(s.store(plain("k", "w", at_seconds(11)), at_seconds(10)) == store_status::stored);
    CHECK(s.bytes_used() == storage::accounted_size(plain("k", "w", at_seconds(11))));
    CHECK(s.remove_expired(at_seconds(10)) == 0);
    CHECK(s.remove_expired(at_seconds(11)) == 1);
    CHECK(s.key_count() == 0);
    CHECK(s.bytes_used() == 0);
}

TEST_CASE("an expiration more than max_lifetime ahead is refused, at any clock value",
          "[dht][storage]") {
    using namespace std::chrono_literals;
    CHECK(storage_limits{}.max_lifetime == 5min);
    storage s;
    const time_point now = at_seconds(1000);
    CHECK(s.store(plain("k", "v", now + 5min), now) == store_status::stored);
    CHECK(s.store(plain("k", "w", now + 5min + 1ns), now) == store_status::too_far_ahead);
    CHECK(s.store(item("d", "s", "w", now + 5min + 1ns), now) == store_status::too_far_ahead);
    CHECK(s.store(plain("x", "w", now + 8760h), now) == store_status::too_far_ahead); // a year
    // Refusals change nothing; a moment later the same expiration fits.
    CHECK(s.key_count() == 1);
    CHECK(s.bytes_used() == storage::accounted_size(plain("k", "v", now + 5min)));
    CHECK(text(s.get(key_of("k"), now)->plain->value) == "v");
    CHECK(s.store(plain("k", "w", now + 5min + 1ns), now + 1ns) == store_status::stored);
    // Expired comes first: an expiration at or before now is expired, not too far ahead.
    CHECK(s.store(plain("k", "v", now), now) == store_status::expired);
    // Extreme clocks and expirations: no overflow.
    CHECK(s.store(plain("y", "v", time_point::max()), time_point::min()) ==
          store_status::too_far_ahead);
    CHECK(s.store(plain("y", "v", time_point::max()), now) == store_status::too_far_ahead);
    CHECK(s.store(plain("y", "v", time_point::min() + 5min), time_point::min()) ==
          store_status::stored);
    CHECK_FALSE(hivemesh::dht::too_far_ahead(time_point::max(), now, hivemesh::duration::max()));
    CHECK(hivemesh::dht::too_far_ahead(now + 1ns, now, -1s)); // a negative cap is zero
    CHECK_FALSE(hivemesh::dht::too_far_ahead(now, now, -1s));

    storage_limits longer;
    longer.max_lifetime = 24h;
    storage lenient(longer);
    CHECK(lenient.store(plain("k", "v", now + 24h), now) == store_status::stored);
    CHECK(lenient.store(plain("k", "v", now + 24h + 1ns), now) == store_status::too_far_ahead);
}

TEST_CASE("dictionary: subkeys merge one by one with their own expiration", "[dht][storage]") {
    storage s;
    REQUIRE(s.store(item("d", "a", "a1", at_seconds(10)), at_seconds(0)) == store_status::stored);
    REQUIRE(s.store(item("d", "b", "b1", at_seconds(20)), at_seconds(0)) == store_status::stored);
    REQUIRE(s.store(item("d", "c", "c1", at_seconds(15)), at_seconds(0)) == store_status::stored);

    auto entry = s.get(key_of("d"), at_seconds(0));
    REQUIRE(entry);
    CHECK_FALSE(entry->plain);
    CHECK(dictionary_of(*entry) ==
          decltype(dictionary_of(*entry)){{"a", {"a1", 10}}, {"b", {"b1", 20}}, {"c", {"c1", 15}}});
    CHECK(entry->expiration() == at_seconds(20));

    // Each subkey compares only with itself.
    CHECK(s.store(item("d", "a", "a2", at_seconds(10)), at_seconds(1)) == store_status::outdated);
    CHECK(s.store(item("d", "a", "a2", at_seconds(9)), at_seconds(1)) == store_status::outdated);
    CHECK(s.store(item("d", "a", "a3", at_seconds(12)), at_seconds(1)) == store_status::stored);
    CHECK(s.store(item("d", "b", "b2", at_seconds(18)), at_seconds(1)) == store_status::outdated);

    entry = s.get(key_of("d"), at_seconds(12));
    REQUIRE(entry);
    CHECK(dictionary_of(*entry) ==
          decltype(dictionary_of(*entry)){{"b", {"b1", 20}}, {"c", {"c1", 15}}});
    entry = s.get(key_of("d"), at_seconds(16));
    REQUIRE(entry);
    CHECK(dictionary_of(*entry) == decltype(dictionary_of(*entry)){{"b", {"b1", 20}}});
    CHECK_FALSE(s.get(key_of("d"), at_seconds(20)));
    CHECK(s.key_count() == 1);
    CHECK(s.remove_expired(at_seconds(20)) == 3);
    CHECK(s.key_count() == 0);
}

TEST_CASE("kind switch: a plain value must outlive the latest subkey", "[dht][storage]") {
    storage s;
    REQUIRE(s.store(item("k", "a", "a", at_seconds(10)), at_seconds(0)) == store_status::stored);
    REQUIRE(s.store(item("k", "b", "b", at_seconds(20)), at_seconds(0)) == store_status::stored);
    // Later than subkey a, but not than b: refused.
    CHECK(s.store(plain("k", "p", at_seconds(15)), at_seconds(0)) == store_status::outdated);
    CHECK(s.store(plain("k", "p", at_seconds(20)), at_seconds(0)) == store_status::outdated);
    auto entry = s.get(key_of("k"), at_seconds(0));
    REQUIRE(entry);
    CHECK(entry->dictionary.size() == 2);
    CHECK_FALSE(entry->plain);

    const record winner = plain("k", "p", at_seconds(21));
    CHECK(s.store(winner, at_seconds(0)) == store_status::stored);
    entry = s.get(key_of("k"), at_seconds(0));
    REQUIRE(entry);
    REQUIRE(entry->plain);
    CHECK(text(entry->plain->value) == "p");
    CHECK(entry->dictionary.empty());
    CHECK(s.bytes_used() == storage::accounted_size(winner));

    // Once b has expired only a (expired too) remains: a plain value is stored freely.
    storage t;
    REQUIRE(t.store(item("k", "a", "a", at_seconds(10)), at_seconds(0)) == store_status::stored);
    CHECK(t.store(plain("k", "p", at_seconds(11)), at_seconds(10)) == store_status::stored);
    CHECK(t.bytes_used() == storage::accounted_size(plain("k", "p", at_seconds(11))));
}

TEST_CASE("kind switch: a subkey must outlive the plain value", "[dht][storage]") {
    storage s;
    REQUIRE(s.store(plain("k", "p", at_seconds(10)), at_seconds(0)) == store_status::stored);
    CHECK(s.store(item("k", "a", "a", at_seconds(10)), at_seconds(0)) == store_status::outdated);
    CHECK(s.store(item("k", "a", "a", at_seconds(9)), at_seconds(0)) == store_status::outdated);
    auto entry = s.get(key_of("k"), at_seconds(0));
    REQUIRE(entry);
    REQUIRE(entry->plain);
    CHECK(text(entry->plain->value) == "p");

    const record winner = item("k", "a", "a", at_seconds(11));
    CHECK(s.store(winner, at_seconds(0)) == store_status::stored);
    entry = s.get(key_of("k"), at_seconds(0));
    REQUIRE(entry);
    CHECK_FALSE(entry->plain);
    CHECK(dictionary_of(*entry) == decltype(dictionary_of(*entry)){{"a", {"a", 11}}});
    CHECK(s.bytes_used() == storage::accounted_size(winner));

    // Further subkeys merge with the new dictionary as usual.
    CHECK(s.store(item("k", "b", "b", at_seconds(5)), at_seconds(0)) == store_status::stored);
    entry = s.get(key_of("k"), at_seconds(0));
    REQUIRE(entry);
    CHECK(dictionary_of(*entry) ==
          decltype(dictionary_of(*entry)){{"a", {"a", 11}}, {"b", {"b", 5}}});
}

TEST_CASE("falsy keys and subkeys work: empty key, subkey and value", "[dht][storage]") {
    storage s;
    const record empty_plain = plain("", "", at_seconds(10));
    REQUIRE(s.store(empty_plain, at_seconds(0)) == store_status::stored);
    auto entry = s.get(id::of_key(std::string_view{}), at_seconds(0));
    REQUIRE(entry);
    CHECK(entry->key.empty());
    REQUIRE(entry->plain);
    CHECK(entry->plain->value.empty());
    CHECK(s.bytes_used() == storage::item_overhead);

    REQUIRE(s.store(item("k", "", "", at_seconds(10)), at_seconds(0)) == store_status::stored);
    REQUIRE(s.store(item("k", "x", "0", at_seconds(10)), at_seconds(0)) == store_status::stored);
    entry = s.get(key_of("k"), at_seconds(0));
    REQUIRE(entry);
    CHECK_FALSE(entry->plain);
    CHECK(dictionary_of(*entry) ==
          decltype(dictionary_of(*entry)){{"", {"", 10}}, {"x", {"0", 10}}});
    // The empty subkey is a slot like any other.
    CHECK(s.store(item("k", "", "again", at_seconds(10)), at_seconds(0)) == store_status::outdated);
    CHECK(s.store(item("", "", "", at_seconds(11)), at_seconds(0)) == store_status::stored);
    entry = s.get(id::of_key(std::string_view{}), at_seconds(0));
    REQUIRE(entry);
    CHECK_FALSE(entry->plain);
    CHECK(dictionary_of(*entry) == decltype(dictionary_of(*entry)){{"", {"", 11}}});
}

TEST_CASE("size limits: key, subkey, value and signature", "[dht][storage]") {
    storage_limits limits;
    limits.max_key_size = 4;
    limits.max_subkey_size = 3;
    limits.max_value_size = 5;
    storage s(limits);
    CHECK(s.limits().max_key_size == 4);

    CHECK(s.store(plain("kkkk", "vvvvv", at_seconds(10)), at_seconds(0)) == store_status::stored);
    CHECK(s.store(plain("kkkkk", "v", at_seconds(10)), at_seconds(0)) == store_status::too_large);
    CHECK(s.store(plain("k", "vvvvvv", at_seconds(10)), at_seconds(0)) == store_status::too_large);
    CHECK(s.store(item("d", "sss", "v", at_seconds(10)), at_seconds(0)) == store_status::stored);
    CHECK(s.store(item("d", "ssss", "v", at_seconds(10)), at_seconds(0)) ==
          store_status::too_large);

    record signed_record = plain("s", "v", at_seconds(10));
    signed_record.signature.assign(hivemesh::dht::max_signature_size, std::byte{1});
    CHECK(s.store(signed_record, at_seconds(0)) == store_status::stored);
    signed_record.signature.push_back(std::byte{1});
    signed_record.expiration = at_seconds(11);
    CHECK(s.store(signed_record, at_seconds(0)) == store_status::too_large);

    // Size is checked before expiration.
    CHECK(s.store(plain("kkkkk", "v", at_seconds(0)), at_seconds(5)) == store_status::too_large);
    CHECK(s.key_count() == 3);
}

TEST_CASE("subkey count limit: new subkeys refused, replacements and expired slots fine",
          "[dht][storage]") {
    storage_limits limits;
    limits.max_subkeys_per_key = 3;
    storage s(limits);
    REQUIRE(s.store(item("d", "a", "v", at_seconds(10)), at_seconds(0)) == store_status::stored);
    REQUIRE(s.store(item("d", "b", "v", at_seconds(20)), at_seconds(0)) == store_status::stored);
    REQUIRE(s.store(item("d", "c", "v", at_seconds(20)), at_seconds(0)) == store_status::stored);
    CHECK(s.store(item("d", "e", "v", at_seconds(20)), at_seconds(0)) ==
          store_status::too_many_subkeys);
    // Replacing an existing subkey is fine.
    CHECK(s.store(item("d", "a", "w", at_seconds(11)), at_seconds(0)) == store_status::stored);
    // An outdated replacement is outdated, not too many.
    CHECK(s.store(item("d", "b", "w", at_seconds(20)), at_seconds(0)) == store_status::outdated);
    // Another key has its own count.
    CHECK(s.store(item("e", "e", "v", at_seconds(20)), at_seconds(0)) == store_status::stored);
    // Once a expires, its slot frees up.
    CHECK(s.store(item("d", "e", "v", at_seconds(20)), at_seconds(11)) == store_status::stored);
    auto entry = s.get(key_of("d"), at_seconds(11));
    REQUIRE(entry);
    CHECK(dictionary_of(*entry) ==
          decltype(dictionary_of(*entry)){{"b", {"v", 20}}, {"c", {"v", 20}}, {"e", {"v", 20}}});
    // A plain value that outlives the dictionary still replaces it.
    CHECK(s.store(plain("d", "p", at_seconds(21)), at_seconds(11)) == store_status::stored);

    limits.max_subkeys_per_key = 0;
    storage none(limits);
    CHECK(none.store(item("d", "a", "v", at_seconds(10)), at_seconds(0)) ==
          store_status::too_many_subkeys);
    CHECK(none.store(plain("d", "v", at_seconds(10)), at_seconds(0)) == store_status::stored);
    CHECK(none.store(item("d", "a", "v", at_seconds(11)), at_seconds(0)) ==
          store_status::too_many_subkeys);
}

TEST_CASE("total bytes limit: refuse when full, after purging expired items", "[dht][storage]") {
    const std::string value(100, 'x');
    const std::size_t item_bytes = 2 + value.size() + storage::item_overhead;
    REQUIRE(storage::accounted_size(plain("k1", value, at_seconds(10))) == item_bytes);
    REQUIRE(storage::accounted_size(item("k1", "s", value, at_seconds(10))) == item_bytes + 1);

    storage_limits limits;
    limits.max_total_bytes = 3 * item_bytes;
    storage s(limits);
    REQUIRE(s.store(plain("k1", value, at_seconds(100)), at_seconds(0)) == store_status::stored);
    REQUIRE(s.store(plain("k2", value, at_seconds(10)), at_seconds(0)) == store_status::stored);
    REQUIRE(s.store(plain("k3", value, at_seconds(100)), at_seconds(0)) == store_status::stored);
    CHECK(s.bytes_used() == 3 * item_bytes);
    CHECK(s.store(plain("k4", value, at_seconds(100)), at_seconds(0)) ==
          store_status::storage_full);
    CHECK(s.store(item("k1", "s", "", at_seconds(100)), at_seconds(0)) == store_status::outdated);
    CHECK(s.bytes_used() == 3 * item_bytes);

    // Replacing with an item of the same size fits, a larger one does not, a smaller one does.
    CHECK(s.store(plain("k1", value, at_seconds(101)), at_seconds(0)) == store_status::stored);
    CHECK(s.store(plain("k1", value + "y", at_seconds(102)), at_seconds(0)) ==
          store_status::storage_full);
    CHECK(s.store(plain("k1", "small", at_seconds(102)), at_seconds(0)) == store_status::stored);
    CHECK(s.bytes_used() == 2 * item_bytes + 2 + 5 + storage::item_overhead);
    CHECK(s.store(plain("k1", value, at_seconds(103)), at_seconds(0)) == store_status::stored);
    CHECK(s.bytes_used() == 3 * item_bytes);

    // k2 expired at 10: the store purges it and fits.
    CHECK(s.store(plain("k4", value, at_seconds(100)), at_seconds(10)) == store_status::stored);
    CHECK(s.bytes_used() == 3 * item_bytes);
    CHECK(s.key_count() == 3);
    CHECK_FALSE(s.get(key_of("k2"), at_seconds(0)));

    // An item larger than the whole storage never fits.
    storage_limits tiny;
    tiny.max_total_bytes = storage::item_overhead;
    storage t(tiny);
    CHECK(t.store(plain("", "", at_seconds(10)), at_seconds(0)) == store_status::stored);
    CHECK(t.store(plain("k", "", at_seconds(10)), at_seconds(0)) == store_status::storage_full);
    CHECK(t.bytes_used() == storage::item_overhead);
}

TEST_CASE("re-storing the same value does not grow storage", "[dht][storage]") {
    storage s;
    const record p = plain("key", "value", at_seconds(10));
    const record d = item("dict", "subkey", "value", at_seconds(10));
    REQUIRE(s.store(p, at_seconds(0)) == store_status::stored);
    REQUIRE(s.store(d, at_seconds(0)) == store_status::stored);
    const std::size_t expected = storage::accounted_size(p) + storage::accounted_size(d);
    CHECK(s.bytes_used() == expected);
    for (std::int64_t t = 11; t < 111; ++t) {
        record p2 = p, d2 = d;
        p2.expiration = d2.expiration = at_seconds(t);
        REQUIRE(s.store(p2, at_seconds(0)) == store_status::stored);
        REQUIRE(s.store(d2, at_seconds(0)) == store_status::stored);
        // The very record again is stored again; an earlier one is outdated.
        REQUIRE(s.store(p2, at_seconds(0)) == store_status::stored);
        REQUIRE(s.store(d2, at_seconds(0)) == store_status::stored);
        record p1 = p2, other = p2;
        p1.expiration = at_seconds(t - 1);
        other.value = bytes_of("other");
        REQUIRE(s.store(p1, at_seconds(0)) == store_status::outdated);
        REQUIRE(s.store(other, at_seconds(0)) == store_status::outdated);
        REQUIRE(s.bytes_used() == expected);
    }
    CHECK(s.key_count() == 2);
}

TEST_CASE("remove_expired counts items, and erase removes a key", "[dht][storage]") {
    storage s;
    REQUIRE(s.store(plain("p", "v", at_seconds(10)), at_seconds(0)) == store_status::stored);
    REQUIRE(s.store(item("d", "a", "v", at_seconds(5)), at_seconds(0)) == store_status::stored);
    const record b = item("d", "b", "v", at_seconds(15));
    REQUIRE(s.store(b, at_seconds(0)) == store_status::stored);
    CHECK(s.remove_expired(at_seconds(4)) == 0);
    CHECK(s.remove_expired(at_seconds(5)) == 1);
    CHECK(s.key_count() == 2);
    CHECK(s.remove_expired(at_seconds(5)) == 0);
    CHECK(s.remove_expired(at_seconds(10)) == 1);
    CHECK(s.key_count() == 1);
    CHECK(s.bytes_used() == storage::accounted_size(b));
    CHECK(s.erase(key_of("d")));
    CHECK_FALSE(s.erase(key_of("d")));
    CHECK(s.key_count() == 0);
    CHECK(s.bytes_used() == 0);
    CHECK(s.remove_expired(at_seconds(100)) == 0);
    // Erase also takes expired items with it, and the storage keeps working afterwards.
    REQUIRE(s.store(plain("p", "v", at_seconds(20)), at_seconds(0)) == store_status::stored);
    CHECK(s.erase(key_of("p")));
    CHECK(s.store(plain("p", "v", at_seconds(20)), at_seconds(0)) == store_status::stored);
    CHECK(s.remove_expired(at_seconds(20)) == 1);
    CHECK(s.bytes_used() == 0);
}

TEST_CASE("for_each visits live keys with their live items only", "[dht][storage]") {
    storage s;
    REQUIRE(s.store(plain("gone", "v", at_seconds(10)), at_seconds(0)) == store_status::stored);
    REQUIRE(s.store(plain("p", "pv", at_seconds(30)), at_seconds(0)) == store_status::stored);
    REQUIRE(s.store(item("d", "a", "av", at_seconds(10)), at_seconds(0)) == store_status::stored);
    REQUIRE(s.store(item("d", "b", "bv", at_seconds(30)), at_seconds(0)) == store_status::stored);
    REQUIRE(s.store(item("d2", "a", "av", at_seconds(10)), at_seconds(0)) == store_status::stored);

    std::map<id, key_entry> seen;
    s.for_each(at_seconds(20), [&](const id& key, const key_entry& entry) {
        CHECK(seen.emplace(key, entry).second);
    });
    REQUIRE(seen.size() == 2);
    REQUIRE(seen.count(key_of("p")) == 1);
    REQUIRE(seen.count(key_of("d")) == 1);
    const key_entry& p = seen.at(key_of("p"));
    CHECK(text(p.key) == "p");
    REQUIRE(p.plain);
    CHECK(text(p.plain->value) == "pv");
    const key_entry& d = seen.at(key_of("d"));
    CHECK(text(d.key) == "d");
    CHECK(dictionary_of(d) == decltype(dictionary_of(d)){{"b", {"bv", 30}}});

    // The visit changes nothing.
    CHECK(s.key_count() == 4);
    std::size_t visits = 0;
    s.for_each(at_seconds(0), [&](const id&, const key_entry&) { ++visits; });
    CHECK(visits == 4);
    s.for_each(at_seconds(30), [&](const id&, const key_entry&) { ++visits; });
    CHECK(visits == 4);
}

namespace {

// A naive reference model of the storage rules, written from the specification.
struct model {
    struct slot {
        std::string value;
        std::int64_t expiration;
    };
    struct entry {
        std::optional<slot> plain;
        std::map<std::string, slot> dictionary;
    };
    std::map<std::string, entry> entries;
    std::size_t max_subkeys;
    std::size_t max_bytes;

    static std::size_t cost(const std::string& key, const std::string* subkey,
                            const std::string& value) {
        return key.size() + (subkey ? subkey->size() : 0) + value.size() + storage::item_overhead;
    }
    std::size_t bytes() const {
        std::size_t total = 0;
        for (const auto& [key, e] : entries) {
            if (e.plain) total += cost(key, nullptr, e.plain->value);
            for (const auto& [subkey, s] : e.dictionary)
                total += cost(key, &subkey, s.value);
        }
        return total;
    }
    void purge(std::int64_t now) {
        for (auto it = entries.begin(); it != entries.end();) {
            auto& e = it->second;
            if (e.plain && e.plain->expiration <= now) e.plain.reset();
            std::erase_if(e.dictionary,
                          [&](const auto& kv) { return kv.second.expiration <= now; });
            it = !e.plain && e.dictionary.empty() ? entries.erase(it) : std::next(it);
        }
    }
    store_status store(const std::string& key, const std::optional<std::string>& subkey,
                       const std::string& value, std::int64_t expiration, std::int64_t now) {
        if (expiration <= now) return store_status::expired;
        entry next = entries.count(key) ? entries.at(key) : entry{};
        if (next.plain && next.plain->expiration <= now) next.plain.reset();
        std::erase_if(next.dictionary, [&](const auto& kv) { return kv.second.expiration <= now; });
        if (!subkey) {
            std::int64_t latest =
                next.plain ? next.plain->expiration : std::numeric_limits<std::int64_t>::min();
            for (const auto& [s, v] : next.dictionary)
                latest = std::max(latest, v.expiration);
            if (next.plain && next.plain->value == value && next.plain->expiration == expiration)
                return store_status::stored; // the record held: nothing changes
            if (expiration <= latest) return store_status::outdated;
            next = entry{slot{value, expiration}, {}};
        } else {
            if (next.plain) {
                if (expiration <= next.plain->expiration) return store_status::outdated;
                next.plain.reset();
            }
            const auto found = next.dictionary.find(*subkey);
            if (found != next.dictionary.end() && found->second.value == value &&
                found->second.expiration == expiration)
                return store_status::stored;
            if (found != next.dictionary.end() && expiration <= found->second.expiration)
                return store_status::outdated;
            if (found == next.dictionary.end() && next.dictionary.size() >= max_subkeys)
                return store_status::too_many_subkeys;
            next.dictionary[*subkey] = slot{value, expiration};
        }
        auto trial = *this;
        trial.entries[key] = next;
        if (trial.bytes() > max_bytes) {
            trial.purge(now);
            if (trial.bytes() > max_bytes) {
                purge(now);
                return store_status::storage_full;
            }
        }
        *this = std::move(trial);
        return store_status::stored;
    }
};

} // namespace

TEST_CASE("random operations match a reference model", "[dht][storage]") {
    const auto seed = GENERATE(1u, 2u, 3u, 4u, 5u, 6u, 7u, 8u);
    hivemesh::random_generator rng(seed);
    storage_limits limits;
    limits.max_subkeys_per_key = 3;
    limits.max_total_bytes = 8 * (storage::item_overhead + 4);
    storage s(limits);
    model m{{}, limits.max_subkeys_per_key, limits.max_total_bytes};

    const std::vector<std::string> keys = {"", "a", "b", "c", "dd"};
    const std::vector<std::string> subkeys = {"", "x", "y", "z", "w"};
    std::map<store_status, int> outcomes;
    std::int64_t now = 0;
    for (int step = 0; step < 3000; ++step) {
        now += static_cast<std::int64_t>(rng.uniform(3));
        const std::string& key = keys[rng.uniform(keys.size())];
        std::optional<std::string> subkey;
        if (rng.uniform(2) == 0) subkey = subkeys[rng.uniform(subkeys.size())];
        const std::string value(rng.uniform(3), static_cast<char>('a' + rng.uniform(26)));
        const std::int64_t expiration = now - 2 + static_cast<std::int64_t>(rng.uniform(20));

        record r{bytes_of(key), std::nullopt, bytes_of(value), at_seconds(expiration), {}};
        if (subkey) r.subkey = bytes_of(*subkey);
        const store_status expected = m.store(key, subkey, value, expiration, now);
        INFO("step " << step << " key '" << key << "' subkey " << (subkey ? *subkey : "-")
                     << " expiration " << expiration << " now " << now);
        REQUIRE(to_string(s.store(r, at_seconds(now))) == to_string(expected));
        ++outcomes[expected];

        if (step % 7 == 0) {
            // Compare the live contents.
            std::map<std::string, std::string> model_view, storage_view;
            for (const auto& [k, e] : m.entries) {
                if (e.plain && e.plain->expiration > now)
                    model_view[k + "|"] =
                        e.plain->value + "@" + std::to_string(e.plain->expiration);
                for (const auto& [sk, v] : e.dictionary)
                    if (v.expiration > now)
                        model_view[k + "|" + sk + "|"] =
                            v.value + "@" + std::to_string(v.expiration);
            }
            for (const auto& k : keys) {
                const auto entry = s.get(key_of(k), at_seconds(now));
                CHECK(static_cast<bool>(entry) == s.contains(key_of(k), at_seconds(now)));
                if (!entry) continue;
                const auto seconds = [](time_point t) {
                    return std::to_string(
                        std::chrono::duration_cast<std::chrono::seconds>(t.time_since_epoch())
                            .count());
                };
                if (entry->plain)
                    storage_view[k + "|"] =
                        text(entry->plain->value) + "@" + seconds(entry->plain->expiration);
                for (const auto& [sk, v] : entry->dictionary)
                    storage_view[k + "|" + text(sk) + "|"] =
                        text(v.value) + "@" + seconds(v.expiration);
            }
            REQUIRE(storage_view == model_view);
        }
        if (step % 97 == 0) {
            m.purge(now);
            s.remove_expired(at_seconds(now));
            REQUIRE(s.bytes_used() == m.bytes());
            REQUIRE(s.key_count() == m.entries.size());
        }
    }
    // The walk reached every rule the model knows (sizes are tested elsewhere).
    for (const auto status : {store_status::stored, store_status::outdated, store_status::expired,
                              store_status::too_many_subkeys, store_status::storage_full}) {
        INFO(to_string(status));
        CHECK(outcomes[status] > 0);
    }
}
