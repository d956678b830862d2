// The non-template functions of averaging/load_balancing.hpp: water-filling, apportionment
// and the load balance built from them.
#pragma once

#include "hivemesh/averaging/load_balancing.hpp"

namespace hivemesh::averaging {

namespace detail {

HIVEMESH_DECL bool valid_weights(std::span<const double> values) noexcept {
    return !values.empty() && std::all_of(values.begin(), values.end(),
                                          [](double v) { return std::isfinite(v) && v >= 0; });
}

} // namespace detail

HIVEMESH_DECL share_plan optimize_shares(std::span<const double> bandwidths, std::error_code& ec) {
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

HIVEMESH_DECL share_plan optimize_shares(std::span<const double> bandwidths) {
    std::error_code ec;
    auto plan = optimize_shares(bandwidths, ec);
    throw_if_error(ec, "hivemesh::averaging::optimize_shares");
    return plan;
}

HIVEMESH_DECL std::vector<std::size_t> apportion(std::size_t total, std::span<const double> scores,
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

HIVEMESH_DECL std::vector<std::size_t> apportion(std::size_t total,
                                                 std::span<const double> scores) {
    std::error_code ec;
    auto counts = apportion(total, scores, ec);
    throw_if_error(ec, "hivemesh::averaging::apportion");
    return counts;
}

HIVEMESH_DECL std::vector<std::size_t>
load_balance(std::size_t total, std::span<const std::optional<double>> bandwidths,
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

HIVEMESH_DECL std::vector<std::size_t>
load_balance(std::size_t total, std::span<const double> bandwidths, std::error_code& ec) {
    std::vector<std::optional<double>> known(bandwidths.begin(), bandwidths.end());
    return load_balance(total, std::span<const std::optional<double>>(known), ec);
}

HIVEMESH_DECL std::vector<std::size_t>
load_balance(std::size_t total, std::span<const std::optional<double>> bandwidths) {
    std::error_code ec;
    auto counts = load_balance(total, bandwidths, ec);
    throw_if_error(ec, "hivemesh::averaging::load_balance");
    return counts;
}

HIVEMESH_DECL std::vector<std::size_t> load_balance(std::size_t total,
                                                    std::span<const double> bandwidths) {
    std::error_code ec;
    auto counts = load_balance(total, bandwidths, ec);
    throw_if_error(ec, "hivemesh::averaging::load_balance");
    return counts;
}

} // namespace hivemesh::averaging
