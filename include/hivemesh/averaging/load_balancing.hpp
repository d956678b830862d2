// DeDLOC load balancing: how much of the averaged vector each peer of a group reduces.
//
// Pure arithmetic, no I/O. optimize_shares() turns bandwidths into real shares by
// water-filling, apportion() turns shares into element counts (Hagenbach-Bischoff), and
// load_balance() does both, with a uniform fallback when bandwidths are unknown.
#pragma once

#include "hivemesh/core/error.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <optional>
#include <span>
#include <system_error>
#include <vector>

namespace hivemesh::averaging {

/// Shares of the vector per peer and the round time they give.
struct share_plan {
    /// w_i >= 0 with sum 1 (up to rounding); 0 for clients (bandwidth 0).
    std::vector<double> shares;
    /// max over non-clients of (1 + (N-2) w_i) / b_i, in units of vector size / bandwidth.
    double round_time = 0;
};

/// Largest vector size apportion() accepts: beyond 2^53 a double cannot hold every count.
inline constexpr std::size_t max_apportion_total = std::size_t{1} << 53;

namespace detail {

inline bool valid_weights(std::span<const double> values) noexcept {
    return !values.empty() && std::all_of(values.begin(), values.end(),
                                          [](double v) { return std::isfinite(v) && v >= 0; });
}

/// e with 2^(e-1) <= largest < 2^e (largest > 0): scaling by 2^-e is exact and keeps sums
/// of up to 2^52 values finite.
inline int binary_exponent(double largest) noexcept {
    int exponent = 0;
    (void)std::frexp(largest, &exponent);
    return exponent;
}

/// Sign of a * b - c * d for finite non-negative doubles, exact unless a product falls
/// below the normal range: each product is held exactly as hi + lo through fma.
inline int compare_products(double a, double b, double c, double d) noexcept {
    const double hi1 = a * b;
    const double hi2 = c * d;
    if (hi1 != hi2) return hi1 < hi2 ? -1 : 1;
    const double lo1 = std::fma(a, b, -hi1);
    const double lo2 = std::fma(c, d, -hi2);
    if (lo1 != lo2) return lo1 < lo2 ? -1 : 1;
    return 0;
}

} // namespace detail

/// Chooses each peer's share w_i of the vector to minimise the round time
/// T = max over peers with b_i > 0 of (1 + (N-2) w_i) / b_i, subject to sum w = 1 and
/// w >= 0, where N = bandwidths.size() counts clients (b_i = 0, share 0) too.
///
/// Closed form (water-filling): w_i(L) = max(0, L b_i - 1) / (N-2); the level L is the
/// smallest with sum w_i(L) = 1, i.e. L = (N-2+m) / (sum of the m largest bandwidths) for
/// the first m (fastest peers first) at which the next bandwidth b_(m+1) satisfies
/// L b_(m+1) <= 1. round_time = max(L, max over non-clients of 1/b_i). When every active
/// peer has the same bandwidth the shares are exactly 1/m. N = 1: share 1, round_time 0
/// (nothing to exchange). N = 2: shares proportional to bandwidth, round_time max 1/b_i.
///
/// Errors (invalid_argument, empty result): no peers, a negative or non-finite bandwidth,
/// or no bandwidth above 0.
inline share_plan optimize_shares(std::span<const double> bandwidths, std::error_code& ec) {
    ec.clear();
    if (!detail::valid_weights(bandwidths)) {
        ec = errc::invalid_argument;
        return {};
    }
    const double largest = *std::max_element(bandwidths.begin(), bandwidths.end());
    if (!(largest > 0)) {
        ec = errc::invalid_argument;
        return {};
    }
    const std::size_t n = bandwidths.size();
    share_plan plan;
    plan.shares.assign(n, 0.0);
    double slowest = 0; // max over non-clients of 1 / b_i
    for (const double b : bandwidths)
        if (b > 0) slowest = std::max(slowest, 1.0 / b);

    if (n == 1) {
        plan.shares[0] = 1.0;
        return plan;
    }
    // Work on bandwidths scaled by a power of two (exact) so that sums cannot overflow.
    const int exponent = detail::binary_exponent(largest);
    if (n == 2) {
        const double first = std::ldexp(bandwidths[0], -exponent);
        const double second = std::ldexp(bandwidths[1], -exponent);
        plan.shares[0] = first / (first + second);
        plan.shares[1] = second / (first + second);
        plan.round_time = slowest;
        return plan;
    }

    std::vector<std::size_t> order;
    for (std::size_t i = 0; i < n; ++i)
        if (bandwidths[i] > 0) order.push_back(i);
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t x, std::size_t y) { return bandwidths[x] > bandwidths[y]; });
    const auto scaled = [&](std::size_t rank) {
        return std::ldexp(bandwidths[order[rank]], -exponent);
    };

    const double others = static_cast<double>(n - 2);
    double sum = 0;
    double level = 0; // scaled water level
    std::size_t active = 0;
    for (std::size_t m = 1; m <= order.size(); ++m) {
        sum += scaled(m - 1);
        level = (others + static_cast<double>(m)) / sum;
        active = m;
        // (N-2+m) b_(m+1) <= sum of the first m is monotone in m: the first m that meets it
        // is the only consistent active set.
        if (m == order.size() || (others + static_cast<double>(m)) * scaled(m) <= sum) break;
    }

    if (scaled(0) == scaled(active - 1)) {
        for (std::size_t r = 0; r < active; ++r)
            plan.shares[order[r]] = 1.0 / static_cast<double>(active);
    } else {
        double raw_total = 0;
        for (std::size_t r = 0; r < active; ++r) {
            const double raw = std::max(0.0, level * scaled(r) - 1.0);
            plan.shares[order[r]] = raw;
            raw_total += raw;
        }
        // raw_total > 0 because the fastest active peer is strictly above the level; the
        // guard only matters for bandwidths so far apart that the arithmetic underflows.
        for (std::size_t r = 0; r < active; ++r)
            plan.shares[order[r]] =
                raw_total > 0 ? plan.shares[order[r]] / raw_total : (r == 0 ? 1.0 : 0.0);
    }
    plan.round_time = std::max(std::ldexp(level, -exponent), slowest);
    return plan;
}

/// Throwing optimize_shares(): std::system_error with errc::invalid_argument.
inline share_plan optimize_shares(std::span<const double> bandwidths) {
    std::error_code ec;
    auto plan = optimize_shares(bandwidths, ec);
    throw_if_error(ec, "hivemesh::averaging::optimize_shares");
    return plan;
}

/// Splits `total` elements among peers in proportion to `scores` (Hagenbach-Bischoff):
/// first floor(total * s_i / sum s) each (the sum is clamped so it never exceeds `total`),
/// then each remaining element goes to the peer with the largest s_i / (count_i + 1), ties
/// to the lowest index; the comparison is exact (products through fma). Peers with score 0
/// get 0 elements; the counts sum to `total`.
///
/// Errors (invalid_argument, empty result): no scores, a negative or non-finite score, all
/// scores 0, or total > max_apportion_total.
inline std::vector<std::size_t> apportion(std::size_t total, std::span<const double> scores,
                                          std::error_code& ec) {
    ec.clear();
    if (!detail::valid_weights(scores) || total > max_apportion_total) {
        ec = errc::invalid_argument;
        return {};
    }
    const double largest = *std::max_element(scores.begin(), scores.end());
    if (!(largest > 0)) {
        ec = errc::invalid_argument;
        return {};
    }
    // Scale by a power of two (exact) so that the sum stays finite and products stay normal.
    const int exponent = detail::binary_exponent(largest);
    std::vector<double> s(scores.size());
    for (std::size_t i = 0; i < s.size(); ++i)
        s[i] = std::ldexp(scores[i], -exponent);
    const double sum = std::accumulate(s.begin(), s.end(), 0.0);

    std::vector<std::size_t> counts(s.size(), 0);
    std::size_t given = 0;
    for (std::size_t i = 0; i < s.size(); ++i) {
        const double fraction = s[i] / sum; // <= 1 because s[i] <= sum
        const auto quota =
            static_cast<std::size_t>(std::floor(static_cast<double>(total) * fraction));
        counts[i] = std::min(quota, total - given); // rounding must not overshoot total
        given += counts[i];
    }
    // Mathematically fewer than scores.size() elements remain; rounding adds at most a few.
    for (; given < total; ++given) {
        std::size_t best = 0;
        for (std::size_t i = 1; i < s.size(); ++i) {
            // s_i / (c_i + 1) > s_best / (c_best + 1)  <=>  s_i (c_best + 1) > s_best (c_i + 1)
            if (detail::compare_products(s[i], static_cast<double>(counts[best] + 1), s[best],
                                         static_cast<double>(counts[i] + 1)) > 0)
                best = i;
        }
        ++counts[best];
    }
    return counts;
}

/// Throwing apportion(): std::system_error with errc::invalid_argument.
inline std::vector<std::size_t> apportion(std::size_t total, std::span<const double> scores) {
    std::error_code ec;
    auto counts = apportion(total, scores, ec);
    throw_if_error(ec, "hivemesh::averaging::apportion");
    return counts;
}

/// Element counts per peer for a vector of `total` elements, from bandwidths in which
/// std::nullopt means "unknown" and 0 means a client (reduces nothing):
/// - some bandwidth is known and above 0: unknown peers are given the mean of the known
///   bandwidths above 0, then optimize_shares() and apportion();
/// - otherwise: a uniform split among the unknown peers (clients get 0).
///
/// Errors (invalid_argument, empty result): no peers, a negative or non-finite bandwidth,
/// every peer a client, or total > max_apportion_total.
inline std::vector<std::size_t> load_balance(std::size_t total,
                                             std::span<const std::optional<double>> bandwidths,
                                             std::error_code& ec) {
    ec.clear();
    double known_mean = 0; // running mean: a plain sum of finite doubles could overflow
    std::size_t known_count = 0;
    for (const auto& b : bandwidths) {
        if (!b) continue;
        if (!std::isfinite(*b) || *b < 0) {
            ec = errc::invalid_argument;
            return {};
        }
        if (*b > 0) {
            ++known_count;
            known_mean += (*b - known_mean) / static_cast<double>(known_count);
        }
    }
    std::vector<double> scores(bandwidths.size());
    if (known_count > 0) {
        for (std::size_t i = 0; i < bandwidths.size(); ++i)
            scores[i] = bandwidths[i] ? *bandwidths[i] : known_mean;
        const share_plan plan = optimize_shares(scores, ec);
        if (ec) return {};
        return apportion(total, plan.shares, ec);
    }
    for (std::size_t i = 0; i < bandwidths.size(); ++i)
        scores[i] = bandwidths[i] ? 0.0 : 1.0;
    return apportion(total, scores, ec);
}

/// load_balance() with every bandwidth known (0 = client).
inline std::vector<std::size_t> load_balance(std::size_t total, std::span<const double> bandwidths,
                                             std::error_code& ec) {
    std::vector<std::optional<double>> known(bandwidths.begin(), bandwidths.end());
    return load_balance(total, std::span<const std::optional<double>>(known), ec);
}

/// Throwing load_balance(): std::system_error with errc::invalid_argument.
inline std::vector<std::size_t> load_balance(std::size_t total,
                                             std::span<const std::optional<double>> bandwidths) {
    std::error_code ec;
    auto counts = load_balance(total, bandwidths, ec);
    throw_if_error(ec, "hivemesh::averaging::load_balance");
    return counts;
}

/// Throwing load_balance() with every bandwidth known (0 = client).
inline std::vector<std::size_t> load_balance(std::size_t total,
                                             std::span<const double> bandwidths) {
    std::error_code ec;
    auto counts = load_balance(total, bandwidths, ec);
    throw_if_error(ec, "hivemesh::averaging::load_balance");
    return counts;
}

} // namespace hivemesh::averaging
