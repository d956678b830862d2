// Estimating a run's global progress from the peers' records (pure, no I/O): the global epoch,
// the samples accumulated toward the target, the ETA of reaching it, and when to look again.
// Also the samples-per-second EMA each peer publishes.
#pragma once

#include "hivemesh/core/clock.hpp"
#include "hivemesh/progress/record.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <stdexcept>

namespace hivemesh::progress {

using namespace std::chrono_literals;

/// A peer's throughput as a bias-corrected exponential moving average of seconds per sample:
/// after interval t_k with n_k samples, e_k = alpha·(t_k/n_k) + (1 − alpha)·e_{k−1} (e_0 = 0),
/// and samples_per_second() = (1 − (1 − alpha)^k) / e_k. The correction makes the first
/// estimates unbiased (the first interval alone gives n_1/t_1), and a constant rate gives that
/// rate from the first update on.
class throughput_ema {
public:
    /// Throws std::invalid_argument unless 0 < alpha <= 1.
    explicit throughput_ema(double alpha = 0.1)
        : alpha_(alpha) {
        if (!(alpha > 0 && alpha <= 1))
            throw std::invalid_argument("hivemesh::progress::throughput_ema: alpha must be in "
                                        "(0, 1]");
    }

    /// Counts `samples` processed over `interval`. Ignored unless both are positive (time that
    /// did not pass says nothing about speed).
    void update(std::uint64_t samples, duration interval) noexcept {
        if (samples == 0 || interval <= duration::zero()) return;
        const double seconds = std::chrono::duration<double>(interval).count();
        seconds_per_sample_ =
            alpha_ * (seconds / static_cast<double>(samples)) + (1 - alpha_) * seconds_per_sample_;
        decay_ *= 1 - alpha_;
        ++updates_;
        const double corrected = seconds_per_sample_ / (1 - decay_);
        const double rate = 1 / corrected;
        if (corrected > 0 && std::isfinite(rate)) rate_ = rate;
    }

    /// Samples per second; 0 before the first update. Always finite and >= 0.
    double samples_per_second() const noexcept { return rate_; }
    std::uint64_t updates() const noexcept { return updates_; }
    double alpha() const noexcept { return alpha_; }

private:
    double alpha_;
    double seconds_per_sample_ = 0;
    double decay_ = 1; // (1 - alpha)^updates
    double rate_ = 0;
    std::uint64_t updates_ = 0;
};

/// What the estimate needs besides the records.
struct estimate_options {
    /// Samples that end an epoch (> 0).
    std::uint64_t target_batch_size = 1;
    /// Bounds of the time until the next look at the DHT.
    duration min_refresh = 500ms;
    duration max_refresh = 10s;
    /// Peers (absolute, and as a fraction of those seen) assumed able to join before the
    /// epoch ends: the refresh comes early enough to see them (see estimate_global_progress).
    double expected_drift_peers = 3;
    double expected_drift_rate = 0.2;
};

/// The swarm's progress as one peer estimates it.
struct global_training_progress {
    /// The global epoch: the latest epoch of a non-client peer, or ours if later.
    std::uint64_t epoch = 0;
    /// Samples the peers at `epoch` reported (their records summed, not extrapolated).
    std::uint64_t samples_accumulated = 0;
    /// The same, each record extrapolated to `estimated_at` with its samples per second.
    double estimated_samples = 0;
    std::uint64_t target_batch_size = 0;
    /// When the extrapolated samples reach target_batch_size; time_point::max() if never
    /// (nobody makes progress); `estimated_at` if already reached.
    time_point eta = time_point::max();
    /// The samples per second of the counted peers but those behind (num_behind).
    double samples_per_second = 0;
    /// Peers with a live record (this one included when it reports samples), and how many of
    /// them are clients.
    std::size_t num_peers = 0;
    std::size_t num_clients = 0;
    /// Of num_peers, those whose record is at an epoch after the local one.
    std::size_t num_ahead = 0;
    /// Of num_peers, those whose record a read made after this peer entered its epoch still
    /// found more than one epoch behind it: such a peer loads the state before it takes part
    /// again, or it is gone and its record has not expired yet (a crashed peer's lasts
    /// record_expiration).
    std::size_t num_behind = 0;
    /// When this estimate was made, and when the tracker reads the DHT next.
    time_point estimated_at{};
    time_point next_fetch{};
    /// Grows by one with every new estimate (see tracker::async_wait_for_update).
    std::uint64_t version = 0;

    /// The peers that may take part in a round of this peer's epoch, this one included.
    std::size_t num_keeping_up() const noexcept { return num_peers - num_behind; }

    /// True when a peer at `local_epoch` may end its epoch at `now`: another peer is already
    /// at a later epoch, the reported samples reach the target, or the ETA has passed.
    bool ready(std::uint64_t local_epoch, time_point now) const noexcept {
        return epoch > local_epoch || samples_accumulated >= target_batch_size || now >= eta;
    }
};

namespace detail {

/// `now` + `seconds` rounded up to a nanosecond, time_point::max() if that does not fit.
inline time_point after_seconds(time_point now, double seconds) noexcept {
    if (!(seconds > 0)) return now;
    const double room = static_cast<double>((time_point::max() - now).count());
    const double ns = std::ceil(seconds * 1e9);
    if (!(ns < room)) return time_point::max();
    return now + duration{static_cast<duration::rep>(ns)};
}

inline std::uint64_t saturating_add(std::uint64_t a, std::uint64_t b) noexcept {
    return b > std::numeric_limits<std::uint64_t>::max() - a
               ? std::numeric_limits<std::uint64_t>::max()
               : a + b;
}

inline double finite_or_max(double x) noexcept {
    return std::isfinite(x) ? x : std::numeric_limits<double>::max();
}

} // namespace detail

/// Estimates the global progress at `now` from the live `records` (the caller drops
/// tombstones and expired records, and includes its own record if it reports samples) for a
/// peer at `local_epoch`, which it entered at `epoch_started` (time_point::max(): unknown),
/// the others' records read from the DHT by a read that began at `read_at`:
///   - epoch E = max(local_epoch, epoch of every non-client record);
///   - samples_accumulated = Σ samples over the records at E;
///   - estimated_samples = Σ over the records at E of samples + samples/s · max(0, now − report
///     time), plus, when E = local_epoch, Σ over the records at E − 1 of samples/s · max(0,
///     now − max(report time, epoch_started, read_at)): the peers of an epoch end it together,
///     so a record of the epoch before is most likely a peer that moved to E about when this
///     one did and was not read since. (Counting its rate from `now` at every estimate instead
///     would move the ETA away as fast as time passes: a peer that has not yet read the
///     others' new records would end its epoch only when its own samples reach the target.)
///     But a read after this peer entered E that still found the record at E − 1 shows that
///     its peer had not moved then (e.g. it was still averaging): it counts from that read;
///   - behind (num_behind): the records more than one epoch before local_epoch, when the
///     read began after this peer entered its epoch (read_at ≥ epoch_started; before that, a
///     record may lag a peer that kept up): such a peer adds nothing to E before it has
///     loaded the state, and a crashed one never does, while its record lives on until it
///     expires;
///   - samples_per_second R = Σ samples/s over the records not behind;
///   - eta = now + max(0, target − estimated_samples) / R, rounded up to a nanosecond (now if
///     the target is reached; never if R = 0);
///   - next_fetch = now + clamp((eta − now) · n / m, min_refresh, max_refresh) with n records
///     and m = max(n + expected_drift_peers, n · (1 + expected_drift_rate)): more often as the
///     ETA nears, sooner when more peers may join; max_refresh when there is no record or no
///     ETA. But min_refresh while a record less than max_refresh old has no samples/s yet:
///     its peer just started, and its first measurement may move the ETA by any amount (a
///     swarm that starts together would otherwise wait max_refresh before anyone knows a
///     rate).
/// Sums that overflow saturate (a hostile record cannot make them wrap or non-finite).
inline global_training_progress
estimate_global_progress(std::span<const progress_record> records, std::uint64_t local_epoch,
                         time_point now, const estimate_options& options,
                         time_point epoch_started = time_point::max(),
                         time_point read_at = time_point::min()) {
    global_training_progress g;
    g.target_batch_size = options.target_batch_size;
    g.estimated_at = now;
    g.epoch = local_epoch;
    for (const auto& r : records)
        if (!r.client) g.epoch = std::max(g.epoch, r.epoch);
    for (const auto& r : records) {
        ++g.num_peers;
        if (r.client) ++g.num_clients;
        if (r.epoch > local_epoch) ++g.num_ahead;
        if (local_epoch > 1 && r.epoch < local_epoch - 1 && read_at >= epoch_started) {
            ++g.num_behind;
            continue;
        }
        g.samples_per_second = detail::finite_or_max(g.samples_per_second + r.samples_per_second);
        if (r.epoch != g.epoch) {
            const bool one_behind =
                g.epoch == local_epoch && g.epoch != 0 && r.epoch == g.epoch - 1;
            if (!one_behind || epoch_started == time_point::max()) continue;
            const time_point since = std::max({r.report_time, epoch_started, read_at});
            const double moved = std::max(0.0, std::chrono::duration<double>(now - since).count());
            g.estimated_samples = detail::finite_or_max(
                g.estimated_samples + detail::finite_or_max(r.samples_per_second * moved));
            continue;
        }
        g.samples_accumulated =
            detail::saturating_add(g.samples_accumulated, r.samples_accumulated);
        const double elapsed =
            std::max(0.0, std::chrono::duration<double>(now - r.report_time).count());
        g.estimated_samples =
            detail::finite_or_max(g.estimated_samples + static_cast<double>(r.samples_accumulated) +
                                  detail::finite_or_max(r.samples_per_second * elapsed));
    }
    const double remaining = static_cast<double>(options.target_batch_size) - g.estimated_samples;
    if (remaining <= 0)
        g.eta = now;
    else if (g.samples_per_second > 0)
        g.eta = detail::after_seconds(now, remaining / g.samples_per_second);
    else
        g.eta = time_point::max();

    const bool unmeasured = std::any_of(records.begin(), records.end(), [&](const auto& r) {
        return r.samples_per_second == 0 && now - r.report_time < options.max_refresh;
    });
    duration period = options.max_refresh;
    if (unmeasured) {
        period = options.min_refresh;
    } else if (g.num_peers > 0 && g.eta != time_point::max()) {
        const double n = static_cast<double>(g.num_peers);
        const double expected =
            std::max(n + options.expected_drift_peers, n * (1 + options.expected_drift_rate));
        const double seconds = std::chrono::duration<double>(g.eta - now).count() * n / expected;
        const double min_s = std::chrono::duration<double>(options.min_refresh).count();
        const double max_s = std::chrono::duration<double>(options.max_refresh).count();
        if (seconds <= min_s)
            period = options.min_refresh;
        else if (seconds < max_s)
            period = duration{static_cast<duration::rep>(std::ceil(seconds * 1e9))};
    }
    g.next_fetch = now + period;
    return g;
}

} // namespace hivemesh::progress
