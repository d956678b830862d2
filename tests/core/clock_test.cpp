#include <hivemesh/core/clock.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <thread>
#include <type_traits>

using namespace std::chrono_literals;
using hivemesh::duration;
using hivemesh::simulated_clock;
using hivemesh::time_point;
using hivemesh::wall_clock;

static_assert(hivemesh::clock_like<wall_clock>);
static_assert(hivemesh::clock_like<simulated_clock>);
static_assert(!hivemesh::clock_like<std::chrono::steady_clock>); // wrong epoch type
static_assert(!hivemesh::clock_like<int>);
static_assert(std::is_same_v<duration, std::chrono::nanoseconds>);
static_assert(std::is_same_v<time_point::clock, std::chrono::system_clock>);

TEST_CASE("wall_clock reads the system clock", "[core][clock]") {
    const wall_clock clock;
    const auto before = std::chrono::system_clock::now();
    const time_point t = clock.now();
    const auto after = std::chrono::system_clock::now();
    // Not a timing assertion: the reading lies between two system_clock readings, with
    // slack for a clock that steps between them.
    CHECK(t >= before - 1s);
    CHECK(t <= after + 1s);
    // Absolute time since the Unix epoch, not time since boot: later than 2020-01-01.
    CHECK(hivemesh::to_seconds(t) > 1577836800.0);
}

TEST_CASE("simulated_clock starts where told and moves only forward", "[core][clock]") {
    simulated_clock zero;
    CHECK(zero.now() == time_point{});

    simulated_clock clock(time_point{100s});
    CHECK(clock.now() == time_point{100s});
    CHECK(clock.now() == time_point{100s}); // reading does not move it

    clock.advance(1500ms);
    CHECK(clock.now() == time_point{101500ms});
    clock.advance(1ns);
    CHECK(clock.now().time_since_epoch().count() == 101'500'000'001);
    clock.advance(0ns);
    CHECK(clock.now().time_since_epoch().count() == 101'500'000'001);
    clock.advance(-5s); // ignored: time never runs back
    CHECK(clock.now().time_since_epoch().count() == 101'500'000'001);

    clock.advance_to(time_point{200s});
    CHECK(clock.now() == time_point{200s});
    clock.advance_to(time_point{150s}); // earlier: ignored
    CHECK(clock.now() == time_point{200s});
    clock.advance_to(time_point{200s}); // same: no change
    CHECK(clock.now() == time_point{200s});
    clock.advance_to(time_point{});
    CHECK(clock.now() == time_point{200s});

    // Times before the epoch are representable too.
    simulated_clock early(time_point{-10s});
    early.advance(3s);
    CHECK(early.now() == time_point{-7s});
}

TEST_CASE("simulated_clock is thread-safe", "[core][clock]") {
    constexpr int steps = 100000;

    SECTION("concurrent advance() loses no step") {
        simulated_clock clock(time_point{5ns});
        auto work = [&] {
            for (int i = 0; i < steps; ++i)
                clock.advance(3ns);
        };
        std::thread a(work);
        std::thread b(work);
        a.join();
        b.join();
        CHECK(clock.now().time_since_epoch().count() == 5 + 2 * 3 * steps);
    }
    SECTION("concurrent advance_to() ends at the latest target and never goes back") {
        simulated_clock clock;
        bool went_back = false; // written only by thread a
        std::thread a([&] {
            time_point last = clock.now();
            for (int i = 1; i <= steps; ++i) {
                clock.advance_to(time_point{duration{2 * i}});
                const time_point now = clock.now();
                if (now < last || now < time_point{duration{2 * i}}) went_back = true;
                last = now;
            }
        });
        std::thread b([&] {
            for (int i = 1; i <= steps; ++i)
                clock.advance_to(time_point{duration{2 * i + 1}});
        });
        a.join();
        b.join();
        CHECK_FALSE(went_back);
        CHECK(clock.now().time_since_epoch().count() == 2 * steps + 1);
    }
}

TEST_CASE("to_seconds converts to seconds since the epoch", "[core][clock]") {
    CHECK(hivemesh::to_seconds(time_point{}) == 0.0);
    CHECK(hivemesh::to_seconds(time_point{1500ms}) == 1.5);
    CHECK(hivemesh::to_seconds(time_point{-2500ms}) == -2.5);
    CHECK(hivemesh::to_seconds(time_point{1ns}) == Approx(1e-9).epsilon(1e-12));
    CHECK(hivemesh::to_seconds(time_point{1'700'000'000s + 250ms}) ==
          Approx(1'700'000'000.25).epsilon(1e-15));
    const simulated_clock clock(time_point{42s});
    CHECK(hivemesh::to_seconds(clock.now()) == 42.0);
}
