// Matchmaking over a simulated DHT swarm: groups form, are consistent, respect the sizes,
// never mix schemas, take clients, survive a leader that crashes; wire format oracles.
#include "support/bytes.hpp"
#include "support/dht_attacks.hpp"
#include "support/swarm_checks.hpp"

#include <hivemesh/averaging/matchmaking.hpp>
#include <hivemesh/core/binary.hpp>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>

#include <catch2/catch.hpp>

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <vector>

namespace hivemesh::test {
namespace {

using averaging::group_bits;
using averaging::member_role;
using world_type = sim_world;
using matchmaker_type = averaging::matchmaker<net::sim::transport>;
using group_type = matchmaker_type::group_type;

struct matchmaking_swarm {
    swarm<world_type> dht;
    std::vector<std::unique_ptr<matchmaker_type>> makers;
    std::vector<std::optional<std::pair<std::error_code, group_type>>> outcomes;

    matchmaking_swarm(std::size_t peers, averaging::matchmaking_options options,
                      std::size_t clients = 0) {
        for (std::size_t i = 0; i < peers + clients; ++i) {
            auto& m = dht.add(1000 + i, i >= peers);
            std::optional<net::sim::endpoint> announce;
            if (i < peers) announce = m.endpoint;
            makers.push_back(std::make_unique<matchmaker_type>(*m.rpc, *m.dht, announce, options));
        }
        test::bootstrap(dht, 1);
        outcomes.resize(peers + clients);
    }

    void start(std::size_t i, averaging::match_request request) {
        makers[i]->async_find_group(
            std::move(request), [this, i](std::error_code ec, group_type g) {
                if (!outcomes[i]) outcomes[i].emplace(ec, std::move(g)); // a crashed peer's is set
            });
    }

    void wait() {
        REQUIRE(dht.world.run_until(
            [&] {
                for (auto& o : outcomes)
                    if (!o) return false;
                return true;
            },
            3600s));
    }

    /// Every member of every formed group holds the same group; returns the groups by id.
    std::map<averaging::group_id, group_type> check_consistent() const {
        std::map<averaging::group_id, group_type> groups;
        for (std::size_t i = 0; i < outcomes.size(); ++i) {
            const auto& [ec, g] = *outcomes[i];
            if (ec) continue;
            const auto me = dht.members[i].rpc->id();
            REQUIRE(std::count_if(g.members.begin(), g.members.end(),
                                  [&](const auto& m) { return m.peer.id == me; }) == 1);
            auto [it, fresh] = groups.try_emplace(g.id, g);
            if (fresh) continue;
            REQUIRE(it->second.members.size() == g.members.size());
            for (std::size_t k = 0; k < g.members.size(); ++k) {
                CHECK(it->second.members[k].peer.id == g.members[k].peer.id);
                CHECK(it->second.members[k].role == g.members[k].role);
                CHECK(it->second.members[k].metadata == g.members[k].metadata);
            }
        }
        // Each group was reported by every one of its members.
        for (const auto& [id, g] : groups)
            for (const auto& member : g.members) {
                bool reported = false;
                for (std::size_t i = 0; i < outcomes.size(); ++i)
                    if (dht.members[i].rpc->id() == member.peer.id)
                        reported = !outcomes[i]->first && outcomes[i]->second.id == id;
                CHECK(reported);
            }
        return groups;
    }

    /// Waits for every search: all found a group, and they form `count` groups of `size`.
    std::map<averaging::group_id, group_type> wait_for_groups(std::size_t count, std::size_t size) {
        wait();
        for (auto& o : outcomes)
            REQUIRE_FALSE(o->first);
        auto groups = check_consistent();
        CHECK(groups.size() == count);
        for (const auto& [id, g] : groups)
            CHECK(g.members.size() == size);
        return groups;
    }
};

averaging::matchmaking_options options_of(std::size_t min, std::size_t target) {
    averaging::matchmaking_options o;
    o.prefix = "test";
    o.min_group_size = min;
    o.target_group_size = target;
    return o;
}

averaging::match_request request_of(std::size_t i, std::uint64_t schema = 7) {
    averaging::match_request r;
    r.bits = group_bits(0, 2);
    r.schema_hash = schema;
    r.bandwidth = 1.0 + static_cast<double>(i);
    r.metadata = bytes_of(std::string("peer ") + std::to_string(i));
    r.window = 6s;
    return r;
}

} // namespace

TEST_CASE("matchmaking: 16 peers under one key form 4 full groups of 4", "[matchmaking]") {
    matchmaking_swarm s(16, options_of(2, 4));
    for (std::size_t i = 0; i < 16; ++i)
        s.start(i, request_of(i));
    for (const auto& [id, g] : s.wait_for_groups(4, 4)) {
        for (const auto& m : g.members) { // what each member told about itself arrived
            const auto i = static_cast<std::size_t>(m.bandwidth - 1.0);
            CHECK(m.metadata == bytes_of(std::string("peer ") + std::to_string(i)));
            CHECK(m.peer.id == s.dht.members[i].rpc->id());
            CHECK(m.peer.endpoint == s.dht.members[i].endpoint);
        }
    }
}

TEST_CASE("matchmaking: a group may be larger than max_pending_joins: accepted followers "
          "hold no join slot",
          "[matchmaking]") {
    // 12 peers, one group of 12 wanted, while a leader answers at most 3 join requests at
    // once. Counting its followers as pending capped every group at 4.
    auto options = options_of(2, 12);
    options.max_pending_joins = 3;
    matchmaking_swarm s(12, options);
    for (std::size_t i = 0; i < 12; ++i)
        s.start(i, request_of(i));
    s.wait_for_groups(1, 12);
    for (std::size_t i = 0; i < 12; ++i) {
        const auto stats = s.makers[i]->statistics();
        CHECK(stats.peak_pending_joins <= 3);
        CHECK(stats.pending_joins == 0);
    }
}

TEST_CASE("matchmaking: small groups that gathered apart merge into a full one before "
          "anyone's window ends",
          "[matchmaking]") {
    // Peers 2 and 3 start first with longer windows and gather as a group of 2. Peers 0 and
    // 1 start a second later with shorter windows, so they come first in the order, and
    // gather as another. The leader of the later pair must join the earlier leader and
    // bring its follower along: one group of 4, at once, not two of 2 at the expirations.
    matchmaking_swarm s(4, options_of(2, 4));
    const auto start = s.dht.world.now();
    for (std::size_t i : {2, 3}) {
        auto r = request_of(i);
        r.window = 8s;
        s.start(i, r);
    }
    s.dht.world.network.time().run_for(1s);
    for (std::size_t i : {0, 1})
        s.start(i, request_of(i)); // 6 s windows: they expire at 7 s, before 2 and 3
    const auto groups = s.wait_for_groups(1, 4);
    REQUIRE(groups.size() == 1);
    const auto& members = groups.begin()->second.members;
    CHECK(members.front().peer.id ==
          std::min(s.dht.members[0].rpc->id(), s.dht.members[1].rpc->id()));
    CHECK(s.dht.world.now() - start < 4s); // a poll or two, not the 6 s window
}

TEST_CASE("matchmaking: 16 peers that start within 200 ms under 4 keys form 4 full groups",
          "[matchmaking]") {
    // The Moshpit grid's first round: each key holds exactly a group's worth of peers. Links
    // of 5-150 ms make declarations land in a different order than the peers started, so
    // each sees the others' only partly at first.
    for (std::uint64_t seed = 1; seed <= 8; ++seed) {
        INFO("seed " << seed);
        matchmaking_swarm s(16, options_of(2, 4));
        random_generator rng(seed);
        for (std::size_t a = 0; a < 16; ++a)
            for (std::size_t b = a + 1; b < 16; ++b) {
                net::sim::link_properties link;
                link.latency = std::chrono::milliseconds(5 + rng.uniform(146));
                s.dht.world.network.set_links_between(s.dht.members[a].transport->node(),
                                                      s.dht.members[b].transport->node(), link);
            }
        std::vector<std::pair<duration, std::size_t>> starts;
        for (std::size_t i = 0; i < 16; ++i)
            starts.emplace_back(std::chrono::microseconds(rng.uniform(200'000)), i);
        std::sort(starts.begin(), starts.end());
        const auto start = s.dht.world.now();
        for (const auto& [at, i] : starts) {
            s.dht.world.network.time().run_for(at - (s.dht.world.now() - start));
            auto r = request_of(i);
            r.bits = group_bits(i % 4, 2);
            s.start(i, r);
        }
        for (const auto& [id, g] : s.wait_for_groups(4, 4)) {
            std::set<std::size_t> keys;
            for (const auto& m : g.members)
                keys.insert(static_cast<std::size_t>(m.bandwidth - 1.0) % 4);
            CHECK(keys.size() == 1);
        }
        CHECK(s.dht.world.now() - start < 6s); // the window: nobody waited it out
    }
}

TEST_CASE("matchmaking: a partial group forms at the leader's expiration when it has the "
          "minimum, and too few peers is an error",
          "[matchmaking]") {
    SECTION("3 peers, target 8, min 3: one group of 3") {
        matchmaking_swarm s(3, options_of(3, 8));
        for (std::size_t i = 0; i < 3; ++i)
            s.start(i, request_of(i));
        s.wait();
        for (auto& o : s.outcomes)
            REQUIRE_FALSE(o->first);
        const auto groups = s.check_consistent();
        REQUIRE(groups.size() == 1);
        CHECK(groups.begin()->second.members.size() == 3);
    }
    SECTION("2 peers, min 3: too_few_peers for both, after their window") {
        matchmaking_swarm s(2, options_of(3, 8));
        const auto start = s.dht.world.now();
        for (std::size_t i = 0; i < 2; ++i)
            s.start(i, request_of(i));
        s.wait();
        for (auto& o : s.outcomes)
            CHECK(o->first == errc::too_few_peers);
        CHECK(s.dht.world.now() - start >= 6s);
    }
}

TEST_CASE("matchmaking: a peer whose read came before an earlier-expiring peer declared reads "
          "again in time, though its window is no longer than poll_interval",
          "[matchmaking]") {
    // Peer 0 looks first, with the later expiration: it must ask peer 1, whose declaration
    // lands only after peer 0's first read (as when two stores race, or windows differ).
    matchmaking_swarm s(2, options_of(2, 2));
    REQUIRE(s.makers[0]->options().poll_interval == 1s);
    const auto start = s.dht.world.now();
    auto late = request_of(0);
    late.window = 1s;
    s.start(0, late);
    s.dht.world.network.time().run_for(200ms);
    auto early = request_of(1);
    early.window = 700ms;
    s.start(1, early);
    s.wait_for_groups(1, 2);
    CHECK(s.dht.world.now() - start < 1s);
}

TEST_CASE("matchmaking: peers with different schema hashes or keys never group", "[matchmaking]") {
    matchmaking_swarm s(12, options_of(2, 4));
    for (std::size_t i = 0; i < 12; ++i) {
        auto r = request_of(i, i % 2);         // two schemas
        if (i >= 8) r.bits = group_bits(1, 2); // and a third set under another key
        s.start(i, r);
    }
    s.wait();
    const auto groups = s.check_consistent();
    std::size_t grouped = 0;
    for (const auto& [id, g] : groups) {
        std::set<std::size_t> schema, key;
        for (const auto& m : g.members) {
            const auto i = static_cast<std::size_t>(m.bandwidth - 1.0);
            schema.insert(i % 2);
            key.insert(i >= 8 ? 1 : 0);
        }
        CHECK(schema.size() == 1);
        CHECK(key.size() == 1);
        grouped += g.members.size();
    }
    CHECK(grouped == 12); // everyone found peers of its own kind
}

TEST_CASE("matchmaking: a peer never asks one that declared another schema hash", "[matchmaking]") {
    // Peers of two epochs of a training run share a key; asking across them would cost a
    // round trip per candidate that can only end in bad_schema_hash.
    matchmaking_swarm s(4, options_of(2, 4));
    for (std::size_t i = 0; i < 4; ++i) {
        s.start(i, request_of(i, i < 2 ? 7 : 8));
        s.dht.world.network.time().run_for(500ms); // declared in this order
    }
    s.wait();
    for (const auto& [id, g] : s.check_consistent()) {
        REQUIRE(g.members.size() == 2);
        const auto first = static_cast<std::size_t>(g.members[0].bandwidth - 1.0);
        const auto second = static_cast<std::size_t>(g.members[1].bandwidth - 1.0);
        CHECK(first / 2 == second / 2);
    }
    // The later peer of each schema asked only the earlier one of its own, which accepted.
    for (std::size_t i = 0; i < 4; ++i) {
        INFO("peer " << i);
        const auto& stats = s.makers[i]->statistics();
        CHECK(stats.requests_sent == (i % 2 == 1 ? 1u : 0u));
        CHECK(stats.joins_served == stats.joins_accepted);
    }
}

TEST_CASE("matchmaking: clients join groups led by serving peers and never lead", "[matchmaking]") {
    matchmaking_swarm s(4, options_of(2, 3), 2);
    for (std::size_t i = 0; i < 6; ++i) {
        auto r = request_of(i);
        if (i >= 4) {
            r.role = member_role::client;
            r.bandwidth = 0;
        }
        s.start(i, r);
    }
    s.wait();
    const auto groups = s.check_consistent();
    std::size_t clients = 0;
    for (const auto& [id, g] : groups) {
        CHECK(g.members.front().role != member_role::client);
        for (const auto& m : g.members)
            clients += m.role == member_role::client ? 1 : 0;
    }
    CHECK(clients == 2);
}

TEST_CASE("matchmaking: followers of a leader that crashes find another group", "[matchmaking]") {
    matchmaking_swarm s(9, options_of(2, 12)); // the target is never reached: forms at expiry
    for (std::size_t i = 0; i < 9; ++i)
        s.start(i, request_of(i));
    // Let followers gather around the earliest peer, then crash it before it forms.
    s.dht.world.network.time().run_for(1500ms);
    std::size_t leader = 0; // equal expirations: the smallest PeerId leads
    for (std::size_t i = 1; i < 9; ++i)
        if (s.dht.members[i].rpc->id() < s.dht.members[leader].rpc->id()) leader = i;
    s.dht.world.network.crash(s.dht.members[leader].transport->node());
    s.outcomes[leader].emplace(make_error_code(errc::cancelled), group_type{});
    s.wait();
    const auto groups = s.check_consistent();
    std::size_t grouped = 0;
    for (const auto& [id, g] : groups) {
        for (const auto& m : g.members)
            CHECK(m.peer.id != s.dht.members[leader].rpc->id());
        grouped += g.members.size();
    }
    CHECK(grouped == 8);
}

namespace {

/// Searches of `window` that expect 3 members other than aux peers and are ready when
/// `ready` says so; peer 3 is an aux peer.
averaging::match_request expecting_request(std::size_t i, const bool& ready) {
    auto r = request_of(i);
    r.window = 10s;
    r.role = i == 3 ? member_role::aux : member_role::node;
    r.expected = [&ready] { return ready ? std::size_t{3} : 0; };
    return r;
}

} // namespace

TEST_CASE("matchmaking: a ready leader forms its group once it holds the members expected, "
          "long before its window ends",
          "[matchmaking]") {
    matchmaking_swarm s(4, options_of(2, 16));
    const auto pending = [&] {
        return std::none_of(s.outcomes.begin(), s.outcomes.end(),
                            [](const auto& o) { return o.has_value(); });
    };
    auto& time = s.dht.world.network.time();
    bool ready = false;
    SECTION("not ready: the group waits, whoever is in, until the search is ready") {
        for (std::size_t i = 0; i < 4; ++i) {
            s.start(i, expecting_request(i, ready));
            time.run_for(200ms); // peer 0 expires first: it leads
        }
        time.run_for(3s); // every peer has joined it by now
        CHECK(pending());
        ready = true;
        s.makers[0]->recheck();
        const auto readied = s.dht.world.now();
        s.wait_for_groups(1, 4);
        CHECK(s.dht.world.now() - readied < 200ms); // the group's way to the followers
    }
    SECTION("ready: aux peers do not count toward the members expected") {
        ready = true;
        for (std::size_t i : {0, 3, 1}) {
            s.start(i, expecting_request(i, ready));
            time.run_for(200ms);
        }
        time.run_for(3s); // peer 0 leads the aux peer 3 and peer 1: two expected of three
        CHECK(pending());
        const auto last = s.dht.world.now();
        s.start(2, expecting_request(2, ready));
        const auto groups = s.wait_for_groups(1, 4);
        CHECK(s.dht.world.now() - last < 1s); // declare, read the key, join: not the window
        CHECK(groups.begin()->second.members.front().peer.id == s.dht.members[0].rpc->id());
    }
}

namespace {

/// Peer 0 declares first (the earliest expiration, so everyone asks it first) and crashes:
/// dials to it go unanswered (the sim gives up after 3 s). Peers 1-3, searching for
/// `window`, must still form one group of 3, and end by their windows plus a second.
void check_grouping_past_crashed_first_candidate(averaging::matchmaking_options options,
                                                 duration window) {
    matchmaking_swarm s(4, options);
    auto request = [window](std::size_t i) {
        auto r = request_of(i);
        r.window = window;
        return r;
    };
    const auto start = s.dht.world.now();
    s.start(0, request(0));
    s.dht.world.network.time().run_for(500ms); // its declaration is stored by now
    s.dht.world.network.crash(s.dht.members[0].transport->node());
    s.outcomes[0].emplace(make_error_code(errc::cancelled), group_type{});
    for (std::size_t i : {1, 2, 3})
        s.start(i, request(i));
    s.wait();
    for (std::size_t i : {1, 2, 3})
        REQUIRE_FALSE(s.outcomes[i]->first);
    const auto groups = s.check_consistent();
    REQUIRE(groups.size() == 1);
    CHECK(groups.begin()->second.members.size() == 3);
    CHECK(s.dht.world.now() - start < 500ms + window + 1s);
}

} // namespace

TEST_CASE("matchmaking: peers whose first candidate crashed after declaring still group, "
          "and finish at their windows",
          "[matchmaking]") {
    // The group forms at its leader's expiration, and nobody then withdraws an expired
    // declaration (which took a lookup waiting on peer 0: 7.86 s).
    check_grouping_past_crashed_first_candidate(options_of(2, 4), 6s);
}

TEST_CASE("matchmaking: a first candidate that never answers the dial costs join_timeout, not "
          "the dial timeout",
          "[matchmaking]") {
    // With windows of 3 s, peers that waited for the dial to give up (3 s, the sim's
    // connect timeout, under the node's dial_timeout of 10 s) would see their windows end
    // before asking anyone else.
    auto options = options_of(2, 4);
    options.join_timeout = 1s;
    check_grouping_past_crashed_first_candidate(options, 3s);
}

namespace {

/// A declaration's value: the schema hash of request_of's peers, then the address of
/// `endpoint` without PeerId.
byte_buffer declared_address(const net::sim::endpoint& endpoint) {
    byte_buffer out;
    binary_writer w(out);
    w.write(std::uint64_t{7});
    net::sim::transport::to_address(endpoint).write_without_peer(w);
    return out;
}

/// The key `bits` as member `reader` reads it (a full lookup).
dht::key_entry read_key(matchmaking_swarm& s, std::size_t reader, const byte_buffer& key) {
    auto [ec, entry] = test::wait_for<std::error_code, dht::key_entry>(s.dht.world, [&](auto h) {
        s.dht.members[reader].dht->async_get(key, dht::get_options{.latest = true}, h);
    });
    REQUIRE_FALSE(ec);
    return std::move(entry);
}

} // namespace

TEST_CASE("matchmaking: a declaration is its owner's: forged, overwriting, tombstoning and "
          "replayed writes are refused",
          "[matchmaking][protection]") {
    matchmaking_swarm s(2, options_of(2, 2));
    auto& d = s.dht;
    d.add(5000); // the attacker: a DHT node of its own, and no matchmaker
    test::bootstrap(d, 2);
    const std::size_t attacker = 2;
    const auto& attacker_identity = d.members[attacker].rpc->identity();
    const auto key = bytes_of(s.makers[0]->key_of(group_bits(0, 2)));
    const auto victim = test::marker_of(d.members[0].rpc->identity());
    auto first = request_of(0);
    first.window = 10s;
    const auto start = d.world.now();
    s.start(0, first);
    d.world.network.time().run_for(1s); // its declaration is stored by now

    // Under the victim's owner marker, signed by the victim: its address until its window ends.
    auto entry = read_key(s, attacker, key);
    REQUIRE(entry.dictionary.size() == 1);
    const dht::stored_value declared = entry.dictionary.at(victim);
    CHECK(declared.value == declared_address(d.members[0].endpoint));
    CHECK(declared.expiration == start + 10s);
    const dht::record declaration = entry.to_record(victim, declared);
    const auto signature = crypto::signature::from_bytes(declaration.signature);
    REQUIRE(signature);
    CHECK(crypto::verify(d.members[0].rpc->identity().public_key(),
                         dht::signing_payload(declaration), *signature));

    // To every node: the attacker's address under the victim's marker, a withdrawal, each
    // unsigned and signed by the attacker, and the victim's own declaration made to last
    // longer: all refused as invalid. The declaration itself again is the record every node
    // holds (the swarm is smaller than the replica count): stored again, changing nothing.
    const time_point later = declared.expiration + 1s;
    const dht::record overwrite{
        key, victim, declared_address(d.members[attacker].endpoint), later, {}};
    const dht::record tombstone{key, victim, {}, later, {}};
    dht::record extended = declaration;
    extended.expiration = later;
    for (std::size_t i = 0; i < 2; ++i)
        REQUIRE(test::held(d, i, key, victim) == declared);
    const auto statuses = test::raw_store_everywhere(
        d, attacker,
        {overwrite, test::signed_by(overwrite, attacker_identity), tombstone,
         test::signed_by(tombstone, attacker_identity), extended, declaration});
    using dht::store_status;
    for (std::size_t i = 0; i < 2; ++i) {
        INFO("node " << i);
        CHECK(statuses[i] == std::vector<store_status>{store_status::invalid, store_status::invalid,
                                                       store_status::invalid, store_status::invalid,
                                                       store_status::invalid,
                                                       store_status::stored});
        CHECK(test::held(d, i, key, victim) == declared);
    }
    // Peer 1 still finds the victim and they group.
    s.start(1, request_of(1));
    s.wait_for_groups(1, 2);

    // Both withdrew (an empty value 1 ns after the declaration); replaying the declaration
    // does not bring it back.
    d.world.network.time().run_for(1s);
    const time_point withdrawn = declared.expiration + 1ns;
    for (std::size_t i = 0; i < 3; ++i) {
        const auto now_held = test::held(d, i, key, victim);
        REQUIRE(now_held);
        CHECK(now_held->value.empty());
        CHECK(now_held->expiration == withdrawn);
    }
    const auto replayed = test::raw_store_everywhere(d, attacker, {declaration});
    for (std::size_t i = 0; i < 2; ++i)
        CHECK(replayed[i] == std::vector<store_status>{store_status::outdated});
    entry = read_key(s, attacker, key);
    REQUIRE(entry.dictionary.contains(victim));
    CHECK(entry.dictionary.at(victim).value.empty());
    CHECK(entry.dictionary.at(victim).expiration == withdrawn);
}

TEST_CASE("matchmaking: async_wait_withdrawals completes once a cancelled search's declaration "
          "is withdrawn",
          "[matchmaking][withdrawal]") {
    matchmaking_swarm s(3, options_of(2, 4));
    auto& d = s.dht;
    auto& maker = *s.makers[0];
    const auto key = bytes_of(maker.key_of(group_bits(0, 2)));
    const auto marker = test::marker_of(d.members[0].rpc->identity());
    const auto wait_withdrawals = [&] {
        std::optional<std::error_code> done;
        maker.async_wait_withdrawals([&](std::error_code ec) { done = ec; });
        REQUIRE(d.world.run_until([&] { return done.has_value(); }, 60s));
        return *done;
    };

    // None in flight: at once.
    time_point started = d.world.now();
    CHECK_FALSE(wait_withdrawals());
    CHECK(d.world.now() == started);

    // A search alone, cancelled once the others hold its declaration.
    asio::cancellation_signal cancel;
    std::optional<std::error_code> searched;
    auto request = request_of(0);
    request.window = 10s;
    maker.async_find_group(
        request, asio::bind_cancellation_slot(
                     cancel.slot(), [&](std::error_code ec, group_type) { searched = ec; }));
    d.world.network.time().run_for(1s);
    for (std::size_t i : {1, 2}) {
        const auto held_now = test::held(d, i, key, marker);
        REQUIRE(held_now);
        CHECK_FALSE(held_now->value.empty());
    }
    cancel.emit(asio::cancellation_type::all);
    REQUIRE(d.world.run_until([&] { return searched.has_value(); }, 10s));
    CHECK(*searched == errc::cancelled);
    // The search has ended, its withdrawal has not landed yet.
    for (std::size_t i : {1, 2})
        CHECK_FALSE(test::held(d, i, key, marker)->value.empty());

    // The wait ends once it has: every other node holds the empty value.
    started = d.world.now();
    CHECK_FALSE(wait_withdrawals());
    CHECK(d.world.now() > started);
    for (std::size_t i : {1, 2}) {
        const auto held_now = test::held(d, i, key, marker);
        REQUIRE(held_now);
        CHECK(held_now->value.empty());
    }
    // And again, with none in flight: at once.
    started = d.world.now();
    CHECK_FALSE(wait_withdrawals());
    CHECK(d.world.now() == started);
}

TEST_CASE("matchmaking: peers group as usual while an attacker floods their key with bogus "
          "declarations",
          "[matchmaking][protection]") {
    constexpr std::size_t peers = 8;
    constexpr std::size_t sybils = 16;
    matchmaking_swarm s(peers, options_of(2, 4));
    auto& d = s.dht;
    d.add(5000); // the attacker
    test::bootstrap(d, peers);
    const std::size_t attacker = peers;
    const auto& attacker_identity = d.members[attacker].rpc->identity();
    const auto key = bytes_of(s.makers[0]->key_of(group_bits(0, 2)));
    const auto t0 = d.world.now();
    // Declarations that come before every honest peer's (windows of 6 s) and lead nowhere:
    // the attacker's own, at its address (no matchmaker there), and sybils' (keys it made)
    // at an honest peer's address or at the attacker's (a dial finds another key there).
    auto [own_ec, own] = test::wait_for<std::error_code, dht::store_outcome>(d.world, [&](auto h) {
        d.members[attacker].dht->async_store(
            dht::record{.key = key,
                        .subkey = test::marker_of(attacker_identity),
                        .value = declared_address(d.members[attacker].endpoint),
                        .expiration = t0 + 5s,
                        .signature = {}},
            h);
    });
    REQUIRE_FALSE(own_ec);
    const std::vector<byte_buffer> nowhere = {declared_address(d.members[0].endpoint),
                                              declared_address(d.members[attacker].endpoint)};
    // Where the records no reader may take point: a port where nothing listens, so a dial
    // there would show as a refused connection.
    const auto dead = declared_address({d.members[attacker].transport->node(), 999});
    std::vector<dht::record> flood;
    std::vector<dht::store_status> expected;
    using dht::store_status;
    for (std::size_t n = 0; n < sybils; ++n) {
        const auto sybil = random_identity(9000 + n);
        const auto when = t0 + 5s - std::chrono::milliseconds(10 * n);
        flood.push_back(test::signed_by(
            {key, test::marker_of(sybil), nowhere[n % nowhere.size()], when, {}}, sybil));
        expected.push_back(store_status::stored);
    }
    // Under the honest peers' markers, unsigned and signed by the attacker: refused. Under
    // their PeerIds' bytes (no marker) and under subkeys a sybil signs that are not exactly
    // one marker: kept, and no reader takes them for declarations. A year ahead: refused.
    const auto sybil = random_identity(8999);
    for (std::size_t i = 0; i < peers; ++i) {
        const dht::record forged{
            key, test::marker_of(d.members[i].rpc->identity()), dead, t0 + 5s, {}};
        flood.push_back(forged);
        flood.push_back(test::signed_by(forged, attacker_identity));
        flood.push_back({key, to_buffer(d.members[i].rpc->id().view()), dead, t0 + 5s, {}});
        expected.insert(expected.end(),
                        {store_status::invalid, store_status::invalid, store_status::stored});
    }
    const auto marker = test::marker_of(sybil);
    auto twice = marker;
    twice.insert(twice.end(), marker.begin(), marker.end());
    auto prefixed = bytes_of("x");
    prefixed.insert(prefixed.end(), marker.begin(), marker.end());
    flood.push_back(test::signed_by({key, twice, dead, t0 + 5s, {}}, sybil));
    flood.push_back(test::signed_by({key, prefixed, dead, t0 + 5s, {}}, sybil));
    flood.push_back(test::signed_by({key, marker, dead, t0 + 8760h, {}}, sybil));
    expected.insert(expected.end(),
                    {store_status::stored, store_status::stored, store_status::too_far_ahead});
    const auto statuses = test::raw_store_everywhere(d, attacker, flood);
    for (std::size_t i = 0; i < peers; ++i) {
        INFO("node " << i);
        CHECK(statuses[i] == expected);
    }
    // Every bogus declaration that was kept is in the key: 1 + sybils + peers + 2.
    CHECK(read_key(s, 0, key).dictionary.size() == 1 + sybils + peers + 2);

    std::set<crypto::peer_id> honest;
    for (std::size_t i = 0; i < peers; ++i) {
        honest.insert(d.members[i].rpc->id());
        s.start(i, request_of(i));
    }
    const auto refused_before = d.world.network.statistics().connections_refused;
    for (const auto& [id, g] : s.wait_for_groups(2, 4))
        for (const auto& m : g.members)
            CHECK(honest.contains(m.peer.id));
    CHECK(d.world.network.statistics().connections_refused == refused_before);
    WARN("grouped " << (d.world.now() - t0).count() / 1'000'000 << " ms after the flood");
}

namespace {

/// How the bogus join requests of a flood ended, as their senders saw them.
struct join_flood_tally {
    std::size_t finished = 0;
    std::size_t refused = 0;   ///< errc::refused: the leader held max_pending_joins
    std::size_t timed_out = 0; ///< a silent request, held until the leader's join_timeout
    std::map<averaging::join_status, std::size_t> answered;
    std::size_t other = 0;
};

/// One bogus join request from `from` to `leader`: `request` written (none: silent), then
/// the first message or status read.
asio::awaitable<void> bogus_join(net::node<net::sim::transport>& from,
                                 net::node<net::sim::transport>::peer leader, std::string method,
                                 std::optional<byte_buffer> request, join_flood_tally& tally) {
    net::call_stream stream;
    auto ec = co_await from.open_call(leader, std::move(method), 30s, stream);
    if (!ec && request) {
        // A leader that refused before reading may have ended the stream: what matters is
        // the status the read returns.
        const auto written = co_await stream.write(std::move(*request));
        (void)written;
    }
    byte_buffer message;
    if (!ec) ec = co_await stream.read(message);
    averaging::join_response response;
    if (ec == errc::refused)
        ++tally.refused;
    else if (ec == errc::timeout)
        ++tally.timed_out;
    else if (!ec && !averaging::decode(message, response))
        ++tally.answered[response.status];
    else
        ++tally.other;
    ++tally.finished;
}

} // namespace

TEST_CASE("matchmaking: a leader flooded with 10,000 bogus join requests serves at most "
          "max_pending_joins at once, refuses the rest with refused, and 4 peers still group",
          "[matchmaking][protection][overload]") {
    auto options = options_of(2, 4);
    CHECK(options.max_pending_joins == 64);
    matchmaking_swarm s(4, options);
    auto& d = s.dht;
    constexpr std::size_t sybils = 8, per_sybil = 1250;
    std::vector<std::size_t> sybil_members;
    for (std::size_t n = 0; n < sybils; ++n) {
        d.add_rpc(random_identity(7000 + n)); // an identity of its own; serves nothing
        sybil_members.push_back(d.members.size() - 1);
    }
    const auto key = s.makers[0]->key_of(group_bits(0, 2));
    const std::string method = options.prefix + ".join";
    const auto window = 15s;

    // Peer 0 starts first, so it comes first in the order: the others ask it to lead.
    auto first = request_of(0);
    first.window = window;
    s.start(0, first);
    d.world.network.time().run_for(500ms);

    // The flood, in four kinds: silent (the call opens and nothing comes), garbage, another
    // schema, and a declaration that has already expired. Each sybil has one connection to
    // the leader, which takes 128 streams from it at once.
    join_flood_tally tally;
    const auto now = d.world.now();
    for (std::size_t n = 0; n < sybils; ++n) {
        auto& sybil = *d.members[sybil_members[n]].rpc;
        for (std::size_t k = 0; k < per_sybil; ++k) {
            std::optional<byte_buffer> request;
            averaging::join_request valid{
                7, key, now + 10s,
                averaging::member_wire{member_role::node,
                                       1.0,
                                       net::sim::transport::to_address(d.members[0].endpoint),
                                       {}}};
            switch (k % 4) {
            case 0:
                break;
            case 1:
                request = random_bytes(40, k);
                break;
            case 2:
                valid.schema_hash = 8;
                request = averaging::encode(valid);
                break;
            default:
                valid.expiration = now - 1s;
                request = averaging::encode(valid);
                break;
            }
            asio::co_spawn(
                sybil.get_executor(),
                bogus_join(sybil, d.members[0].address(), method, std::move(request), tally),
                asio::detached);
        }
    }
    for (std::size_t i = 1; i < 4; ++i) {
        auto r = request_of(i);
        r.window = window;
        s.start(i, r);
    }
    const std::size_t flood = sybils * per_sybil;
    REQUIRE(d.world.run_until([&] { return tally.finished == flood; }, 3600s));
    std::set<crypto::peer_id> honest;
    for (std::size_t i = 0; i < 4; ++i)
        honest.insert(d.members[i].rpc->id());
    const auto groups = s.wait_for_groups(1, 4);
    REQUIRE(groups.size() == 1);
    const auto& members = groups.begin()->second.members;
    CHECK(members.front().peer.id == d.members[0].rpc->id());
    for (const auto& m : members)
        CHECK(honest.contains(m.peer.id));

    // Every bogus request got a typed answer: refused at the cap, or, served within it,
    // the timeout of a silent one, the join status its request deserves, or not_looking
    // when it was read after the group formed (the flood goes on after the real peers group).
    CHECK(tally.other == 0);
    const std::size_t quarter = flood / 4;
    CHECK(tally.refused + tally.timed_out + tally.answered[averaging::join_status::bad_request] +
              tally.answered[averaging::join_status::bad_schema_hash] +
              tally.answered[averaging::join_status::not_declared] +
              tally.answered[averaging::join_status::not_looking] ==
          flood);
    CHECK(tally.answered.size() <= 4);
    CHECK(tally.timed_out <= quarter);
    CHECK(tally.refused > flood / 2);

    const auto& leader = s.makers[0]->statistics();
    CHECK(leader.peak_pending_joins == options.max_pending_joins);
    CHECK(leader.pending_joins == 0);
    CHECK(leader.joins_accepted == 3);
    // The leader's refusals are exactly those the sybils saw and those the real peers saw.
    std::uint64_t real_refused = 0, real_sent = 0;
    for (std::size_t i = 1; i < 4; ++i) {
        const auto& follower = s.makers[i]->statistics();
        CHECK(follower.joins_refused == 0);
        CHECK(follower.peak_pending_joins < options.max_pending_joins);
        real_refused += follower.requests_refused;
        real_sent += follower.requests_sent;
    }
    CHECK(leader.requests_sent == 0);
    CHECK(leader.joins_refused == tally.refused + real_refused);
    const std::uint64_t bogus_served = flood - tally.refused;
    CHECK(leader.joins_served >= bogus_served + 3);
    CHECK(leader.joins_served <= bogus_served + real_sent - real_refused);
    WARN("grouped "
         << std::chrono::duration_cast<std::chrono::milliseconds>(d.world.now() - now).count()
         << " ms after the flood began; " << tally.refused << " bogus and " << real_refused
         << " real requests refused");
}

TEST_CASE("matchmaking wire: exact bytes, canonical round trips, hostile input refused",
          "[matchmaking]") {
    averaging::join_request request;
    request.schema_hash = 0x0102030405060708;
    request.group_key = "k.0b1";
    request.expiration = time_point(duration(0x10));
    request.member.role = member_role::aux;
    request.member.bandwidth = 1.0;
    request.member.address = net::peer_address::parse("/ip4/1.2.3.4/tcp/5").value();
    request.member.metadata = bytes_of({0xAB});
    const auto bytes = encode(request);
    CHECK(hex(bytes) == "01 01 08 07 06 05 04 03 02 01 05 00 00 00 6b 2e 30 62 31 10 00 00 00 00 "
                        "00 00 00 02 00 00 00 00 00 00 f0 3f 01 00 07 31 2e 32 2e 33 2e 34 05 00 "
                        "00 01 00 00 00 ab");
    averaging::join_request back;
    REQUIRE_FALSE(decode(bytes, back));
    CHECK(back == request);
    for (std::size_t n = 0; n < bytes.size(); ++n)
        CHECK(decode(byte_view(bytes).first(n), back));
    auto trailing = bytes;
    trailing.push_back(std::byte{0});
    CHECK(decode(trailing, back) == errc::trailing_data);
    auto bad_role = bytes;
    bad_role[27] = std::byte{3};
    CHECK(decode(bad_role, back) == errc::corrupt_data);

    averaging::join_response response;
    response.status = averaging::join_status::not_a_leader;
    response.leader.emplace(identity_of(3).id(), net::peer_address::parse("/sim/4/port/9").value());
    averaging::join_response response_back;
    REQUIRE_FALSE(decode(encode(response), response_back));
    CHECK(response_back == response);
    auto bad_status = encode(response);
    bad_status[2] = std::byte{averaging::max_join_status + 1};
    CHECK(decode(bad_status, response_back) == errc::corrupt_data);

    averaging::group_message group;
    group.id[0] = std::byte{9};
    group.members.emplace_back(identity_of(1).id(), request.member);
    averaging::member_wire client;
    client.role = member_role::client;
    group.members.emplace_back(identity_of(2).id(), client);
    averaging::group_message group_back;
    const auto group_bytes = encode(group);
    REQUIRE_FALSE(decode(group_bytes, group_back));
    CHECK(group_back == group);
    CHECK(encode(group_back) == group_bytes);
    // A member count the remaining bytes cannot hold is refused before anything is built.
    auto huge = group_bytes;
    huge[34] = std::byte{0xFF};
    huge[35] = std::byte{0xFF};
    CHECK(decode(huge, group_back));

    averaging::disband_message disband;
    CHECK(hex(encode(disband)) == "01 04 00");
    disband.leader = response.leader;
    const auto disband_bytes = encode(disband);
    averaging::disband_message disband_back;
    REQUIRE_FALSE(decode(disband_bytes, disband_back));
    CHECK(disband_back == disband);
    CHECK(encode(disband_back) == disband_bytes);
    for (std::size_t n = 0; n < disband_bytes.size(); ++n)
        CHECK(decode(byte_view(disband_bytes).first(n), disband_back));
    CHECK(decode(encode(group), disband_back) == errc::protocol_violation);
}

} // namespace hivemesh::test
