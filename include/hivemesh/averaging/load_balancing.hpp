// DeDLOC load balancing: how much of the averaged vector each peer of a group reduces.
//
// Pure arithmetic, no I/O. optimize_shares() turns bandwidths into real shares by
// water-filling, apportion() turns shares into element counts (Hagenbach-Bischoff), and
// load_balance() does both, with a uniform fallback when bandwidths are unknown.
#pragma once

#include "hivemesh/core/config.hpp"
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

HIVEMESH_DECL bool valid_weights(std::span<const double> values) noexcept;

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
HIVEMESH_DECL share_plan optimize_shares(std::span<const double> bandwidths, std::error_code& ec);

/// Throwing optimize_shares(): std::system_error with errc::invalid_argument.
HIVEMESH_DECL share_plan optimize_shares(std::span<const double> bandwidths);

/// Splits `total` elements among peers in proportion to `scores` (Hagenbach-Bischoff):
/// first floor(total * s_i / sum s) each (the sum is clamped so it never exceeds `total`),
/// then each remaining element goes to the peer with the largest s_i / (count_i + 1), ties
/// to the lowest index; the comparison is exact (products through fma). Peers with score 0
/// get 0 elements; the counts sum to `total`.
///
/// Errors (invalid_argument, empty result): no scores, a negative or non-finite score, all
/// scores 0, or total > max_apportion_total.
HIVEMESH_DECL std::vector<std::size_t> apportion(std::size_t total, std::span<const double> scores,
                                                 std::error_code& ec);

/// Throwing apportion(): std::system_error with errc::invalid_argument.
HIVEMESH_DECL std::vector<std::size_t> apportion(std::size_t total, std::span<const double> scores);

/// Element counts per peer for a vector of `total` elements, from bandwidths in which
/// std::nullopt means "unknown" and 0 means a client (reduces nothing):
/// - some bandwidth is known and above 0: unknown peers are given the mean of the known
///   bandwidths above 0, then optimize_shares() and apportion();
/// - otherwise: a uniform split among the unknown peers (clients get 0).
///
/// Errors (invalid_argument, empty result): no peers, a negative or non-finite bandwidth,
/// every peer a client, or total > max_apportion_total.
HIVEMESH_DECL std::vector<std::size_t>
load_balance(std::size_t total, std::span<const std::optional<double>> bandwidths,
             std::error_code& ec);

/// load_balance() with every bandwidth known (0 = client).
HIVEMESH_DECL std::vector<std::size_t>
load_balance(std::size_t total, std::span<const double> bandwidths, std::error_code& ec);

/// Throwing load_balance(): std::system_error with errc::invalid_argument.
HIVEMESH_DECL std::vector<std::size_t>
load_balance(std::size_t total, std::span<const std::optional<double>> bandwidths);

/// Throwing load_balance() with every bandwidth known (0 = client).
HIVEMESH_DECL std::vector<std::size_t> load_balance(std::size_t total,
                                                    std::span<const double> bandwidths);

} // namespace hivemesh::averaging

#if !defined(HIVEMESH_SEPARATE_COMPILATION)
#include "hivemesh/averaging/impl/load_balancing.ipp"
#endif
