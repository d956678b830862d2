// progress::tracker on simulated swarms (basic_peer over net::sim, virtual time) and over
// loopback TCP (hivemesh::peer): epochs advanced together, the ETA, withdrawal and expiry,
// forged and malformed records, clients and auxiliary peers, the waits.
#include "support/identities.hpp"
#include "support/sim_peers.hpp"

#include <hivemesh/dht/messages.hpp>
#include <hivemesh/net/sim.hpp>
#include <hivemesh/peer.hpp>
#include <hivemesh/progress/tracker.hpp>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_future.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

using namespace hivemesh;
using namespace std::chrono_literals;

namespace {

using test::sim_peer;
using sim_swarm = test::sim_peers;
using sim_tracker = progress::tracker<net::sim::transport>;
using tcp_tracker = progress::tracker<net::tcp::transport>;

double seconds(duration d) {
    return std::chrono::duration<double>(d).count();
}

progress::tracker_options run_options(std::uint64_t target) {
    progress::tracker_options o;
    o.run_id = "run";
    o.target_batch_size = target;
    return o;
}

/// A trainer in virtual time: `batch` samples every `interval`, each batch reported; with
/// `advance`, it ends its epoch whenever the tracker says it is ready, until `last_epoch`.
struct trainer {
    trainer(std::uint64_t samples_per_batch, duration every)
        : batch(samples_per_batch)
        , interval(every) {}

    std::uint64_t batch;
    duration interval;
    bool advance = false;
    std::uint64_t last_epoch = 0;

    std::uint64_t epoch = 0;
    std::uint64_t samples = 0;
    time_point last_report{};
    std::vector<std::uint64_t> contributed;       ///< samples when it left each epoch
    std::vector<time_point> left_at;              ///< when it left each epoch
    std::vector<std::uint64_t> global_epoch_seen; ///< the global epoch it saw then
    bool stop = false;
    bool running = false;
};

template <class Tracker>
asio::awaitable<void> train(Tracker* t, trainer* s, const sim_swarm* swarm) {
    net::sim::timer timer(co_await asio::this_coro::executor);
    s->running = true;
    while (!s->stop && (!s->advance || s->epoch < s->last_epoch)) {
        timer.expires_after(s->interval);
        co_await timer.async_wait(default_token_t{});
        if (s->stop) break; // the tracker may be gone
        s->samples += s->batch;
        s->last_report = swarm->now();
        t->report_local_progress(s->epoch, s->samples);
        if (s->advance && t->ready_to_update_epoch()) {
            s->contributed.push_back(s->samples);
            s->left_at.push_back(swarm->now());
            s->global_epoch_seen.push_back(t->global_progress().epoch);
            ++s->epoch;
            s->samples = 0;
            t->update_epoch(s->epoch);
        }
    }
    s->running = false;
}

void start(sim_swarm& swarm, sim_tracker& t, trainer& s) {
    s.running = true; // from now on, not only once the coroutine runs
    asio::co_spawn(swarm.network.get_executor(), train(&t, &s, &swarm), asio::detached);
}

template <class Trackers>
bool all_see(const Trackers& trackers, std::size_t peers) {
    return std::all_of(trackers.begin(), trackers.end(),
                       [&](const auto& t) { return t->global_progress().num_peers == peers; });
}

} // namespace

TEST_CASE("five peers of uneven speed advance their epochs together", "[progress][sim]") {
    sim_swarm swarm(11);
    constexpr std::uint64_t target = 900;
    // About 9.7, 21.7, 41.2, 36.4 and 47.2 samples/s in batches that never come in step:
    // 156 samples/s, an epoch in about 5.8 s.
    const std::vector<std::pair<std::uint64_t, duration>> speeds{
        {3, 310ms}, {5, 230ms}, {7, 170ms}, {4, 110ms}, {25, 530ms}};
    for (std::size_t i = 0; i < speeds.size(); ++i)
        swarm.add_peer();
    std::vector<std::unique_ptr<sim_tracker>> trackers;
    std::deque<trainer> trainers;
    for (std::size_t i = 0; i < speeds.size(); ++i) {
        trackers.push_back(std::make_unique<sim_tracker>(swarm.peers[i], run_options(target)));
        auto& s = trainers.emplace_back(speeds[i].first, speeds[i].second);
        s.advance = true;
        s.last_epoch = 3;
        start(swarm, *trackers.back(), s);
    }
    const time_point start_time = swarm.now();
    REQUIRE(swarm.run_until(
        [&] {
            return std::none_of(trainers.begin(), trainers.end(),
                                [](auto& s) { return s.running; });
        },
        300s));
    for (const auto& s : trainers) {
        CHECK(s.epoch == 3);
        REQUIRE(s.contributed.size() == 3);
        // Nobody skipped an epoch: the global epoch it saw was never beyond its next one.
        for (std::size_t e = 0; e < 3; ++e)
            CHECK(s.global_epoch_seen[e] <= e + 1);
    }
    for (std::size_t e = 0; e < 3; ++e) {
        std::uint64_t sum = 0;
        time_point first = time_point::max(), last = time_point::min();
        for (const auto& s : trainers) {
            sum += s.contributed[e];
            first = std::min(first, s.left_at[e]);
            last = std::max(last, s.left_at[e]);
        }
        INFO("epoch " << e << ": " << sum << " samples, left between "
                      << seconds(first - start_time) << " s and " << seconds(last - start_time)
                      << " s");
        // The epoch ended with the target reached, and not much later: every peer left within
        // a second of the first (min_refresh is 0.5 s), so the swarm overshot by less than a
        // second of its 156 samples/s.
        CHECK(sum >= target);
        CHECK(sum <= target + 150);
        CHECK(last - first <= 1s);
    }
    // What everyone published landed: the estimates agree on the final epoch.
    swarm.run_for(1s);
    for (const auto& t : trackers) {
        CHECK(t->global_progress().epoch == 3);
        CHECK(t->statistics().publication_failures == 0);
        CHECK(t->statistics().fetch_failures == 0);
    }
}

TEST_CASE("a peer that stays one epoch behind (still averaging) does not end the next epoch for "
          "the peers ahead",
          "[progress][sim]") {
    sim_swarm swarm(13);
    constexpr std::uint64_t target = 500;
    swarm.add_peer();
    swarm.add_peer();
    std::vector<std::unique_ptr<sim_tracker>> trackers;
    std::deque<trainer> trainers;
    for (std::size_t i = 0; i < 2; ++i) {
        trackers.push_back(std::make_unique<sim_tracker>(swarm.peers[i], run_options(target)));
        trainers.emplace_back(5, 100ms); // 50 samples/s each
    }
    auto& ahead = trainers[0];
    auto& stuck = trainers[1];
    ahead.advance = true;
    ahead.last_epoch = 2;
    start(swarm, *trackers[0], ahead);
    start(swarm, *trackers[1], stuck);
    // Epoch 0 ends after about 5 s; then the other peer stops reporting and stays at epoch 0,
    // as a peer whose round of epoch 0 goes on does. Its record lives on (60 s).
    REQUIRE(swarm.run_until([&] { return ahead.epoch == 1; }, 60s));
    stuck.stop = true;
    REQUIRE(swarm.run_until([&] { return !ahead.running; }, 40s));
    REQUIRE(ahead.contributed.size() == 2);
    INFO("epoch 1: " << ahead.contributed[1] << " samples, "
                     << seconds(ahead.left_at[1] - ahead.left_at[0]) << " s");
    // Its own 50 samples/s make the target, less at most the other's rate over the last read
    // period (0.5 s near the ETA). Counting the other's rate from the start of epoch 1 ended
    // it at about half the target.
    CHECK(ahead.contributed[1] >= target - 50);
    CHECK(trackers[0]->global_progress().epoch == 2);
}

TEST_CASE("the ETA follows the extrapolation and shrinks when a fast peer joins",
          "[progress][sim]") {
    sim_swarm swarm(12);
    constexpr std::uint64_t target = 100000;
    for (int i = 0; i < 4; ++i)
        swarm.add_peer();
    std::vector<std::unique_ptr<sim_tracker>> trackers;
    std::deque<trainer> trainers;
    const auto join = [&](std::size_t i, std::uint64_t batch) {
        trackers.push_back(std::make_unique<sim_tracker>(swarm.peers[i], run_options(target)));
        auto& s = trainers.emplace_back(batch, 1s);
        start(swarm, *trackers.back(), s);
    };
    const time_point t0 = swarm.now();
    for (std::size_t i = 0; i < 3; ++i)
        join(i, 10); // 10 samples/s each
    // Reports land on the line samples = rate · (t − start), so whichever record a peer read,
    // extrapolating it to t gives the same count: the oracle is exact up to rounding.
    const auto check_estimate = [&](const sim_tracker& t, double expected_rate,
                                    const auto& expected_samples_at) {
        const auto g = t.global_progress();
        const double at = seconds(g.estimated_at - t0);
        const double samples = expected_samples_at(at);
        CHECK(g.samples_per_second == Approx(expected_rate).epsilon(1e-9));
        CHECK(g.estimated_samples == Approx(samples).epsilon(1e-9));
        const double eta = at + (static_cast<double>(target) - samples) / expected_rate;
        CHECK(seconds(g.eta - t0) == Approx(eta).epsilon(1e-11));
        // The ETA is far: the longest period, or what is left of it since the last read.
        CHECK(g.next_fetch > g.estimated_at);
        CHECK(g.next_fetch <= g.estimated_at + 10s);
        return g.eta;
    };
    // Long enough for every peer to read the others' records with their rates.
    swarm.run_for(15s);
    std::vector<time_point> before;
    for (std::size_t i = 0; i < 3; ++i) {
        CHECK(trackers[i]->global_progress().num_peers == 3);
        before.push_back(check_estimate(*trackers[i], 30, [](double at) { return 30 * at; }));
    }
    // 100000 / 30 s after the start, whoever says it.
    CHECK(seconds(before[0] - t0) == Approx(100000.0 / 30).epsilon(1e-11));

    swarm.run_for(2500ms);
    const time_point joined = swarm.now();
    join(3, 100); // 100 samples/s
    const double tj = seconds(joined - t0);
    swarm.run_for(15s); // its first report, then a read by everyone
    for (std::size_t i = 0; i < 4; ++i) {
        CHECK(trackers[i]->global_progress().num_peers == 4);
        const auto eta =
            check_estimate(*trackers[i], 130, [&](double at) { return 30 * at + 100 * (at - tj); });
        CHECK(seconds(eta - t0) == Approx((target + 100 * tj) / 130).epsilon(1e-11));
        if (i < 3) CHECK(eta < before[i]);
    }
}

TEST_CASE("withdrawn and expired records drop out of the count", "[progress][sim]") {
    sim_swarm swarm(13);
    constexpr std::size_t count = 5;
    for (std::size_t i = 0; i < count; ++i)
        swarm.add_peer();
    std::vector<std::unique_ptr<sim_tracker>> trackers;
    std::deque<trainer> trainers;
    for (std::size_t i = 0; i < count; ++i) {
        trackers.push_back(std::make_unique<sim_tracker>(swarm.peers[i], run_options(1000000)));
        auto& s = trainers.emplace_back(10, 1s);
        start(swarm, *trackers.back(), s);
    }
    REQUIRE(swarm.run_until([&] { return all_see(trackers, count); }, 30s));
    std::vector<const sim_tracker*> watching{trackers[0].get(), trackers[1].get(),
                                             trackers[2].get()};

    SECTION("a destroyed tracker withdraws its record at once") {
        trainers[4].stop = true;
        const time_point withdrawn = swarm.now();
        trackers[4].reset();
        watching.push_back(trackers[3].get());
        REQUIRE(swarm.run_until([&] { return all_see(watching, count - 1); }, 30s));
        // Within one read (max_refresh 10 s, plus the read's round trips), long before the
        // record would expire (60 s).
        CHECK(swarm.now() - withdrawn <= 10s + 200ms);
    }
    SECTION("a crashed peer's record counts until its report is record_expiration old") {
        swarm.run_for(3s);
        trainers[4].stop = true;
        swarm.run_for(11s); // its last report is published and read by everyone
        const time_point last_report = trainers[4].last_report;
        REQUIRE(last_report > time_point{});
        swarm.network.crash(swarm.nodes[4]);
        swarm.run_until([&] { return swarm.now() >= last_report + 59500ms; }, 120s);
        CHECK(all_see(watching, count));
        REQUIRE(swarm.run_until([&] { return all_see(watching, count - 1); }, 30s));
        // The observers re-estimate at each of their own reports, once a second.
        CHECK(swarm.now() >= last_report + 60s);
        CHECK(swarm.now() <= last_report + 61s);
    }
}

TEST_CASE("forged and malformed records are refused and never counted", "[progress][sim]") {
    sim_swarm swarm(14);
    for (int i = 0; i < 3; ++i)
        swarm.add_peer();
    auto& rogue = swarm.add_peer(); // runs no tracker, so no schema validator either
    std::vector<std::unique_ptr<sim_tracker>> trackers;
    std::deque<trainer> trainers;
    for (std::size_t i = 0; i < 3; ++i) {
        trackers.push_back(std::make_unique<sim_tracker>(swarm.peers[i], run_options(1000000)));
        auto& s = trainers.emplace_back(10, 1s);
        start(swarm, *trackers.back(), s);
    }
    REQUIRE(swarm.run_until([&] { return all_see(trackers, 3); }, 30s));
    auto& a = swarm.peers[0];
    auto& b = swarm.peers[1];
    auto& c = swarm.peers[2];
    const byte_buffer key = to_buffer(as_bytes(trackers[0]->key()));
    const auto marker_of = [](sim_peer& p) {
        return to_buffer(as_bytes(dht::owner_marker(p.rpc().identity().public_key())));
    };
    const auto valid_value = progress::encode({.epoch = 50,
                                               .samples_accumulated = 999999,
                                               .samples_per_second = 1e6,
                                               .report_time = swarm.now(),
                                               .client = false});
    const time_point expiration = swarm.now() + 30s;

    // Stores through the DHT API: the writer's own node refuses what no replica would take.
    const auto store = [&](sim_peer& p, dht::record r) {
        std::optional<std::pair<std::error_code, dht::store_outcome>> result;
        p.dht().async_store(
            std::move(r), [&](std::error_code ec, dht::store_outcome o) { result.emplace(ec, o); });
        swarm.run_until([&] { return result.has_value(); }, 30s);
        REQUIRE(result);
        return *result;
    };
    SECTION("a record under another peer's marker") {
        for (auto* writer : {&a, &rogue}) {
            const auto [ec, outcome] =
                store(*writer, {key, marker_of(b), valid_value, expiration, {}});
            CHECK(ec == errc::store_refused);
            CHECK(outcome.refusal == dht::store_status::invalid);
        }
    }
    SECTION("a malformed value under the writer's own marker") {
        const auto [ec, outcome] =
            store(a, {key, marker_of(a), test::bytes_of("not a record"), expiration, {}});
        CHECK(ec == errc::store_refused);
        CHECK(outcome.refusal == dht::store_status::invalid);
    }
    SECTION("stores sent straight to a replica, past the writer's own checks") {
        dht::record forged{key, marker_of(b), valid_value, expiration, {}};
        const auto signature = a.rpc().identity().sign(dht::signing_payload(forged));
        forged.signature.assign(signature.view().begin(), signature.view().end());
        dht::record malformed{key, marker_of(a), test::bytes_of("xyz"), expiration, {}};
        dht::owner_validator(a.rpc().identity()).sign(malformed);
        REQUIRE_FALSE(malformed.signature.empty());
        dht::record plain{key, std::nullopt, valid_value, expiration, {}};
        dht::record control{
            to_buffer(as_bytes("unrelated")), std::nullopt, valid_value, expiration, {}};
        dht::store_request request{
            {}, {{forged, false}, {malformed, false}, {plain, false}, {control, false}}};
        std::optional<std::pair<std::error_code, byte_buffer>> reply;
        a.rpc().async_call({c.id(), *c.announce_endpoint()}, "dht.store", dht::encode(request), 10s,
                           [&](std::error_code ec, byte_buffer body) { reply.emplace(ec, body); });
        REQUIRE(swarm.run_until([&] { return reply.has_value(); }, 30s));
        REQUIRE_FALSE(reply->first);
        dht::store_response response;
        REQUIRE_FALSE(dht::decode(reply->second, response));
        CHECK(response.statuses == std::vector<dht::store_status>{
                                       dht::store_status::invalid, dht::store_status::invalid,
                                       dht::store_status::invalid, dht::store_status::stored});
    }
    SECTION("a peer without the schema check keeps a malformed value: readers drop it") {
        // The rogue's own node accepts it (it checks only signatures); it is the nearest
        // replica or not, but no reader counts it.
        store(rogue, {key, marker_of(rogue), test::bytes_of("garbage"), expiration, {}});
        store(rogue, {key, std::nullopt, valid_value, expiration, {}});
    }
    // However it went, nobody counts anything but the three trackers: their next reads see
    // exactly three peers at epoch 0 and none of the forged samples.
    swarm.run_for(12s);
    std::uint64_t trained = 0;
    for (const auto& s : trainers)
        trained += s.samples;
    for (const auto& t : trackers) {
        const auto g = t->global_progress();
        CHECK(g.num_peers == 3);
        CHECK(g.epoch == 0);
        CHECK(g.samples_accumulated <= trained);
        CHECK(g.samples_per_second == Approx(30).epsilon(1e-9));
    }
}

TEST_CASE("clients count with their samples, aux peers not at all", "[progress][sim]") {
    sim_swarm swarm(15);
    auto& node = swarm.add_peer();
    auto& aux = swarm.add_peer();
    auto& client = swarm.add_peer(true);
    REQUIRE(client.client_mode());
    auto aux_options = run_options(1000000);
    aux_options.reports_samples = false;
    sim_tracker tn(node, run_options(1000000));
    sim_tracker tx(aux, aux_options);
    sim_tracker tc(client, run_options(1000000)); // a client because its peer is one
    CHECK_FALSE(tn.is_client());
    CHECK(tc.is_client());
    trainer sn(10, 1s);
    trainer sc(5, 1s);
    start(swarm, tn, sn);
    start(swarm, tc, sc);
    swarm.run_for(12s);
    sn.stop = sc.stop = true;
    swarm.run_for(12s); // the last reports are published and read
    REQUIRE(sn.samples > 0);
    REQUIRE(sc.samples > 0);
    for (const auto* t : {&tn, &tx, &tc}) {
        const auto g = t->global_progress();
        CHECK(g.num_peers == 2);
        CHECK(g.num_clients == 1);
        CHECK(g.epoch == 0);
        CHECK(g.samples_accumulated == sn.samples + sc.samples);
        CHECK(g.samples_per_second == Approx(15).epsilon(1e-9));
    }
    CHECK(tx.statistics().publications == 0);
    CHECK(tn.statistics().publications > 0);
    CHECK(tc.statistics().publications > 0);

    // A client ahead does not move the global epoch; its samples there count for nobody else.
    tc.update_epoch(5);
    swarm.run_for(12s);
    for (const auto* t : {&tn, &tx}) {
        const auto g = t->global_progress();
        CHECK(g.epoch == 0);
        CHECK(g.samples_accumulated == sn.samples);
        CHECK(g.num_clients == 1);
        CHECK(g.samples_per_second == Approx(15).epsilon(1e-9));
    }
    CHECK(tc.global_progress().epoch == 5); // its own epoch counts for itself
    CHECK(tc.global_progress().samples_accumulated == 0);
    CHECK_FALSE(tx.ready_to_update_epoch());
    // A node's epoch does: the aux peer, still at 0, is told to move on.
    tn.update_epoch(1);
    swarm.run_for(12s);
    CHECK(tx.global_progress().epoch == 1);
    CHECK(tx.ready_to_update_epoch());
    CHECK(tc.global_progress().epoch == 5);
}

TEST_CASE("waiting for readiness ends at the ETA, and waits can be cancelled", "[progress][sim]") {
    sim_swarm swarm(16);
    auto& lone = swarm.add_peer();
    sim_tracker t(lone, run_options(25));
    const time_point t0 = swarm.now();
    trainer s(10, 1s); // 10 samples/s: 25 extrapolated at t0 + 2.5 s
    start(swarm, t, s);

    std::optional<std::pair<std::error_code, progress::global_training_progress>> ready;
    std::optional<time_point> ready_at;
    t.async_wait_until_ready([&](std::error_code ec, progress::global_training_progress g) {
        ready.emplace(ec, g);
        ready_at = swarm.now();
    });
    const auto seen = t.global_progress().version;
    std::optional<std::pair<std::error_code, progress::global_training_progress>> update;
    t.async_wait_for_update(seen, [&](std::error_code ec, progress::global_training_progress g) {
        update.emplace(ec, g);
    });
    asio::cancellation_signal cancel;
    std::optional<std::error_code> cancelled;
    t.async_wait_for_update(
        std::numeric_limits<std::uint64_t>::max(),
        asio::bind_cancellation_slot(
            cancel.slot(),
            [&](std::error_code ec, progress::global_training_progress) { cancelled = ec; }));
    REQUIRE(swarm.run_until([&] { return ready.has_value(); }, 10s));
    CHECK_FALSE(ready->first);
    // The estimate is made at the last report (2 s, 20 samples); readiness comes at the ETA,
    // not at the next report (3 s): exactly t0 + 2.5 s (to the nanosecond the ETA rounds up).
    CHECK(ready->second.eta - t0 >= 2500ms);
    CHECK(ready->second.eta - t0 <= 2500ms + 1ns);
    CHECK(*ready_at == ready->second.eta);
    CHECK(ready->second.samples_accumulated == 20);
    CHECK(t.ready_to_update_epoch());
    REQUIRE(update);
    CHECK_FALSE(update->first);
    CHECK(update->second.version > seen);
    CHECK_FALSE(cancelled);

    cancel.emit(asio::cancellation_type::terminal);
    REQUIRE(swarm.run_until([&] { return cancelled.has_value(); }, 1s));
    CHECK(*cancelled == errc::cancelled);

    // Ready at once while ready; after update_epoch, not before the new target is near.
    std::optional<std::error_code> again;
    t.async_wait_until_ready(
        [&](std::error_code ec, progress::global_training_progress) { again = ec; });
    REQUIRE(swarm.run_until([&] { return again.has_value(); }, 1ms));
    CHECK_FALSE(*again);
    s.stop = true;
    t.update_epoch(1);
    CHECK_FALSE(t.ready_to_update_epoch());
    std::optional<std::error_code> closing;
    t.async_wait_until_ready(
        [&](std::error_code ec, progress::global_training_progress) { closing = ec; });
    swarm.run_for(1s);
    CHECK_FALSE(closing);
    std::optional<std::error_code> closed;
    t.async_close([&](std::error_code ec) { closed = ec; });
    REQUIRE(swarm.run_until([&] { return closing.has_value() && closed.has_value(); }, 30s));
    CHECK(*closing == errc::cancelled);
    CHECK_FALSE(*closed); // the tombstone was stored (on this peer, the only replica)
    // Closed: reports are ignored, another close completes at once.
    t.report_local_progress(1, 100);
    CHECK(t.local_progress().samples_accumulated == 0);
    std::optional<std::error_code> twice;
    t.async_close([&](std::error_code ec) { twice = ec; });
    REQUIRE(swarm.run_until([&] { return twice.has_value(); }, 1ms));
    CHECK_FALSE(*twice);
}

TEST_CASE("the samples-per-second EMA and the publication follow the reports", "[progress][sim]") {
    sim_swarm swarm(17);
    auto& p = swarm.add_peer();
    auto& q = swarm.add_peer();
    sim_tracker tp(p, run_options(1000000));
    sim_tracker tq(q, run_options(1000000));
    // The first report only starts the measurement: the 3 s before it may have been spent
    // waiting, not training.
    swarm.run_for(3s);
    tp.report_local_progress(0, 2);
    CHECK(tp.local_progress().samples_per_second == 0);
    // Reports at an uneven rate: 6 in 0.5 s, then 9 in 1.5 s; the EMA of seconds per sample,
    // bias-corrected, as throughput_ema computes it.
    swarm.run_for(500ms);
    tp.report_local_progress(0, 8);
    swarm.run_for(1500ms);
    tp.report_local_progress(0, 17);
    progress::throughput_ema oracle(0.1);
    oracle.update(6, 500ms);
    oracle.update(9, 1500ms);
    CHECK(tp.local_progress().samples_per_second == oracle.samples_per_second());
    CHECK(tp.local_progress().samples_accumulated == 17);
    // Many reports within min_refresh make one publication, not one each.
    const auto published = tp.statistics().publications;
    swarm.run_for(1s);
    CHECK(tp.statistics().publications == published + 1);
    for (int i = 0; i < 40; ++i) {
        tp.report_local_progress(0, 18 + i);
        swarm.run_for(10ms);
    }
    swarm.run_for(500ms);
    // 0.4 s of reports: one publication at the first (1 s after the last), one 0.5 s later.
    CHECK(tp.statistics().publications == published + 3);
    // A new epoch is published at once: q sees it within its next read.
    tp.update_epoch(4);
    CHECK(tp.global_progress().epoch == 4);
    CHECK(tp.local_progress().samples_accumulated == 0);
    REQUIRE(swarm.run_until([&] { return tq.global_progress().epoch == 4; }, 15s));
    CHECK(tq.ready_to_update_epoch());
    // A peer that resumes from a later checkpoint starts at its epoch, and says so at once.
    auto& r = swarm.add_peer();
    auto resumed = run_options(1000000);
    resumed.initial_epoch = 9;
    sim_tracker tr(r, resumed);
    CHECK(tr.local_progress().epoch == 9);
    CHECK(tr.local_progress().samples_accumulated == 0);
    CHECK(tr.global_progress().epoch == 9);
    REQUIRE(swarm.run_until(
        [&] { return tp.global_progress().epoch == 9 && tq.global_progress().epoch == 9; }, 15s));
    CHECK(tq.global_progress().num_peers == 3);
}

TEST_CASE("bad tracker options are refused with a message that names them", "[progress][sim]") {
    sim_swarm swarm(18);
    auto& p = swarm.add_peer();
    const auto refused = [&](auto change, const std::string& name) {
        auto o = run_options(10);
        change(o);
        try {
            sim_tracker t(p, o);
            FAIL("accepted " << name);
        } catch (const std::invalid_argument& e) {
            CHECK_THAT(e.what(), Catch::Contains(name));
        }
    };
    refused([](auto& o) { o.run_id = ""; }, "run_id");
    refused([](auto& o) { o.run_id = "has space"; }, "run_id");
    refused([](auto& o) { o.target_batch_size = 0; }, "target_batch_size");
    refused([](auto& o) { o.min_refresh = 0s; }, "min_refresh");
    refused([](auto& o) { o.max_refresh = 100ms; }, "max_refresh");
    refused([](auto& o) { o.record_expiration = 900ms; }, "record_expiration");
    refused([](auto& o) { o.samples_per_second_alpha = 0; }, "samples_per_second_alpha");
    refused([](auto& o) { o.samples_per_second_alpha = 1.01; }, "samples_per_second_alpha");
    refused([](auto& o) { o.expected_drift_peers = -1; }, "expected_drift_peers");
    refused([](auto& o) { o.expected_drift_rate = std::nan(""); }, "expected_drift_rate");
}

namespace {

peer_options loopback_options() {
    peer_options o;
    o.listen = {"/ip4/127.0.0.1/tcp/0"};
    o.bootstrap_timeout = 5s;
    o.dht.maintenance_period = 0s;
    return o;
}

/// Waits (without polling: on the tracker's updates) until `done` holds for its estimate.
/// The bound only keeps a broken test from hanging; nothing is asserted about speed.
template <class Predicate>
bool wait_for(tcp_tracker& t, Predicate done) {
    const auto give_up = std::chrono::steady_clock::now() + 60s;
    auto g = t.global_progress();
    while (!done(g)) {
        auto next = t.async_wait_for_update(g.version, asio::use_future);
        if (next.wait_until(give_up) != std::future_status::ready) return false;
        g = next.get();
    }
    return true;
}

} // namespace

TEST_CASE("trackers on peers over loopback TCP count each other and end epochs together",
          "[progress][tcp]") {
    std::deque<peer> peers;
    peers.emplace_back(loopback_options());
    for (int i = 0; i < 2; ++i) {
        auto o = loopback_options();
        o.initial_peers = peers.front().addresses();
        peers.emplace_back(o);
    }
    // Over TCP the reports come microseconds apart, so the rates (and the ETA) mean nothing
    // here: a target this far makes the reported samples decide.
    constexpr std::uint64_t target = 1000000000000;
    auto options = run_options(target);
    options.min_refresh = 100ms;
    options.max_refresh = 500ms;
    std::vector<std::unique_ptr<tcp_tracker>> trackers;
    for (auto& p : peers)
        trackers.push_back(std::make_unique<tcp_tracker>(p, options));
    for (std::size_t i = 0; i < trackers.size(); ++i)
        trackers[i]->report_local_progress(0, 10 * (i + 1)); // 10 + 20 + 30
    for (auto& t : trackers)
        CHECK(wait_for(
            *t, [](const auto& g) { return g.num_peers == 3 && g.samples_accumulated == 60; }));
    CHECK_FALSE(trackers[0]->ready_to_update_epoch());

    // Peer 2 brings the swarm to the target: everyone becomes ready.
    trackers[2]->report_local_progress(0, target - 30); // 10 + 20 + (target − 30)
    for (auto& t : trackers) {
        auto ready = t->async_wait_until_ready(asio::use_future);
        REQUIRE(ready.wait_for(60s) == std::future_status::ready);
        const auto g = ready.get();
        CHECK(g.epoch == 0);
        CHECK(g.samples_accumulated == target);
        CHECK(t->ready_to_update_epoch());
    }
    // One moves on; the others see the later epoch, which makes them ready too.
    trackers[0]->update_epoch(1);
    for (auto& t : trackers)
        CHECK(wait_for(*t, [](const auto& g) { return g.epoch == 1; }));
    CHECK(trackers[1]->ready_to_update_epoch());
    CHECK_FALSE(trackers[0]->ready_to_update_epoch());
    trackers[1]->update_epoch(1);
    trackers[2]->update_epoch(1);
    for (auto& t : trackers)
        CHECK(
            wait_for(*t, [](const auto& g) { return g.epoch == 1 && g.samples_accumulated == 0; }));

    // A closed tracker's record is withdrawn: the others count two peers.
    auto closed = trackers[2]->async_close(asio::use_future);
    REQUIRE(closed.wait_for(60s) == std::future_status::ready);
    CHECK_NOTHROW(closed.get());
    trackers[2].reset();
    for (std::size_t i = 0; i < 2; ++i)
        CHECK(wait_for(*trackers[i], [](const auto& g) { return g.num_peers == 2; }));
    for (std::size_t i = 0; i < 2; ++i) {
        CHECK(trackers[i]->statistics().publication_failures == 0);
        CHECK(trackers[i]->statistics().fetches > 0);
    }
}
