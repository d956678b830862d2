#include <hivemesh/averaging/load_balancing.hpp>
#include <hivemesh/core/random.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <limits>
#include <numeric>
#include <optional>
#include <system_error>
#include <vector>

using hivemesh::errc;
using hivemesh::random_generator;
using namespace hivemesh::averaging;

namespace {

constexpr double tolerance = 1e-12;

using counts = std::vector<std::size_t>;

// The round time of `shares` by the cost model itself, independent of the solver.
double round_time_of(const std::vector<double>& bandwidths, const std::vector<double>& shares) {
    const double others = static_cast<double>(bandwidths.size()) - 2;
    double worst = 0;
    for (std::size_t i = 0; i < bandwidths.size(); ++i)
        if (bandwidths[i] > 0) worst = std::max(worst, (1 + others * shares[i]) / bandwidths[i]);
    return worst;
}

std::size_t sum(const counts& c) {
    return std::accumulate(c.begin(), c.end(), std::size_t{0});
}

} // namespace

TEST_CASE("optimal shares: the exact oracles", "[averaging][load_balancing]") {
    struct oracle {
        std::vector<double> bandwidths;
        std::vector<double> shares;
        double round_time;
    };
    const std::vector<oracle> oracles = {
        {{1, 1, 1, 1}, {0.25, 0.25, 0.25, 0.25}, 1.5},
        {{1, 1, 1, 0}, {1.0 / 3, 1.0 / 3, 1.0 / 3, 0}, 5.0 / 3},
        {{2, 1, 1, 1}, {0.7, 0.1, 0.1, 0.1}, 1.2},
        {{10, 1, 1, 1}, {1, 0, 0, 0}, 1.0},
        // The order of the peers does not matter.
        // N = 5 with a client: (N-2) = 3, level (3 + 4) / 5 = 1.4, w = (1.4 b - 1) / 3.
        {{1, 0, 2, 1, 1}, {0.4 / 3, 0, 0.6, 0.4 / 3, 0.4 / 3}, 1.4},
        {{1, 1, 10, 1}, {0, 0, 1, 0}, 1.0},
    };
    for (const auto& o : oracles) {
        INFO("bandwidths " << Catch::Detail::stringify(o.bandwidths));
        std::error_code ec;
        const share_plan plan = optimize_shares(o.bandwidths, ec);
        REQUIRE_FALSE(ec);
        REQUIRE(plan.shares.size() == o.shares.size());
        for (std::size_t i = 0; i < o.shares.size(); ++i)
            CHECK(std::abs(plan.shares[i] - o.shares[i]) <= tolerance);
        CHECK(std::abs(plan.round_time - o.round_time) <= tolerance);
        // The reported time is what the cost model gives for these shares.
        CHECK(std::abs(round_time_of(o.bandwidths, plan.shares) - plan.round_time) <= tolerance);
    }
}

TEST_CASE("equal bandwidths give exactly 1/N: the butterfly", "[averaging][load_balancing]") {
    for (const double b : {1.0, 0.1, 3.7, 1e-300, 1e300, 123456.789}) {
        for (std::size_t n = 3; n <= 17; ++n) {
            INFO("bandwidth " << b << ", " << n << " peers");
            const std::vector<double> bandwidths(n, b);
            const share_plan plan = optimize_shares(bandwidths);
            for (const double w : plan.shares)
                REQUIRE(w == 1.0 / static_cast<double>(n));
            // T = (2N - 2) / (N b).
            const double expected = (2.0 * static_cast<double>(n) - 2) / static_cast<double>(n) / b;
            CHECK(std::abs(plan.round_time - expected) <= tolerance * expected);
        }
    }
}

TEST_CASE("one very fast peer becomes a parameter server", "[averaging][load_balancing]") {
    // The fast peer takes everything once (N-2+1) b_slow <= b_fast, i.e. b_fast >= 9 for N = 10.
    std::vector<double> bandwidths(10, 1.0);
    bandwidths[6] = 9.0;
    share_plan plan = optimize_shares(bandwidths);
    for (std::size_t i = 0; i < bandwidths.size(); ++i)
        CHECK(plan.shares[i] == (i == 6 ? 1.0 : 0.0));
    CHECK(plan.round_time == 1.0);

    // Just below the threshold every peer reduces something.
    bandwidths[6] = 8.5;
    plan = optimize_shares(bandwidths);
    for (std::size_t i = 0; i < bandwidths.size(); ++i)
        CHECK(plan.shares[i] > 0);
    // L = (8 + 10) / 17.5; the fast peer's share is (8.5 L - 1) / 8.
    const double level = 18.0 / 17.5;
    CHECK(std::abs(plan.shares[6] - (8.5 * level - 1) / 8) <= tolerance);
    CHECK(std::abs(plan.round_time - level) <= tolerance);
}

TEST_CASE("one and two peers", "[averaging][load_balancing]") {
    share_plan plan = optimize_shares(std::vector<double>{3.0});
    CHECK(plan.shares == std::vector<double>{1.0});
    CHECK(plan.round_time == 0.0);

    // N = 2: (1 + 0 w) / b, any split is optimal; the shares follow bandwidth.
    plan = optimize_shares(std::vector<double>{3.0, 1.0});
    CHECK(plan.shares == std::vector<double>{0.75, 0.25});
    CHECK(plan.round_time == 1.0);
    plan = optimize_shares(std::vector<double>{0.0, 4.0});
    CHECK(plan.shares == std::vector<double>{0.0, 1.0});
    CHECK(plan.round_time == 0.25);
}

TEST_CASE("shares are optimal against random alternatives", "[averaging][load_balancing]") {
    random_generator rng(2024);
    for (int trial = 0; trial < 300; ++trial) {
        const std::size_t n = 3 + static_cast<std::size_t>(rng.uniform(10));
        std::vector<double> bandwidths(n);
        for (auto& b : bandwidths)
            b = rng.uniform(4) == 0 ? 0.0 : 0.1 + 10 * rng.uniform_real();
        if (std::all_of(bandwidths.begin(), bandwidths.end(), [](double b) { return b == 0; }))
            bandwidths[0] = 1.0;
        INFO("trial " << trial << ", bandwidths " << Catch::Detail::stringify(bandwidths));
        const share_plan plan = optimize_shares(bandwidths);
        double total = 0;
        for (std::size_t i = 0; i < n; ++i) {
            REQUIRE(plan.shares[i] >= 0);
            if (bandwidths[i] == 0) REQUIRE(plan.shares[i] == 0);
            total += plan.shares[i];
        }
        REQUIRE(std::abs(total - 1) <= tolerance);
        REQUIRE(std::abs(round_time_of(bandwidths, plan.shares) - plan.round_time) <=
                tolerance * plan.round_time);
        // No random feasible point does better.
        for (int k = 0; k < 50; ++k) {
            std::vector<double> other(n, 0.0);
            double other_total = 0;
            for (std::size_t i = 0; i < n; ++i)
                if (bandwidths[i] > 0) other_total += other[i] = rng.uniform_real();
            if (other_total == 0) continue;
            for (auto& w : other)
                w /= other_total;
            REQUIRE(round_time_of(bandwidths, other) >= plan.round_time * (1 - 1e-12));
        }
    }
}

TEST_CASE("apportionment: the exact oracles", "[averaging][load_balancing]") {
    CHECK(apportion(10, std::vector<double>{0.7, 0.1, 0.1, 0.1}) == counts{7, 1, 1, 1});
    CHECK(apportion(11, std::vector<double>{1, 1, 1, 1}) == counts{3, 3, 3, 2});
    CHECK(apportion(7, std::vector<double>{0.2, 0.2, 0.2}) == counts{3, 2, 2});
    // Remainders go by s / (count + 1), not by the largest remainder: floors 7/1/1 of 10,
    // one left; 0.7/8 > 0.15/2, so the large peer takes it (largest remainder: 7,2,1).
    CHECK(apportion(10, std::vector<double>{0.7, 0.15, 0.15}) == counts{8, 1, 1});
    CHECK(apportion(5, std::vector<double>{0.5, 0.3, 0.2}) == counts{3, 1, 1});
    // Zero scores get nothing, even when seats remain.
    CHECK(apportion(5, std::vector<double>{0, 1, 0, 1, 0}) == counts{0, 3, 0, 2, 0});
    CHECK(apportion(0, std::vector<double>{1, 2}) == counts{0, 0});
    CHECK(apportion(1, std::vector<double>{1, 1, 1}) == counts{1, 0, 0});
    // Scale does not matter.
    CHECK(apportion(11, std::vector<double>{1e300, 1e300, 1e300, 1e300}) == counts{3, 3, 3, 2});
    CHECK(apportion(11, std::vector<double>{1e-300, 1e-300, 1e-300, 1e-300}) == counts{3, 3, 3, 2});
}

TEST_CASE("apportionment sums to the total for random inputs", "[averaging][load_balancing]") {
    random_generator rng(7);
    for (int trial = 0; trial < 5000; ++trial) {
        const std::size_t n = 1 + static_cast<std::size_t>(rng.uniform(16));
        std::vector<double> scores(n);
        for (auto& s : scores) {
            switch (rng.uniform(4)) {
            case 0:
                s = 0;
                break;
            case 1:
                s = rng.uniform_real();
                break;
            case 2:
                s = std::ldexp(rng.uniform_real(), static_cast<int>(rng.uniform(200)) - 100);
                break;
            default:
                s = static_cast<double>(rng.uniform(5));
                break;
            }
        }
        scores[rng.uniform(n)] = 0.5 + rng.uniform_real(); // at least one positive
        const std::size_t total =
            trial % 3 == 0   ? static_cast<std::size_t>(rng.uniform(20))
            : trial % 3 == 1 ? static_cast<std::size_t>(rng.uniform(1'000'000'000))
                             : max_apportion_total - static_cast<std::size_t>(rng.uniform(1000));
        INFO("trial " << trial << ", total " << total << ", scores "
                      << Catch::Detail::stringify(scores));
        std::error_code ec;
        const counts c = apportion(total, scores, ec);
        REQUIRE_FALSE(ec);
        REQUIRE(c.size() == n);
        REQUIRE(sum(c) == total);
        double score_sum = 0;
        for (const double s : scores)
            score_sum += s;
        for (std::size_t i = 0; i < n; ++i) {
            if (scores[i] == 0) REQUIRE(c[i] == 0);
            // Lower quota holds; the remainder adds fewer than n elements (plus float slack).
            const double quota = static_cast<double>(total) * (scores[i] / score_sum);
            REQUIRE(static_cast<double>(c[i]) >= std::floor(quota) - 1 - quota * 1e-12);
            REQUIRE(static_cast<double>(c[i]) <= quota + static_cast<double>(n) + quota * 1e-12);
        }
    }
}

TEST_CASE("bad input is refused with invalid_argument", "[averaging][load_balancing]") {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    const double inf = std::numeric_limits<double>::infinity();
    const std::vector<std::vector<double>> bad = {
        {}, {0}, {0, 0, 0}, {1, -1, 1}, {1, nan}, {inf, 1, 1}, {-0.5},
    };
    for (const auto& values : bad) {
        INFO("values " << Catch::Detail::stringify(values));
        std::error_code ec;
        CHECK(optimize_shares(values, ec).shares.empty());
        CHECK(ec == errc::invalid_argument);
        CHECK(apportion(10, values, ec).empty());
        CHECK(ec == errc::invalid_argument);
        CHECK(load_balance(10, values, ec).empty());
        CHECK(ec == errc::invalid_argument);
        CHECK_THROWS_AS(optimize_shares(values), std::system_error);
        CHECK_THROWS_AS(apportion(10, values), std::system_error);
        CHECK_THROWS_AS(load_balance(10, values), std::system_error);
    }
    std::error_code ec;
    CHECK(apportion(max_apportion_total + 1, std::vector<double>{1}, ec).empty());
    CHECK(ec == errc::invalid_argument);
    try {
        (void)apportion(3, std::vector<double>{});
        FAIL("no exception");
    } catch (const std::system_error& e) {
        CHECK(e.code() == errc::invalid_argument);
    }
    // Success clears a stale error.
    ec = errc::timeout;
    CHECK(apportion(3, std::vector<double>{1}, ec) == counts{3});
    CHECK_FALSE(ec);
}

TEST_CASE("load_balance: bandwidths straight to element counts", "[averaging][load_balancing]") {
    CHECK(load_balance(10, std::vector<double>{2, 1, 1, 1}) == counts{7, 1, 1, 1});
    CHECK(load_balance(1000, std::vector<double>{10, 1, 1, 1}) == counts{1000, 0, 0, 0});
    CHECK(load_balance(11, std::vector<double>{5, 5, 5, 5}) == counts{3, 3, 3, 2});
    CHECK(load_balance(10, std::vector<double>{1, 1, 1, 0}) == counts{4, 3, 3, 0});
    // Totals that do not divide evenly still sum up.
    CHECK(sum(load_balance(1'000'003, std::vector<double>{3, 1.5, 0, 2.25, 1})) == 1'000'003);
}

TEST_CASE("load_balance with unknown bandwidths", "[averaging][load_balancing]") {
    using opt = std::optional<double>;
    const opt unknown = std::nullopt;
    // Nothing known: uniform.
    CHECK(load_balance(10, std::vector<opt>{unknown, unknown, unknown}) == counts{4, 3, 3});
    // Every non-client unknown: uniform among them, clients get nothing.
    CHECK(load_balance(10, std::vector<opt>{0.0, unknown, unknown, 0.0}) == counts{0, 5, 5, 0});
    // Unknown peers get the mean of the known bandwidths above 0: known {3, 1} (mean 2)
    // plus one unknown is as if {3, 1, 2}.
    CHECK(load_balance(1000, std::vector<opt>{3.0, 1.0, unknown}) ==
          load_balance(1000, std::vector<double>{3, 1, 2}));
    CHECK(load_balance(1000, std::vector<opt>{3.0, 0.0, 1.0, unknown}) ==
          load_balance(1000, std::vector<double>{3, 0, 1, 2}));
    // And the known peers still decide: [2, unknown, 1, 1] is [2, 4/3, 1, 1], not uniform.
    const counts mixed = load_balance(600, std::vector<opt>{2.0, unknown, 1.0, 1.0});
    CHECK(mixed == load_balance(600, std::vector<double>{2, 4.0 / 3, 1, 1}));
    CHECK(mixed[0] > mixed[1]);
    CHECK(mixed[1] > mixed[2]);

    std::error_code ec;
    CHECK(load_balance(10, std::vector<opt>{0.0, 0.0}, ec).empty());
    CHECK(ec == errc::invalid_argument);
    CHECK(load_balance(10, std::vector<opt>{}, ec).empty());
    CHECK(ec == errc::invalid_argument);
    CHECK(load_balance(10, std::vector<opt>{unknown, -1.0}, ec).empty());
    CHECK(ec == errc::invalid_argument);
    CHECK_THROWS_AS(load_balance(10, std::vector<opt>{unknown, std::nan("")}), std::system_error);
}
