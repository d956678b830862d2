// The DHT at swarm scale on the simulated network: 1000 peers, crashes, partitions, hand-off.
#include "support/bytes.hpp"
#include "support/identities.hpp"
#include "support/swarm_checks.hpp"

#include <hivemesh/dht/node.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <set>
#include <string>

using namespace hivemesh;
using namespace std::chrono_literals;

namespace {

using test::sim_world;
using sim_swarm = test::swarm<sim_world>;

byte_buffer key_of(std::size_t n) {
    return to_buffer(as_bytes("key/" + std::to_string(n)));
}
byte_buffer value_of(std::size_t n) {
    return test::random_bytes(64 + n % 200, n);
}

/// Stores keys [0, count) each from a random serving member, `parallel` at a time; returns
/// how many were stored on at least one node.
std::size_t store_keys(sim_swarm& s, std::size_t count, time_point expiration,
                       std::size_t parallel = 100) {
    std::size_t stored = 0;
    for (std::size_t begin = 0; begin < count; begin += parallel) {
        std::size_t pending = 0;
        for (std::size_t k = begin; k < std::min(count, begin + parallel); ++k) {
            ++pending;
            s.members[s.random_member()].dht->async_store(
                dht::record{.key = key_of(k),
                            .subkey = std::nullopt,
                            .value = value_of(k),
                            .expiration = expiration,
                            .signature = {}},
                [&](std::error_code ec, dht::store_outcome) {
                    if (!ec) ++stored;
                    --pending;
                });
        }
        test::wait_all(s.world, pending);
    }
    return stored;
}

/// Gets keys [0, count) each from a random live member; returns how many came back exact.
std::size_t find_keys(sim_swarm& s, std::size_t count, const std::set<std::size_t>& down = {},
                      std::size_t parallel = 100) {
    std::size_t found = 0;
    for (std::size_t begin = 0; begin < count; begin += parallel) {
        std::size_t pending = 0;
        for (std::size_t k = begin; k < std::min(count, begin + parallel); ++k) {
            std::size_t from = s.random_member();
            while (down.contains(from))
                from = s.random_member();
            ++pending;
            s.members[from].dht->async_get(
                key_of(k), {}, [&, k](std::error_code ec, dht::key_entry entry) {
                    if (!ec && entry.plain && entry.plain->value == value_of(k)) ++found;
                    --pending;
                });
        }
        test::wait_all(s.world, pending);
    }
    return found;
}

struct lookup_counters {
    std::uint64_t lookups = 0, rounds = 0;
};

lookup_counters counters(sim_swarm& s) {
    lookup_counters c;
    for (auto& m : s.members) {
        c.lookups += m.dht->statistics().lookups;
        c.rounds += m.dht->statistics().lookup_rounds;
    }
    return c;
}

/// The members nearest to `key` first.
std::vector<std::size_t> by_distance(sim_swarm& s, const byte_buffer& key) {
    const auto target = dht::id::of_key(key);
    std::vector<std::size_t> order(s.members.size());
    for (std::size_t i = 0; i < order.size(); ++i)
        order[i] = i;
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
        return dht::closer(target, s.members[a].dht->id(), s.members[b].dht->id());
    });
    return order;
}

/// One of the members' statistics, summed over them all.
std::uint64_t total(sim_swarm& s, std::uint64_t dht::node_statistics::*counter) {
    std::uint64_t n = 0;
    for (auto& m : s.members)
        n += m.dht->statistics().*counter;
    return n;
}

std::uint64_t requests_sent(sim_swarm& s) {
    return total(s, &dht::node_statistics::requests_sent);
}

void build(sim_swarm& s, std::size_t n) {
    s.rpc_options.security.plaintext = true; // authenticated, unencrypted: the swarm is big
    s.options.cache_on_get = false;          // count only real replicas
    s.world.network.set_default_link({5ms, 0, 0.0});
    for (std::size_t i = 0; i < n; ++i)
        s.add(1 + i);
    test::bootstrap(s, 1);
}

} // namespace

TEST_CASE("1000 peers: every key is found, lookups take few rounds, 30% may crash",
          "[dht][sim][swarm]") {
    sim_swarm s;
    // The keys must outlive the lookups that wait on crashed peers, however long they take.
    s.options.storage.max_lifetime = 24h;
    build(s, 1000);
    constexpr std::size_t key_count = 1000;
    const auto t0 = s.world.now();
    CHECK(store_keys(s, key_count, t0 + 24h) == key_count);

    const auto before = counters(s);
    const auto found = find_keys(s, key_count);
    const auto after = counters(s);
    const double mean_rounds = static_cast<double>(after.rounds - before.rounds) /
                               static_cast<double>(after.lookups - before.lookups);
    WARN("1000 peers: found " << found << "/" << key_count << ", mean lookup rounds "
                              << mean_rounds);
    CHECK(found == key_count);
    CHECK(mean_rounds <= 5.0);

    // 30% crash at once; the survivors re-replicate what they hold.
    std::set<std::size_t> down;
    while (down.size() < 300)
        down.insert(s.random_member());
    for (const auto i : down) {
        s.members[i].dht->close();
        s.world.network.crash(s.members[i].transport->node());
    }
    std::size_t pending = 0;
    for (std::size_t i = 0; i < s.members.size(); ++i) {
        if (down.contains(i)) continue;
        ++pending;
        s.members[i].dht->async_republish([&](std::error_code) { --pending; });
    }
    test::wait_all(s.world, pending);
    const auto survived = find_keys(s, key_count, down);
    WARN("after 30% crashed: found " << survived << "/" << key_count);
    CHECK(survived >= key_count * 99 / 100);
}

TEST_CASE("300 peers: when 30% of their processes exit, their hosts up, every key is found "
          "and no get waits out a departed peer's retries",
          "[dht][sim][swarm]") {
    sim_swarm s;
    s.options.storage.max_lifetime = 24h;
    build(s, 300);
    constexpr std::size_t key_count = 300;
    CHECK(store_keys(s, key_count, s.world.now() + 24h) == key_count);
    CHECK(find_keys(s, key_count) == key_count); // every peer has met many others by now
    std::set<std::size_t> gone;
    while (gone.size() < 90)
        gone.insert(s.random_member());
    for (const auto i : gone) { // the process exits: its sockets close, its host stays
        s.members[i].dht->close();
        s.members[i].rpc->close_now();
    }
    s.world.settle();
    // One get at a time, each timed. With 5 ms links, a departed peer that had answered
    // costs 4 + 8 + 16 of its round trips (280 ms) of retries unless its host's notice ends
    // the wait after one (10 ms).
    std::size_t found = 0;
    duration slowest{};
    for (std::size_t k = 0; k < key_count; ++k) {
        std::size_t from = s.random_member();
        while (gone.contains(from))
            from = s.random_member();
        std::size_t pending = 1;
        const time_point start = s.world.now();
        s.members[from].dht->async_get(
            key_of(k), {}, [&, k](std::error_code ec, dht::key_entry entry) {
                if (!ec && entry.plain && entry.plain->value == value_of(k)) ++found;
                --pending;
            });
        test::wait_all(s.world, pending);
        slowest = std::max(slowest, s.world.now() - start);
    }
    const auto slowest_ms = std::chrono::duration_cast<std::chrono::milliseconds>(slowest);
    WARN("300 peers, 90 gone: found " << found << "/" << key_count << ", slowest get "
                                      << slowest_ms.count() << " ms");
    CHECK(found == key_count);
    CHECK(slowest < 250ms);
    CHECK(s.world.network.statistics().notices_delivered > 0);
}

TEST_CASE("two halves that grew apart during a partition join into one swarm after it",
          "[dht][sim][swarm]") {
    sim_swarm s;
    s.options.rebootstrap_interval = 30s;
    build(s, 100);
    // The second half starts behind a partition: it knows node 0 (everyone's bootstrap
    // peer) but cannot reach it, so it grows around node 100 alone.
    for (std::size_t i = 100; i < 200; ++i)
        s.add(1 + i);
    std::vector<net::sim::node_id> second_half;
    for (std::size_t i = 100; i < 200; ++i)
        second_half.push_back(s.members[i].transport->node());
    s.world.network.partition(second_half);
    for (std::size_t i = 100; i < 200; ++i) {
        std::size_t pending = 1;
        std::vector<sim_swarm::peer> initial{s.members[0].address()};
        if (i > 100) initial.push_back(s.members[100 + s.rng.uniform(i - 100)].address());
        s.members[i].dht->async_bootstrap(initial, [&](std::error_code) { --pending; });
        test::wait_all(s.world, pending);
    }
    // How many nodes know at least one node of the other half.
    const auto bridged = [&] {
        std::size_t n = 0;
        for (std::size_t i = 0; i < 200; ++i) {
            bool knows_other_half = false;
            s.members[i].dht->table().for_each([&](const auto& c) {
                if ((c.endpoint.node >= s.members[100].transport->node()) != (i >= 100))
                    knows_other_half = true;
            });
            if (knows_other_half) ++n;
        }
        return n;
    };
    CHECK(bridged() == 0);

    // Keys stored on each side while split; the other side cannot see them.
    const auto t0 = s.world.now();
    std::size_t pending = 0;
    for (std::size_t k = 0; k < 100; ++k) {
        ++pending;
        s.members[k % 2 == 0 ? k : 100 + k].dht->async_store(
            dht::record{.key = key_of(k),
                        .subkey = std::nullopt,
                        .value = value_of(k),
                        .expiration = t0 + 5min,
                        .signature = {}},
            [&](std::error_code ec, dht::store_outcome) {
                CHECK_FALSE(ec);
                --pending;
            });
    }
    test::wait_all(s.world, pending);
    const auto across = [&] {
        std::size_t found = 0;
        std::size_t waiting = 0;
        for (std::size_t k = 0; k < 100; ++k) {
            ++waiting;
            s.members[k % 2 == 0 ? 199 - k : k].dht->async_get(
                key_of(k), {}, [&, k](std::error_code ec, dht::key_entry entry) {
                    if (!ec && entry.plain && entry.plain->value == value_of(k)) ++found;
                    --waiting;
                });
        }
        test::wait_all(s.world, waiting);
        return found;
    };
    CHECK(across() == 0);

    s.world.network.heal();
    s.world.network.time().run_for(90s); // three re-bootstrap periods
    CHECK(bridged() == 200);
    const auto found = across();
    WARN("keys found across the former split: " << found << "/100");
    CHECK(found >= 99);
    for (std::size_t i = 0; i < 200; i += 10) {
        const auto& target = s.members[(i + 100) % 200];
        auto [ec, nearest] =
            test::wait_for<std::error_code, std::vector<sim_swarm::dht_node_type::contact_type>>(
                s.world, [&](auto handler) {
                    s.members[i].dht->async_find_nearest(target.dht->id(), 1, handler);
                });
        REQUIRE_FALSE(ec);
        REQUIRE(nearest.size() == 1);
        CHECK(nearest.front().id == target.dht->id());
    }
}

TEST_CASE("halves whose tables dropped each other during a partition meet again through the "
          "contacts they lost, before any re-bootstrap",
          "[dht][sim]") {
    sim_swarm s;
    s.options.rebootstrap_interval = 24h; // only the lost contacts can rejoin the halves
    s.options.routing.max_failures = 1;   // one failed request drops a contact
    build(s, 20);                         // with k = 20 every lookup asks every node it knows
    std::vector<net::sim::node_id> second_half;
    for (std::size_t i = 10; i < 20; ++i)
        second_half.push_back(s.members[i].transport->node());
    const auto knows_other_half = [&](std::size_t i) {
        bool knows = false;
        s.members[i].dht->table().for_each([&](const auto& c) {
            if ((c.endpoint.node >= s.members[10].transport->node()) != (i >= 10)) knows = true;
        });
        return knows;
    };
    const auto bridged = [&] {
        std::size_t n = 0;
        for (std::size_t i = 0; i < 20; ++i)
            n += knows_other_half(i) ? 1 : 0;
        return n;
    };
    CHECK(bridged() == 20);

    s.world.network.partition(second_half);
    std::size_t pending = 20;
    for (std::size_t i = 0; i < 20; ++i)
        s.members[i].dht->async_find_nearest(
            dht::id::of_key(key_of(1000 + i)), 5,
            [&](std::error_code, const std::vector<sim_swarm::dht_node_type::contact_type>&) {
                --pending;
            });
    test::wait_all(s.world, pending);
    CHECK(bridged() == 0);
    // A key stored on each side while split.
    const auto t0 = s.world.now();
    for (const std::size_t from : {0, 10}) {
        auto [ec, outcome] =
            test::wait_for<std::error_code, dht::store_outcome>(s.world, [&](auto handler) {
                s.members[from].dht->async_store(dht::record{.key = key_of(from),
                                                             .subkey = std::nullopt,
                                                             .value = value_of(from),
                                                             .expiration = t0 + 5min,
                                                             .signature = {}},
                                                 handler);
            });
        CHECK_FALSE(ec);
    }

    s.world.network.heal();
    s.world.network.time().run_for(30s); // six maintenance periods
    CHECK(bridged() == 20);
    for (const std::size_t from : {0, 10}) {
        const std::size_t reader = 19 - from; // on the other side
        auto [ec, entry] =
            test::wait_for<std::error_code, dht::key_entry>(s.world, [&](auto handler) {
                s.members[reader].dht->async_get(key_of(from), {}, handler);
            });
        CHECK_FALSE(ec);
        CHECK((entry.plain && entry.plain->value == value_of(from)));
    }
}

TEST_CASE("a key is handed to a new node that becomes its nearest", "[dht][sim]") {
    sim_swarm s;
    build(s, 40);
    const auto t0 = s.world.now();
    CHECK(store_keys(s, 20, t0 + 4min) == 20);
    // A newcomer whose id is nearer to key 0 than any member's.
    const auto target = dht::id::of_key(key_of(0));
    std::uint64_t best_seed = 0;
    dht::id best;
    for (std::uint64_t seed = 10'000; seed < 14'000; ++seed) {
        const auto id = dht::id::of_peer(test::random_identity(seed).id());
        if (seed == 10'000 || dht::closer(target, id, best)) {
            best = id;
            best_seed = seed;
        }
    }
    for (auto& m : s.members)
        REQUIRE(dht::closer(target, best, m.dht->id()));
    auto& newcomer = s.add(best_seed);
    test::bootstrap(s, s.members.size() - 1);
    s.world.network.time().run_for(5s);
    CHECK(newcomer.dht->local_storage().contains(target, s.world.now()));
    CHECK(total(s, &dht::node_statistics::handoffs) >= 1);
}

TEST_CASE("the maintenance loop republishes a node's keys every republish_interval from its "
          "start, not at its first run",
          "[dht][sim]") {
    sim_swarm s;
    s.options.republish_interval = 120s; // maintenance_period stays 5 s
    build(s, 20);
    const auto t0 = s.world.now();
    constexpr std::size_t key_count = 20;
    CHECK(store_keys(s, key_count, t0 + 4min) == key_count);
    const auto republished = [&] { return total(s, &dht::node_statistics::republished); };
    const auto sent_before = requests_sent(s);
    // A dozen maintenance runs, well inside the interval: the keys were just stored.
    s.world.network.time().run_for(60s);
    CHECK(republished() == 0);
    // Past the interval, each of a key's replicas republishes it once: with 20 nodes every
    // table is full, so the replicas, and the nodes that see themselves as one, are exactly
    // the nearest five.
    s.world.network.time().run_for(80s);
    for (std::size_t k = 0; k < key_count; ++k) {
        const auto nearest = by_distance(s, key_of(k));
        const auto id = dht::id::of_key(key_of(k));
        for (std::size_t i = 0; i < nearest.size(); ++i)
            CHECK(s.members[nearest[i]].dht->local_storage().contains(id, s.world.now()) ==
                  (i < 5));
    }
    CHECK(republished() == key_count * 5);
    CHECK(requests_sent(s) > sent_before);
    CHECK(find_keys(s, key_count) == key_count);
}

TEST_CASE("a store's lookup asks about as many nodes as it stores on, and reaches the nearest",
          "[dht][sim]") {
    sim_swarm s;
    s.options.maintenance_period = duration::zero(); // only the stores send requests
    build(s, 200);
    constexpr std::size_t key_count = 100;
    const auto before = requests_sent(s);
    CHECK(store_keys(s, key_count, s.world.now() + 4min, 10) == key_count);
    const double per_store =
        static_cast<double>(requests_sent(s) - before) / static_cast<double>(key_count);
    WARN("requests per store: " << per_store);
    // The finds that locate the num_replicas nearest nodes, which carry the records there; a
    // search until the k (20) nearest answered sends about 20, and store requests after it
    // num_replicas more.
    CHECK(per_store <= 1.5 * static_cast<double>(s.options.num_replicas));
    // The narrower search still reaches the num_replicas nearest nodes of every key.
    const auto now = s.world.now();
    std::size_t misplaced = 0;
    for (std::size_t k = 0; k < key_count; ++k) {
        const auto target = dht::id::of_key(key_of(k));
        const auto order = by_distance(s, key_of(k));
        for (std::size_t n = 0; n < s.options.num_replicas; ++n)
            if (!s.members[order[n]].dht->local_storage().contains(target, now)) ++misplaced;
    }
    CHECK(misplaced == 0);
    CHECK(find_keys(s, key_count) == key_count);
}

TEST_CASE("a store's lookup hands small records to the nodes it asks, so its nearest need no "
          "store request, and larger records go by store requests to the nearest alone",
          "[dht][sim]") {
    // Keys 0..99 have values of 64..163 bytes (value_of) under keys of 5..6 bytes: with a
    // limit of 120 bytes about half of them ride along with the finds.
    constexpr std::size_t limit = 120, key_count = 100;
    sim_swarm s;
    s.options.maintenance_period = duration::zero(); // only the stores send requests
    s.options.carried_record_bytes = limit;
    build(s, 200);
    const auto before = requests_sent(s);
    std::vector<dht::store_outcome> outcomes(key_count);
    std::vector<std::size_t> storers(key_count);
    std::size_t pending = 0;
    for (std::size_t k = 0; k < key_count; ++k) {
        ++pending;
        storers[k] = s.random_member();
        s.members[storers[k]].dht->async_store(
            dht::record{.key = key_of(k),
                        .subkey = std::nullopt,
                        .value = value_of(k),
                        .expiration = s.world.now() + 4min,
                        .signature = {}},
            [&, k](std::error_code ec, dht::store_outcome outcome) {
                CHECK_FALSE(ec);
                outcomes[k] = outcome;
                --pending;
            });
    }
    test::wait_all(s.world, pending);
    const auto sent = requests_sent(s) - before;

    const auto now = s.world.now();
    std::size_t carried = 0, strays = 0, expected_requests = 0;
    for (std::size_t k = 0; k < key_count; ++k) {
        INFO("key " << k);
        CHECK(outcomes[k].replicas == s.options.num_replicas);
        const auto target = dht::id::of_key(key_of(k));
        const auto order = by_distance(s, key_of(k));
        const bool rides = key_of(k).size() + value_of(k).size() <= limit;
        carried += rides ? 1 : 0;
        std::size_t holders = 0;
        for (std::size_t n = 0; n < order.size(); ++n) {
            const bool holds = s.members[order[n]].dht->local_storage().contains(target, now);
            if (n < s.options.num_replicas)
                CHECK(holds); // the nearest hold it, however it came
            else if (holds)
                ++holders;
        }
        // A store request goes only where no find carried the record: to every remote
        // replica of a large record, to none of a small one's.
        const auto nearest = std::vector<std::size_t>(
            order.begin(), order.begin() + static_cast<std::ptrdiff_t>(s.options.num_replicas));
        const bool self_replica =
            std::find(nearest.begin(), nearest.end(), storers[k]) != nearest.end();
        if (!rides) {
            CHECK(holders == 0); // nothing beyond the nearest
            expected_requests += s.options.num_replicas - (self_replica ? 1 : 0);
        }
        strays += holders;
    }
    std::uint64_t records_sent = 0, records_carried = 0;
    for (auto& m : s.members) {
        records_sent += m.dht->statistics().store_records_sent;
        records_carried += m.dht->statistics().store_records_carried;
    }
    WARN("records carried: " << carried << " of " << key_count << "; copies beyond the nearest: "
                             << strays << "; requests per store: "
                             << static_cast<double>(sent) / static_cast<double>(key_count));
    CHECK(carried > key_count / 4);
    CHECK(carried < key_count * 3 / 4);
    CHECK(records_sent == expected_requests);
    CHECK(records_carried >= carried * (s.options.num_replicas - 1));
    CHECK(find_keys(s, key_count) == key_count);
}

TEST_CASE("a node that answers a carrying find without its statuses counts as failed, and the "
          "store reaches the next nearest",
          "[dht][sim]") {
    sim_swarm s;
    s.options.maintenance_period = duration::zero();
    build(s, 20);
    const auto key = key_of(7);
    const auto order = by_distance(s, key);
    const std::size_t liar = order[0], storer = order.back();
    // The nearest node answers every find with peers but no statuses, and stores nothing.
    s.members[liar].rpc->add_handler("dht.find",
                                     [](const net::call_context&, byte_view request,
                                        byte_buffer& response) -> asio::awaitable<std::error_code> {
                                         dht::find_request find;
                                         if (auto ec = dht::decode(request, find)) co_return ec;
                                         response = dht::encode(dht::find_response{
                                             std::vector<dht::find_result>(find.keys.size()), {}});
                                         co_return std::error_code{};
                                     });
    auto [ec, outcome] =
        test::wait_for<std::error_code, dht::store_outcome>(s.world, [&](auto handler) {
            s.members[storer].dht->async_store(dht::record{.key = key,
                                                           .subkey = std::nullopt,
                                                           .value = value_of(7),
                                                           .expiration = s.world.now() + 4min,
                                                           .signature = {}},
                                               handler);
        });
    REQUIRE_FALSE(ec);
    CHECK(outcome.replicas == s.options.num_replicas);
    const auto target = dht::id::of_key(key);
    const auto now = s.world.now();
    CHECK_FALSE(s.members[liar].dht->local_storage().contains(target, now));
    for (std::size_t n = 1; n <= s.options.num_replicas; ++n) {
        INFO("the " << n << "th nearest");
        CHECK(s.members[order[n]].dht->local_storage().contains(target, now));
    }
}

namespace {

/// How the requests of a store flood ended, as their sender saw them.
struct store_flood_tally {
    std::size_t finished = 0;
    std::size_t rate_limited = 0;
    std::size_t stored = 0;       ///< answered, the item stored
    std::size_t storage_full = 0; ///< answered, the item refused: the storage is full
    std::size_t other = 0;
    time_point last_answer{};
};

} // namespace

TEST_CASE("a flood of 10,000 bogus stores is refused with rate_limited past each sender's "
          "allowance and counted, the storage stays within its limit, and a real peer's store "
          "and get succeed",
          "[dht][sim][overload]") {
    sim_swarm s;
    s.options.maintenance_period = 0s; // nothing in the background: only the flood counts
    s.options.storage.max_total_bytes = 256u << 10;
    CHECK(s.options.requests_per_second == 500);
    CHECK(s.options.request_burst == 1000);
    build(s, 8);
    auto& victim = s.members[0];
    REQUIRE(victim.dht->local_storage().bytes_used() == 0);
    // Four peers send valid stores of junk straight to the victim, a fifth sends garbage.
    constexpr std::size_t senders = 5, per_sender = 2000;
    std::vector<std::size_t> attackers;
    for (std::size_t n = 0; n < senders; ++n) {
        s.add_rpc(test::random_identity(6000 + n));
        attackers.push_back(s.members.size() - 1);
    }
    const auto before = victim.dht->statistics();
    const auto t0 = s.world.now();
    const auto junk = [&](std::size_t n, std::size_t k) {
        return dht::record{.key = to_buffer(as_bytes("junk/" + std::to_string(n) + "/" +
                                                     std::to_string(10'000 + k))),
                           .subkey = std::nullopt,
                           .value = test::random_bytes(200, k),
                           .expiration = t0 + 4min,
                           .signature = {}};
    };
    const std::size_t item_size = dht::storage::accounted_size(junk(0, 0));
    std::vector<store_flood_tally> tallies(senders);
    for (std::size_t n = 0; n < senders; ++n)
        for (std::size_t k = 0; k < per_sender; ++k) {
            dht::store_request request;
            request.items.push_back({.item = junk(n, k), .in_cache = false});
            auto bytes = n + 1 < senders ? dht::encode(request) : test::random_bytes(60, k);
            auto& tally = tallies[n];
            s.members[attackers[n]].rpc->async_call(
                victim.address(), "dht.store", std::move(bytes), 30s,
                [&s, &tally](std::error_code ec, byte_buffer raw) {
                    dht::store_response response;
                    if (ec == errc::rate_limited)
                        ++tally.rate_limited;
                    else if (!ec && !dht::decode(raw, response) && response.statuses.size() == 1 &&
                             response.statuses[0] == dht::store_status::stored)
                        ++tally.stored;
                    else if (!ec && response.statuses.size() == 1 &&
                             response.statuses[0] == dht::store_status::storage_full)
                        ++tally.storage_full;
                    else
                        ++tally.other;
                    ++tally.finished;
                    tally.last_answer = s.world.now();
                });
        }
    REQUIRE(s.world.run_until([&] {
        return std::all_of(tallies.begin(), tallies.end(),
                           [](const auto& t) { return t.finished == per_sender; });
    }));
    const auto after = victim.dht->statistics();

    // Each valid sender got at least its burst (a one-item store costs 2: the request and
    // the item), and at most what its bucket refilled while the flood lasted; the rest was
    // refused with rate_limited.
    std::size_t answered = 0, limited = 0, stored = 0;
    for (std::size_t n = 0; n + 1 < senders; ++n) {
        const auto& t = tallies[n];
        INFO("sender " << n);
        const double lasted = std::chrono::duration<double>(t.last_answer - t0).count();
        const std::size_t ok = t.stored + t.storage_full;
        CHECK(t.other == 0);
        CHECK(ok + t.rate_limited == per_sender);
        CHECK(ok >= 500);
        CHECK(static_cast<double>(ok) <= (1000 + 500 * lasted) / 2);
        answered += ok;
        limited += t.rate_limited;
        stored += t.stored;
    }
    // The garbage sender: its first request is malformed, and its penalty refuses the rest.
    CHECK(tallies.back().rate_limited == per_sender - 1);
    CHECK(tallies.back().other == 1);
    limited += tallies.back().rate_limited;
    CHECK(after.requests_rate_limited - before.requests_rate_limited == limited);
    CHECK(after.requests_malformed - before.requests_malformed == 1);
    CHECK(after.requests_refused - before.requests_refused == limited + 1);
    CHECK(after.requests_served - before.requests_served == answered);

    // What was admitted filled the storage exactly to its limit, and no further.
    const std::size_t fit = s.options.storage.max_total_bytes / item_size;
    REQUIRE(answered > fit);
    CHECK(stored == fit);
    CHECK(victim.dht->local_storage().bytes_used() == fit * item_size);
    CHECK(victim.dht->local_storage().bytes_used() <= s.options.storage.max_total_bytes);

    // A real peer stores and gets a value; the victim answers it (its allowance is its
    // own), refusing only the item, for want of room, if it is one of the key's replicas.
    const auto key = to_buffer(as_bytes("a real value"));
    std::vector<dht::id> ids;
    for (std::size_t i = 0; i < 8; ++i)
        ids.push_back(s.members[i].dht->id());
    const auto target = dht::id::of_key(key);
    std::sort(ids.begin(), ids.end(),
              [&](const dht::id& a, const dht::id& b) { return dht::closer(target, a, b); });
    const bool victim_replica =
        std::find(ids.begin(), ids.begin() + 5, victim.dht->id()) != ids.begin() + 5;
    const dht::record real{.key = key,
                           .subkey = std::nullopt,
                           .value = value_of(1),
                           .expiration = s.world.now() + 2min,
                           .signature = {}};
    const bool room =
        s.options.storage.max_total_bytes - victim.dht->local_storage().bytes_used() >=
        dht::storage::accounted_size(real);
    auto [ec, outcome] = test::wait_for<std::error_code, dht::store_outcome>(
        s.world, [&](auto h) { s.members[3].dht->async_store(real, h); });
    CHECK_FALSE(ec);
    CHECK(outcome.replicas == (victim_replica && !room ? 4u : 5u));
    auto [gec, entry] = test::wait_for<std::error_code, dht::key_entry>(
        s.world, [&](auto h) { s.members[5].dht->async_get(key, {}, h); });
    CHECK_FALSE(gec);
    REQUIRE(entry.plain);
    CHECK(entry.plain->value == value_of(1));
    CHECK(victim.dht->statistics().requests_rate_limited == after.requests_rate_limited);
    CHECK(victim.dht->local_storage().bytes_used() <= s.options.storage.max_total_bytes);
}

TEST_CASE("once the swarm knows its peers' keys, stores and gets go by datagram and open no "
          "connection",
          "[dht][sim]") {
    for (const bool datagrams : {true, false}) {
        INFO("datagrams " << datagrams);
        sim_swarm s;
        s.options.maintenance_period = duration::zero(); // only the operations send requests
        s.rpc_options.datagrams.enabled = datagrams;
        build(s, 100);
        const auto handshakes = [&] {
            std::uint64_t total = 0;
            for (const auto& m : s.members)
                total += m.rpc->statistics().handshakes_completed;
            return total;
        };
        const auto datagram_calls = [&] {
            std::uint64_t total = 0;
            for (const auto& m : s.members)
                total += m.rpc->statistics().datagram_calls;
            return total;
        };
        const auto fallbacks = [&] {
            std::uint64_t total = 0;
            for (const auto& m : s.members)
                total += m.rpc->statistics().datagram_fallbacks;
            return total;
        };
        const auto handshakes_before = handshakes();
        const auto calls_before = datagram_calls();
        const auto fallbacks_before = fallbacks();
        const auto sent_before = requests_sent(s);
        constexpr std::size_t key_count = 50;
        CHECK(store_keys(s, key_count, s.world.now() + 4min, 10) == key_count);
        CHECK(find_keys(s, key_count) == key_count);
        s.world.settle(); // a lookup that has its answer leaves its slower requests running
        const auto requests = requests_sent(s) - sent_before;
        if (datagrams) {
            // Every contact came with its key (from a connection, a datagram or a find
            // answer), so every request went by datagram but for the few too large for one
            // (records a find carries, an answer with a value and 20 peers), which went by
            // stream over connections the bootstrap left.
            CHECK(handshakes() == handshakes_before);
            const auto by_stream = fallbacks() - fallbacks_before;
            CHECK(datagram_calls() - calls_before + by_stream == requests);
            CHECK(by_stream * 20 < requests);
        } else {
            CHECK(handshakes() > handshakes_before);
            CHECK(datagram_calls() == 0);
        }
    }
}
