#include "hivemesh/dht/routing_table.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <set>
#include <stdexcept>
#include <utility>
#include <vector>

using hivemesh::random_generator;
using hivemesh::time_point;
using hivemesh::crypto::peer_id;
using hivemesh::dht::contact;
using hivemesh::dht::id;
using hivemesh::dht::routing_options;
using hivemesh::dht::routing_table;
using namespace std::chrono_literals;

namespace {

using table = routing_table<int>;
using contact_t = contact<int>;
using seen = table::seen_result;

const time_point t0 = time_point{} + 1000h;

peer_id random_peer(random_generator& rng) {
    peer_id::bytes_type bytes{};
    for (auto& b : bytes)
        b = static_cast<std::byte>(rng.uniform(256));
    return peer_id(bytes);
}

contact_t make_contact(random_generator& rng, int endpoint = 0) {
    const peer_id peer = random_peer(rng);
    return {id::of_peer(peer), peer, endpoint};
}

// A real contact (id = of_peer) whose id starts with the first `bits` bits of `prefix`.
contact_t contact_with_prefix(random_generator& rng, const id& prefix, std::size_t bits,
                              int endpoint = 0) {
    for (;;) {
        contact_t c = make_contact(rng, endpoint);
        if (common_prefix_length(c.id, prefix) >= bits) return c;
    }
}

// The id with the first bit flipped: a prefix of the half of the space we are not in.
id far_prefix(const id& self) {
    id out = self;
    out.set_bit(0, !self.bit(0));
    return out;
}

bool inside(const table::bucket_info& bucket, const id& value) {
    return common_prefix_length(bucket.prefix, value) >= bucket.depth;
}

std::size_t bucket_of(const table& t, const id& value) {
    const auto buckets = t.buckets();
    for (std::size_t i = 0; i < buckets.size(); ++i)
        if (inside(buckets[i], value)) return i;
    FAIL("no bucket covers " << value);
    return 0;
}

// The first id after the bucket's range, or nullopt for the last bucket (carry out).
std::optional<id> range_end(const table::bucket_info& bucket) {
    if (bucket.depth == 0) return std::nullopt;
    id out = bucket.prefix;
    for (std::size_t i = bucket.depth; i-- > 0;) {
        if (!out.bit(i)) {
            out.set_bit(i, true);
            return out;
        }
        out.set_bit(i, false);
    }
    return std::nullopt;
}

// Structural invariants that hold after any sequence of calls.
void check_invariants(const table& t, const routing_options& options) {
    const auto buckets = t.buckets();
    REQUIRE(buckets.size() == t.bucket_count());
    REQUIRE_FALSE(buckets.empty());
    CHECK(buckets.front().prefix == id());
    std::size_t total = 0;
    for (std::size_t i = 0; i < buckets.size(); ++i) {
        const auto& b = buckets[i];
        // Bits past the depth are zero, and consecutive ranges touch: a partition.
        for (std::size_t bit = b.depth; bit < id::bits; ++bit)
            CHECK_FALSE(b.prefix.bit(bit));
        const auto end = range_end(b);
        if (i + 1 < buckets.size()) {
            REQUIRE(end.has_value());
            CHECK(*end == buckets[i + 1].prefix);
        } else {
            CHECK_FALSE(end.has_value());
        }
        CHECK(b.size <= options.k);
        CHECK(b.replacements <= options.replacement_cache_size);
        if (b.replacements > 0) CHECK(b.size == options.k); // caches wait only for full buckets
        total += b.size;
    }
    CHECK(total == t.size());

    std::size_t visited = 0;
    std::set<id> ids;
    t.for_each([&](const contact_t& c) {
        ++visited;
        ids.insert(c.id);
        CHECK(c.id != t.self());
        REQUIRE(t.find(c.id) != nullptr);
        CHECK(*t.find(c.id) == c);
    });
    CHECK(visited == t.size());
    CHECK(ids.size() == t.size());
}

std::size_t buckets_after_random_inserts(std::uint64_t seed, routing_options options,
                                         std::size_t count) {
    random_generator rng(seed);
    table t(id::random(rng), options);
    for (std::size_t i = 0; i < count; ++i) {
        // Random ids used directly: the table must read only contact.id.
        const contact_t c{id::random(rng), peer_id(), static_cast<int>(i)};
        t.on_seen(c, t0);
    }
    check_invariants(t, options);
    return t.bucket_count();
}

// The oracle: every contact's distance computed, all sorted, the first `count` kept.
std::vector<contact_t> brute_force_nearest(const std::vector<contact_t>& all, const id& target,
                                           std::size_t count, const id* exclude) {
    std::vector<std::pair<id, std::size_t>> by_distance;
    for (std::size_t i = 0; i < all.size(); ++i)
        if (exclude == nullptr || all[i].id != *exclude)
            by_distance.emplace_back(all[i].id ^ target, i);
    std::sort(by_distance.begin(), by_distance.end());
    std::vector<contact_t> out;
    for (std::size_t i = 0; i < std::min(count, by_distance.size()); ++i)
        out.push_back(all[by_distance[i].second]);
    return out;
}

struct opaque_endpoint { // no operator==
    int port;
};

} // namespace

static_assert(std::equality_comparable<contact<int>>);
static_assert(!std::equality_comparable<contact<opaque_endpoint>>);

TEST_CASE("10,000 random ids with k = 20, b = 5 give 45 to 65 buckets", "[dht]") {
    const routing_options options{.k = 20, .b = 5};
    // The count is a random variable: every seed must land in range.
    for (std::uint64_t seed = 1; seed <= 6; ++seed) {
        const std::size_t buckets = buckets_after_random_inserts(seed, options, 10'000);
        INFO("seed " << seed << ": " << buckets << " buckets");
        WARN("k=20 b=5 seed " << seed << ": " << buckets << " buckets");
        CHECK(buckets >= 45);
        CHECK(buckets <= 65);
    }
}

TEST_CASE("10,000 random ids with k = 20, b = 1 give 7 to 15 buckets", "[dht]") {
    const routing_options options{.k = 20, .b = 1};
    for (std::uint64_t seed = 1; seed <= 6; ++seed) {
        const std::size_t buckets = buckets_after_random_inserts(seed, options, 10'000);
        INFO("seed " << seed << ": " << buckets << " buckets");
        WARN("k=20 b=1 seed " << seed << ": " << buckets << " buckets");
        CHECK(buckets >= 7);
        CHECK(buckets <= 15);
    }
}

TEST_CASE("nearest matches brute force", "[dht]") {
    struct config {
        routing_options options;
        std::size_t contacts;
    };
    const config configs[] = {
        {{.k = 20, .b = 5}, 1000},
        {{.k = 20, .b = 1}, 600},
        {{.k = 4, .b = 2}, 400},
    };
    std::uint64_t seed = 10;
    for (const config& cfg : configs) {
        random_generator rng(seed++);
        table t(id::of_peer(random_peer(rng)), cfg.options);
        std::vector<contact_t> stored; // contacts the table reported as added
        for (std::size_t i = 0; i < cfg.contacts; ++i) {
            const contact_t c = make_contact(rng, static_cast<int>(i));
            if (t.on_seen(c, t0).result == seen::added) stored.push_back(c);
        }
        INFO("k=" << cfg.options.k << " b=" << cfg.options.b << ": " << stored.size()
                  << " contacts in " << t.bucket_count() << " buckets");
        REQUIRE(t.size() == stored.size());
        REQUIRE(t.bucket_count() > 1);
        check_invariants(t, cfg.options);

        const std::size_t counts[] = {20, 1, 3, 20, 7, 50, stored.size(), stored.size() + 5};
        std::size_t mismatches = 0;
        for (std::size_t q = 0; q < 1000; ++q) {
            id target = id::random(rng);
            if (q % 10 == 3) target = stored[rng.uniform(stored.size())].id;
            if (q % 17 == 5) target = t.self();
            const std::size_t count = counts[q % std::size(counts)];
            const id member = stored[rng.uniform(stored.size())].id;
            const id stranger = id::random(rng);
            const id* exclude = nullptr;
            if (q % 3 == 1) exclude = &member;
            if (q % 3 == 2) exclude = (q % 2 == 0) ? &target : &stranger;

            const auto got = t.nearest(target, count, exclude);
            const auto want = brute_force_nearest(stored, target, count, exclude);
            if (got != want) ++mismatches;
            for (const contact_t& c : got)
                CHECK(c.id != t.self());
        }
        CHECK(mismatches == 0);
    }
}

TEST_CASE("nearest edge cases", "[dht]") {
    random_generator rng(20);
    table t(id::random(rng));
    CHECK(t.nearest(id::random(rng), 20).empty());
    const contact_t only = make_contact(rng, 1);
    REQUIRE(t.on_seen(only, t0).result == seen::added);
    CHECK(t.nearest(id::random(rng), 0).empty());
    CHECK(t.nearest(id::random(rng), 5) == std::vector<contact_t>{only});
    CHECK(t.nearest(only.id, 5, &only.id).empty());
    CHECK(t.nearest(t.self(), 5) == std::vector<contact_t>{only});
}

TEST_CASE("a full bucket caches newcomers and names its least-recently-seen contact", "[dht]") {
    random_generator rng(30);
    const routing_options options{.k = 2, .b = 1, .replacement_cache_size = 2, .max_failures = 3};
    table t(id::of_peer(random_peer(rng)), options);
    const id far = far_prefix(t.self());
    auto far_contact = [&](int endpoint) { return contact_with_prefix(rng, far, 1, endpoint); };

    const contact_t a = far_contact(1), b = far_contact(2), c = far_contact(3), d = far_contact(4),
                    e = far_contact(5);
    CHECK(t.on_seen(a, t0).result == seen::added);
    CHECK(t.on_seen(b, t0 + 1s).result == seen::added);
    CHECK(t.bucket_count() == 1);

    // The only bucket covers self, so it splits; the far half (depth 1, 1 % b == 0) is full.
    auto outcome = t.on_seen(c, t0 + 2s);
    CHECK(outcome.result == seen::cached);
    REQUIRE(outcome.ping_candidate.has_value());
    CHECK(*outcome.ping_candidate == a);
    CHECK(t.bucket_count() == 2);
    CHECK(t.size() == 2);
    CHECK(t.find(c.id) == nullptr);
    const std::size_t far_bucket = bucket_of(t, far);
    CHECK(t.buckets()[far_bucket].replacements == 1);

    CHECK(t.on_seen(d, t0 + 3s).result == seen::cached);
    outcome = t.on_seen(e, t0 + 4s); // cache holds 2: c, the oldest, goes
    CHECK(outcome.result == seen::cached);
    CHECK(*outcome.ping_candidate == a);
    CHECK(t.buckets()[far_bucket].replacements == 2);
    CHECK(t.bucket_count() == 2); // no further split of the far bucket

    // a answers: it becomes the most recent, so b is the next ping candidate.
    CHECK(t.on_seen(a, t0 + 5s).result == seen::updated);
    contact_t c2 = c;
    c2.endpoint = 33;
    outcome = t.on_seen(c2, t0 + 6s); // back in the cache (d evicted), new endpoint
    CHECK(outcome.result == seen::cached);
    CHECK(*outcome.ping_candidate == b);
    CHECK(t.buckets()[far_bucket].replacements == 2);

    // b fails its pings: removed at the third failure, the newest cached contact takes over.
    CHECK_FALSE(t.on_failure(b.id));
    CHECK_FALSE(t.on_failure(b.id));
    CHECK(t.find(b.id) != nullptr);
    CHECK(t.on_failure(b.id));
    CHECK(t.find(b.id) == nullptr);
    REQUIRE(t.find(c.id) != nullptr);
    CHECK(t.find(c.id)->endpoint == 33);
    CHECK(t.size() == 2);
    CHECK(t.buckets()[far_bucket].replacements == 1); // e still waits

    // Failures of cached contacts drop them; evicted or unknown ids are not found.
    CHECK(t.on_failure(e.id));
    CHECK(t.buckets()[far_bucket].replacements == 0);
    CHECK_FALSE(t.on_failure(e.id));
    CHECK_FALSE(t.on_failure(d.id));
    CHECK_FALSE(t.on_failure(id::random(rng)));

    // With the cache empty, a removal leaves room for the next newcomer.
    CHECK(t.remove(a.id));
    CHECK_FALSE(t.remove(a.id));
    CHECK(t.size() == 1);
    CHECK(t.on_seen(d, t0 + 7s).result == seen::added);
    CHECK(t.size() == 2);
    check_invariants(t, options);
}

TEST_CASE("remove promotes the newest cached contact at once", "[dht]") {
    random_generator rng(31);
    const routing_options options{.k = 2, .b = 1, .replacement_cache_size = 3};
    table t(id::of_peer(random_peer(rng)), options);
    const id far = far_prefix(t.self());
    std::vector<contact_t> far_contacts;
    for (int i = 0; i < 5; ++i)
        far_contacts.push_back(contact_with_prefix(rng, far, 1, i));
    for (const auto& c : far_contacts)
        t.on_seen(c, t0);
    REQUIRE(t.find(far_contacts[0].id) != nullptr);
    REQUIRE(t.find(far_contacts[1].id) != nullptr);

    CHECK(t.remove(far_contacts[0].id));
    CHECK(t.find(far_contacts[0].id) == nullptr);
    CHECK(t.find(far_contacts[4].id) != nullptr); // newest
    CHECK(t.find(far_contacts[3].id) == nullptr);
    CHECK(t.remove(far_contacts[3].id)); // from the cache
    CHECK(t.remove(far_contacts[1].id));
    CHECK(t.find(far_contacts[2].id) != nullptr);
    CHECK(t.buckets()[bucket_of(t, far)].replacements == 0);
    CHECK_FALSE(t.remove(id::random(rng)));
    check_invariants(t, options);
}

TEST_CASE("a contact is removed only after max_failures consecutive failures", "[dht]") {
    random_generator rng(32);
    table t(id::random(rng)); // max_failures = 3
    const contact_t x = make_contact(rng, 1);
    REQUIRE(t.on_seen(x, t0).result == seen::added);
    CHECK_FALSE(t.on_failure(x.id));
    CHECK_FALSE(t.on_failure(x.id));
    // Hearing from it resets the count.
    CHECK(t.on_seen(x, t0 + 1s).result == seen::updated);
    CHECK_FALSE(t.on_failure(x.id));
    CHECK_FALSE(t.on_failure(x.id));
    CHECK(t.find(x.id) != nullptr);
    CHECK(t.on_failure(x.id));
    CHECK(t.find(x.id) == nullptr);
    CHECK(t.size() == 0);
    CHECK_FALSE(t.on_failure(x.id));

    SECTION("max_failures 1 and 0 remove at the first failure") {
        for (std::size_t max_failures : {1u, 0u}) {
            table u(id::random(rng), {.max_failures = max_failures});
            REQUIRE(u.on_seen(x, t0).result == seen::added);
            CHECK(u.on_failure(x.id));
            CHECK(u.size() == 0);
        }
    }
}

TEST_CASE("self is never stored", "[dht]") {
    random_generator rng(33);
    const peer_id me = random_peer(rng);
    table t(id::of_peer(me));
    const contact_t self_contact{id::of_peer(me), me, 7};
    const auto outcome = t.on_seen(self_contact, t0);
    CHECK(outcome.result == seen::self);
    CHECK_FALSE(outcome.ping_candidate.has_value());
    CHECK(t.size() == 0);
    CHECK(t.find(t.self()) == nullptr);
    CHECK_FALSE(t.on_failure(t.self()));
    CHECK_FALSE(t.remove(t.self()));

    for (int i = 0; i < 300; ++i)
        t.on_seen(make_contact(rng, i), t0);
    CHECK(t.on_seen(self_contact, t0).result == seen::self);
    const auto all = t.nearest(t.self(), t.size() + 1);
    CHECK(all.size() == t.size());
    for (const auto& c : all)
        CHECK(c.id != t.self());
    check_invariants(t, routing_options{});
}

TEST_CASE("on_seen updates a known contact's endpoint", "[dht]") {
    random_generator rng(34);
    table t(id::random(rng));
    contact_t x = make_contact(rng, 1);
    REQUIRE(t.on_seen(x, t0).result == seen::added);
    x.endpoint = 2;
    CHECK(t.on_seen(x, t0 + 1s).result == seen::updated);
    REQUIRE(t.find(x.id) != nullptr);
    CHECK(t.find(x.id)->endpoint == 2);
    CHECK(t.size() == 1);
    CHECK(t.nearest(x.id, 1).front().endpoint == 2);
}

TEST_CASE("refresh_targets gives one id inside each stale bucket", "[dht]") {
    random_generator rng(35);
    const routing_options options{.k = 4, .b = 2};
    table t(id::of_peer(random_peer(rng)), options);
    // A table never touched has one stale bucket.
    CHECK(t.refresh_targets(t0, 1h, rng).size() == 1);

    std::vector<contact_t> contacts;
    for (int i = 0; i < 300; ++i) {
        contacts.push_back(make_contact(rng, i));
        t.on_seen(contacts.back(), t0);
    }
    const std::size_t n = t.bucket_count();
    REQUIRE(n > 4);
    CHECK(t.refresh_targets(t0 + 59min, 1h, rng).empty());

    const auto targets = t.refresh_targets(t0 + 1h, 1h, rng);
    REQUIRE(targets.size() == n);
    const auto buckets = t.buckets();
    for (std::size_t i = 0; i < n; ++i) {
        INFO("bucket " << i);
        CHECK(inside(buckets[i], targets[i]));
        CHECK(targets[i] != buckets[i].prefix); // random below the prefix
    }
    // Seeded: the same generator state gives the same targets.
    random_generator r1(5), r2(5);
    CHECK(t.refresh_targets(t0 + 1h, 1h, r1) == t.refresh_targets(t0 + 1h, 1h, r2));

    // Refresh the even buckets; the odd ones stay stale.
    for (std::size_t i = 0; i < n; i += 2)
        t.mark_refreshed(targets[i], t0 + 1h);
    const auto later = t0 + 1h + 1min;
    auto stale = t.refresh_targets(later, 1h, rng);
    REQUIRE(stale.size() == n / 2);
    for (std::size_t j = 0; j < stale.size(); ++j)
        CHECK(bucket_of(t, stale[j]) == 2 * j + 1);

    // Hearing from a contact counts as activity in its bucket.
    const std::size_t odd = bucket_of(t, contacts[0].id) | 1u;
    const contact_t* in_odd = nullptr;
    for (const auto& c : contacts)
        if (t.find(c.id) != nullptr && bucket_of(t, c.id) == odd) in_odd = t.find(c.id);
    REQUIRE(in_odd != nullptr);
    CHECK(t.on_seen(*in_odd, later).result == seen::updated);
    stale = t.refresh_targets(later, 1h, rng);
    CHECK(stale.size() == n / 2 - 1);
    for (const auto& target : stale)
        CHECK(bucket_of(t, target) != odd);
}

TEST_CASE("invalid routing options throw", "[dht]") {
    const id self;
    CHECK_THROWS_AS(table(self, {.k = 0}), std::invalid_argument);
    CHECK_THROWS_AS(table(self, {.b = 0}), std::invalid_argument);
    CHECK_THROWS_AS(table(self, {.b = 161}), std::invalid_argument);
    CHECK_NOTHROW(table(self, {.b = 160}));
    CHECK_NOTHROW(table(self, {.k = 1, .b = 1}));
}

TEST_CASE("a zero-size replacement cache keeps nothing but still names a ping candidate", "[dht]") {
    random_generator rng(36);
    const routing_options options{.k = 1, .b = 1, .replacement_cache_size = 0};
    table t(id::of_peer(random_peer(rng)), options);
    const id far = far_prefix(t.self());
    const contact_t a = contact_with_prefix(rng, far, 1, 1);
    const contact_t b = contact_with_prefix(rng, far, 1, 2);
    CHECK(t.on_seen(a, t0).result == seen::added);
    const auto outcome = t.on_seen(b, t0);
    CHECK(outcome.result == seen::cached);
    CHECK(*outcome.ping_candidate == a);
    CHECK(t.buckets()[bucket_of(t, far)].replacements == 0);
    CHECK(t.remove(a.id));
    CHECK(t.size() == 0);
    check_invariants(t, options);
}

TEST_CASE("random operations keep the table consistent", "[dht]") {
    random_generator rng(37);
    const routing_options options{.k = 3, .b = 2, .replacement_cache_size = 2, .max_failures = 2};
    table t(id::of_peer(random_peer(rng)), options);
    std::vector<contact_t> pool;
    for (int i = 0; i < 200; ++i)
        pool.push_back(make_contact(rng, i));

    for (int step = 0; step < 5000; ++step) {
        contact_t c = pool[rng.uniform(pool.size())];
        const auto now = t0 + std::chrono::seconds(step);
        switch (rng.uniform(4)) {
        case 0:
        case 1: {
            c.endpoint = step;
            const auto outcome = t.on_seen(c, now);
            if (outcome.result == seen::cached) {
                CHECK(t.find(c.id) == nullptr);
                REQUIRE(outcome.ping_candidate.has_value());
                CHECK(t.find(outcome.ping_candidate->id) != nullptr);
            } else {
                REQUIRE(t.find(c.id) != nullptr);
                CHECK(t.find(c.id)->endpoint == step);
                CHECK_FALSE(outcome.ping_candidate.has_value());
            }
            break;
        }
        case 2:
            if (t.on_failure(c.id)) CHECK(t.find(c.id) == nullptr);
            break;
        default:
            t.remove(c.id);
            CHECK(t.find(c.id) == nullptr);
            break;
        }
        if (step % 500 == 0) check_invariants(t, options);
    }
    check_invariants(t, options);

    std::vector<contact_t> all;
    t.for_each([&](const contact_t& c) { all.push_back(c); });
    for (int q = 0; q < 200; ++q) {
        const id target = id::random(rng);
        CHECK(t.nearest(target, 10) == brute_force_nearest(all, target, 10, nullptr));
    }
}

TEST_CASE("endpoints need not be comparable", "[dht]") {
    random_generator rng(38);
    routing_table<opaque_endpoint> t(id::random(rng));
    const peer_id peer = random_peer(rng);
    const contact<opaque_endpoint> c{id::of_peer(peer), peer, {4242}};
    CHECK(t.on_seen(c, t0).result == routing_table<opaque_endpoint>::seen_result::added);
    REQUIRE(t.find(c.id) != nullptr);
    CHECK(t.find(c.id)->endpoint.port == 4242);
    CHECK(t.nearest(c.id, 3).size() == 1);
}
