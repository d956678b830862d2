// The progress record's wire format and schema check, the samples-per-second EMA and the
// estimate of the global progress, against exact oracles.
#include "support/bytes.hpp"
#include "support/errors.hpp"
#include "support/identities.hpp"
#include "support/time.hpp"

#include <hivemesh/progress/estimate.hpp>
#include <hivemesh/progress/record.hpp>

#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

using namespace hivemesh;
using namespace std::chrono_literals;

namespace {

progress::progress_record sample_record() {
    return {.epoch = 7,
            .samples_accumulated = 300,
            .samples_per_second = 12.5,
            .report_time = test::at_nanoseconds(0x0102030405060708),
            .client = true};
}

byte_buffer subkey_of(std::uint8_t seed) {
    return to_buffer(as_bytes(dht::owner_marker(test::identity_of(seed).public_key())));
}

dht::record record_at(std::string_view key, std::optional<byte_buffer> subkey, byte_buffer value) {
    return {
        to_buffer(as_bytes(key)), std::move(subkey), std::move(value), test::at_seconds(100), {}};
}

} // namespace

TEST_CASE("a progress record has the documented bytes", "[progress][record]") {
    const auto bytes = progress::encode(sample_record());
    // version | epoch | samples | f64 12.5 | i64 report time | client
    CHECK(test::hex(bytes) == "01 "
                              "07 00 00 00 00 00 00 00 "
                              "2c 01 00 00 00 00 00 00 "
                              "00 00 00 00 00 00 29 40 "
                              "08 07 06 05 04 03 02 01 "
                              "01");
    CHECK(bytes.size() == progress::record_size);
    progress::progress_record back;
    REQUIRE_FALSE(progress::decode(bytes, back));
    CHECK(back == sample_record());
}

TEST_CASE("every field of a progress record round-trips at its limits", "[progress][record]") {
    const auto max = std::numeric_limits<std::uint64_t>::max();
    for (const progress::progress_record r :
         {progress::progress_record{},
          {max, max, std::numeric_limits<double>::max(),
           time_point{duration{std::numeric_limits<std::int64_t>::max()}}, false},
          {0, 0, std::numeric_limits<double>::denorm_min(), test::at_seconds(0), true}}) {
        progress::progress_record back;
        REQUIRE_FALSE(progress::decode(progress::encode(r), back));
        CHECK(back == r);
    }
}

TEST_CASE("a malformed progress record is refused field by field", "[progress][record]") {
    const auto good = progress::encode(sample_record());
    progress::progress_record out;
    SECTION("every truncation") {
        for (std::size_t n = 0; n < good.size(); ++n)
            CHECK(progress::decode(byte_view(good).first(n), out) == errc::truncated_input);
    }
    SECTION("a byte too many") {
        auto longer = good;
        longer.push_back(std::byte{0});
        CHECK(progress::decode(longer, out) == errc::trailing_data);
    }
    SECTION("another version") {
        auto bad = good;
        bad[0] = std::byte{2};
        CHECK(progress::decode(bad, out) == errc::unsupported_version);
    }
    SECTION("samples per second that are negative, NaN or infinite") {
        for (const double rate :
             {-1.0, -std::numeric_limits<double>::denorm_min(),
              std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
            auto bad = good;
            const auto bits = std::bit_cast<std::uint64_t>(rate);
            for (int i = 0; i < 8; ++i)
                bad[17 + i] = static_cast<std::byte>((bits >> (8 * i)) & 0xFF);
            CHECK(progress::decode(bad, out) == errc::corrupt_data);
        }
    }
    SECTION("a report time before the Unix epoch") {
        auto bad = good;
        bad[32] = std::byte{0x80}; // the sign bit of the i64
        CHECK(progress::decode(bad, out) == errc::corrupt_data);
    }
    SECTION("a client flag other than 0 or 1") {
        auto bad = good;
        bad[33] = std::byte{2};
        CHECK(progress::decode(bad, out) == errc::corrupt_data);
    }
    SECTION("the encoder refuses what the decoder would") {
        auto r = sample_record();
        r.samples_per_second = std::numeric_limits<double>::quiet_NaN();
        CHECK(test::thrown_code([&] { progress::encode(r); }) == errc::invalid_argument);
        r.samples_per_second = -0.5;
        CHECK(test::thrown_code([&] { progress::encode(r); }) == errc::invalid_argument);
        r.samples_per_second = 1;
        r.report_time = time_point{-1ns};
        CHECK(test::thrown_code([&] { progress::encode(r); }) == errc::invalid_argument);
    }
}

TEST_CASE("owner markers are recognised exactly", "[progress][record]") {
    const std::string marker = dht::owner_marker(test::identity_of(3).public_key());
    CHECK(progress::is_owner_marker(as_bytes(marker)));
    CHECK_FALSE(progress::is_owner_marker(as_bytes("")));
    CHECK_FALSE(progress::is_owner_marker(as_bytes("[owner:]")));
    CHECK_FALSE(progress::is_owner_marker(as_bytes(marker + "x")));
    CHECK_FALSE(progress::is_owner_marker(as_bytes("x" + marker)));
    CHECK_FALSE(progress::is_owner_marker(as_bytes(marker + marker)));
    CHECK_FALSE(progress::is_owner_marker(as_bytes(marker.substr(0, marker.size() - 1))));
    // A base58 text of another length does not name a 32-byte key.
    CHECK_FALSE(progress::is_owner_marker(as_bytes("[owner:" + marker.substr(7, 10) + "]")));
}

TEST_CASE("the schema check admits records and tombstones under owner markers only",
          "[progress][record]") {
    const auto validator = progress::make_progress_validator("run-1");
    const std::string key = progress::progress_key("run-1");
    CHECK(key == "run-1_progress");
    const auto value = progress::encode(sample_record());
    CHECK_FALSE(validator->validate(record_at(key, subkey_of(1), value)));
    CHECK_FALSE(validator->validate(record_at(key, subkey_of(1), {}))); // a tombstone
    CHECK(validator->validate(record_at(key, std::nullopt, value)) == errc::invalid_argument);
    CHECK(validator->validate(record_at(key, test::bytes_of("peer"), value)) ==
          errc::invalid_argument);
    CHECK(validator->validate(record_at(key, subkey_of(1), test::bytes_of("garbage"))) ==
          errc::unsupported_version);
    CHECK(validator->validate(record_at(key, subkey_of(1), test::bytes_of({1, 2}))) ==
          errc::truncated_input);
    auto trailing = value;
    trailing.push_back(std::byte{1});
    CHECK(validator->validate(record_at(key, subkey_of(1), trailing)) == errc::trailing_data);
    // Other keys are not the run's business, even those it is a prefix of.
    CHECK_FALSE(validator->validate(record_at("run-1_progress_x", std::nullopt, {})));
    CHECK_FALSE(validator->validate(record_at("other", std::nullopt, test::bytes_of("x"))));
    // run ids follow the method-name alphabet, at most 100 characters.
    CHECK(progress::is_valid_run_id(std::string(100, 'a')));
    CHECK_FALSE(progress::is_valid_run_id(std::string(101, 'a')));
    CHECK_FALSE(progress::is_valid_run_id(""));
    CHECK_FALSE(progress::is_valid_run_id("[owner:x]"));
    CHECK_THROWS_AS(progress::make_progress_validator("a b"), std::invalid_argument);
}

TEST_CASE("the samples-per-second EMA is bias-corrected and exact for a constant rate",
          "[progress][estimate]") {
    progress::throughput_ema ema(0.1);
    CHECK(ema.samples_per_second() == 0);
    ema.update(30, 2s); // the first interval alone: 15/s
    CHECK(ema.samples_per_second() == Approx(15).epsilon(1e-12));
    ema.update(10, 1s); // e = 0.1·0.1 + 0.9·(0.1·2/30); rate = (1 − 0.81) / e
    const double e = 0.1 * 0.1 + 0.9 * (0.1 * 2.0 / 30.0);
    CHECK(ema.samples_per_second() == Approx((1 - 0.81) / e).epsilon(1e-12));
    CHECK(ema.updates() == 2);
    ema.update(0, 1s); // says nothing: ignored
    ema.update(5, 0s);
    CHECK(ema.updates() == 2);

    progress::throughput_ema steady(0.25);
    for (int i = 0; i < 50; ++i) {
        steady.update(7, 500ms);
        CHECK(steady.samples_per_second() == Approx(14).epsilon(1e-12));
    }
    progress::throughput_ema latest(1.0);
    latest.update(10, 1s);
    latest.update(3, 1s);
    CHECK(latest.samples_per_second() == Approx(3).epsilon(1e-12));
    CHECK_THROWS_AS(progress::throughput_ema(0), std::invalid_argument);
    CHECK_THROWS_AS(progress::throughput_ema(1.5), std::invalid_argument);
    CHECK_THROWS_AS(progress::throughput_ema(std::numeric_limits<double>::quiet_NaN()),
                    std::invalid_argument);
}

TEST_CASE("the global estimate follows its formulas", "[progress][estimate]") {
    const time_point now = test::at_seconds(1000);
    progress::estimate_options o;
    o.target_batch_size = 1015;
    o.min_refresh = 500ms;
    o.max_refresh = 10s;
    o.expected_drift_peers = 3;
    o.expected_drift_rate = 0.2;
    const std::vector<progress::progress_record> records{
        {5, 100, 10, now - 2s, false}, // at the global epoch: 100 + 10·2
        {5, 200, 20, now - 1s, false}, // 200 + 20·1
        {5, 50, 30, now + 1s, true},   // a client, reported "in the future": 50 + 0
        {4, 400, 40, now - 1s, false}, // behind: its rate counts, its samples do not
        {9, 0, 0, now - 10s, true},    // a client ahead does not set the epoch
    };
    const auto g = progress::estimate_global_progress(records, 3, now, o);
    CHECK(g.epoch == 5);
    CHECK(g.samples_accumulated == 100 + 200 + 50);
    CHECK(g.estimated_samples == 120 + 220 + 50);
    CHECK(g.samples_per_second == 100);
    CHECK(g.num_peers == 5);
    CHECK(g.num_clients == 2);
    CHECK(g.num_ahead == 5); // every record is after local epoch 3, the clients too
    CHECK(g.target_batch_size == 1015);
    CHECK(g.estimated_at == now);
    CHECK(g.eta == now + 6250ms); // (1015 − 390) / 100 s
    // Refresh: 6.25 s · 5 / max(5 + 3, 5 · 1.2) = 3.90625 s.
    CHECK(g.next_fetch == now + 3906250us);
    CHECK_FALSE(g.ready(5, now + 6249ms));
    CHECK(g.ready(5, now + 6250ms));
    CHECK(g.ready(4, now)); // a peer behind the global epoch

    SECTION("our own later epoch is the global epoch") {
        o.target_batch_size = 1000;
        const auto ahead = progress::estimate_global_progress(records, 6, now, o);
        CHECK(ahead.epoch == 6);
        CHECK(ahead.num_ahead == 1); // the client at 9; not the records at 5 and 4
        CHECK(ahead.samples_accumulated == 0);
        CHECK(ahead.eta == now + 10s);           // 1000 / 100
        CHECK(ahead.next_fetch == now + 6250ms); // 10 · 5 / 8
    }
    SECTION("the target reached") {
        o.target_batch_size = 350;
        const auto done = progress::estimate_global_progress(records, 5, now, o);
        CHECK(done.eta == now);
        CHECK(done.next_fetch == now + 500ms);
        CHECK(done.ready(5, now));
        o.target_batch_size = 351; // reached by extrapolation only
        const auto estimated = progress::estimate_global_progress(records, 5, now, o);
        CHECK(estimated.samples_accumulated < 351);
        CHECK(estimated.eta == now);
        CHECK(estimated.ready(5, now));
    }
    SECTION("nobody progressing, or nobody at all") {
        const std::vector<progress::progress_record> idle{{0, 10, 0, now - 10s, false}};
        const auto stuck = progress::estimate_global_progress(idle, 0, now, o);
        CHECK(stuck.eta == time_point::max());
        CHECK(stuck.next_fetch == now + 10s);
        CHECK_FALSE(stuck.ready(0, now + 1000000s));
        const auto empty = progress::estimate_global_progress({}, 2, now, o);
        CHECK(empty.epoch == 2);
        CHECK(empty.num_peers == 0);
        CHECK(empty.eta == time_point::max());
        CHECK(empty.next_fetch == now + 10s);
    }
    SECTION("hostile records saturate instead of wrapping") {
        const auto max = std::numeric_limits<std::uint64_t>::max();
        const double huge = std::numeric_limits<double>::max();
        const std::vector<progress::progress_record> hostile{{1, max, huge, now - 5s, false},
                                                             {1, max, huge, now - 5s, false}};
        const auto g2 = progress::estimate_global_progress(hostile, 0, now, o);
        CHECK(g2.samples_accumulated == max);
        CHECK(std::isfinite(g2.samples_per_second));
        CHECK(std::isfinite(g2.estimated_samples));
        CHECK(g2.eta == now);
    }
    SECTION("a peer that started less than max_refresh ago and has no rate yet") {
        auto with_newcomer = records;
        with_newcomer.push_back({5, 0, 0, now - 9999ms, false});
        const auto fresh = progress::estimate_global_progress(with_newcomer, 5, now, o);
        CHECK(fresh.next_fetch == now + 500ms);
        CHECK(fresh.num_peers == 6);
        CHECK(fresh.eta == g.eta); // it adds nothing to the estimate itself
        with_newcomer.back().report_time = now - 10s;
        const auto older = progress::estimate_global_progress(with_newcomer, 5, now, o);
        CHECK(older.next_fetch == now + 4166666667ns); // 6.25 s · 6 / 9, rounded up
    }
    SECTION("a record one epoch behind counts from when this peer entered the epoch") {
        // The record at epoch 4 (40 samples/s, reported at now − 1 s) is most likely a peer
        // that moved to epoch 5 when this one did, 0.5 s ago: 40 · 0.5 = 20 samples more.
        const auto moved = progress::estimate_global_progress(records, 5, now, o, now - 500ms);
        CHECK(moved.samples_accumulated == 350);
        CHECK(moved.estimated_samples == 390 + 20);
        CHECK(moved.eta == now + 6050ms); // (1015 − 410) / 100 s
        // Reported after this peer entered the epoch: it counts from its report.
        const auto reported = progress::estimate_global_progress(records, 5, now, o, now - 2s);
        CHECK(reported.estimated_samples == 390 + 40);
        // Only for a peer at the global epoch: one behind it, the records at 4 are its own
        // epoch's, and the epoch it entered says nothing about them.
        const auto behind = progress::estimate_global_progress(records, 4, now, o, now - 500ms);
        CHECK(behind.estimated_samples == 390);
        // So once every record accrues, the ETA stays where it is as time passes; counted
        // from each estimate's `now` instead, it would move away by 0.4 s every second.
        const auto at = [&](duration later, time_point started) {
            return progress::estimate_global_progress(records, 5, now + later, o, started);
        };
        const auto one = at(1s, now - 500ms);
        const auto two = at(2s, now - 500ms);
        CHECK(one.eta >= now + 6350ms - 1ns);
        CHECK(one.eta <= now + 6350ms + 1ns);
        CHECK(two.eta >= one.eta - 1ns);
        CHECK(two.eta <= one.eta + 1ns);
        const auto unknown = time_point::max();
        CHECK(at(2s, unknown).eta - at(1s, unknown).eta > 399ms);
    }
    SECTION("a record still one epoch behind in a read after this peer entered the epoch counts "
            "from that read") {
        // Entered 0.5 s ago; a read that began 0.2 s ago still found the peer at epoch 4 (say
        // it was still averaging): 40 · 0.2 = 8 samples, not 40 · 0.5.
        const auto reread =
            progress::estimate_global_progress(records, 5, now, o, now - 500ms, now - 200ms);
        CHECK(reread.estimated_samples == Approx(390 + 8).epsilon(1e-12));
        // A read from before this peer entered the epoch tells nothing new.
        const auto earlier =
            progress::estimate_global_progress(records, 5, now, o, now - 500ms, now - 3s);
        CHECK(earlier.estimated_samples == 390 + 20);
        // So a peer stuck in its round does not end this one's epoch for it: read again and
        // again, its rate adds at most the time since the last read.
        auto others = records;
        others.erase(others.begin() + 3); // the record at epoch 4
        for (const auto later : {1s, 5s, 30s}) {
            const time_point t = now + later;
            const auto stuck =
                progress::estimate_global_progress(records, 5, t, o, now - 500ms, t - 200ms);
            const auto rest = progress::estimate_global_progress(others, 5, t, o, now - 500ms);
            CHECK(stuck.estimated_samples - rest.estimated_samples == Approx(8).epsilon(1e-9));
        }
    }
    SECTION("a record more than one epoch behind, in a read after this peer entered its epoch, "
            "is behind: its rate does not count") {
        // At local epoch 6, entered 1 s ago: the record at 4 is two epochs back.
        const auto read_after =
            progress::estimate_global_progress(records, 6, now, o, now - 1s, now - 500ms);
        CHECK(read_after.num_peers == 5);
        CHECK(read_after.num_behind == 1);
        CHECK(read_after.num_keeping_up() == 4);
        CHECK(read_after.samples_per_second == 60); // 10 + 20 + 30 + 0, not the 40
        // The records at 5 count from the read, 0.5 s: 10 · 0.5 + 20 · 0.5 samples (the
        // client's report is in the future). (1015 − 15) / 60 s, rounded up:
        CHECK(read_after.eta == now + 16666666667ns);
        // A read from before this peer entered the epoch may lag a peer that kept up.
        for (const auto read_at : {now - 2s, time_point::min()}) {
            const auto read_before =
                progress::estimate_global_progress(records, 6, now, o, now - 1s, read_at);
            CHECK(read_before.num_behind == 0);
            CHECK(read_before.num_keeping_up() == 5);
            CHECK(read_before.samples_per_second == 100);
        }
        // One epoch back is not behind: at local epoch 5, the record at 4 counts.
        const auto one_back =
            progress::estimate_global_progress(records, 5, now, o, now - 1s, now - 500ms);
        CHECK(one_back.num_behind == 0);
        CHECK(one_back.samples_per_second == 100);
    }
    SECTION("a slow swarm far from its target refreshes at the maximum period") {
        const std::vector<progress::progress_record> slow{{0, 0, 1, now, false}};
        const auto g3 = progress::estimate_global_progress(slow, 0, now, o);
        CHECK(g3.eta == now + 1015s);
        CHECK(g3.next_fetch == now + 10s);
    }
}
