// The progress tracker (DESIGN §6): each peer of a training run publishes a signed record of
// its own progress in the DHT and estimates, from everybody's records, the global epoch, the
// samples accumulated toward target_batch_size, and when that target will be reached.
//
//     progress::tracker<net::tcp::transport> tracker(peer, {.run_id = "my_run",
//                                                           .target_batch_size = 4096});
//     while (training) {
//         samples += train_one_batch();
//         tracker.report_local_progress(epoch, samples);
//         if (tracker.ready_to_update_epoch()) {
//             average_with_peers(samples);
//             tracker.update_epoch(++epoch);
//             samples = 0;
//         }
//     }
//
// Records (progress/record.hpp) live under "<run_id>_progress", subkey = the peer's owner
// marker, so only the peer can write or withdraw its own; the estimate's formulas are in
// progress/estimate.hpp. The tracker publishes and reads in the background, on the peer's
// executor; its public functions may be called from any thread.
#pragma once

#include "hivemesh/core/async.hpp"
#include "hivemesh/core/bytes.hpp"
#include "hivemesh/core/clock.hpp"
#include "hivemesh/core/error.hpp"
#include "hivemesh/core/log.hpp"
#include "hivemesh/dht/node.hpp"
#include "hivemesh/dht/record.hpp"
#include "hivemesh/dht/validator.hpp"
#include "hivemesh/net/transport.hpp"
#include "hivemesh/peer.hpp"
#include "hivemesh/progress/estimate.hpp"
#include "hivemesh/progress/record.hpp"

#include <asio/async_result.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/post.hpp>
#include <asio/use_awaitable.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace hivemesh::progress {

using namespace std::chrono_literals;

/// How a peer takes part in a run's progress tracking.
struct tracker_options {
    /// Names the run: peers with the same run_id count together, under the DHT key
    /// "<run_id>_progress". 1..100 characters of [A-Za-z0-9_.:/-].
    std::string run_id;
    /// Samples the swarm accumulates per epoch (> 0).
    std::uint64_t target_batch_size = 0;
    /// The epoch this peer starts at (e.g. that of the checkpoint it resumes from), with no
    /// samples; the first record says so.
    std::uint64_t initial_epoch = 0;
    /// A client trains and its samples count, but its epoch does not set the global epoch
    /// (it may lag without holding anyone back); counted in num_clients. nullopt: the peer's
    /// client_mode().
    std::optional<bool> client;
    /// False for an auxiliary peer, which trains on nothing: it publishes no record and is
    /// counted nowhere; it only reads the others' progress.
    bool reports_samples = true;
    /// Bounds of the adaptive time between two reads of the DHT (> 0, min <= max); also the
    /// least time between two publications of a record whose epoch did not change.
    duration min_refresh = 500ms;
    duration max_refresh = 10s;
    /// How long a record lives in the DHT; a record is republished every half of this, and
    /// one whose report time is this old no longer counts (its peer stopped reporting).
    /// At least 2 · min_refresh, and within the replicas' dht::storage_limits::max_lifetime
    /// (5 min by default), which refuse a later expiration.
    duration record_expiration = 60s;
    /// Smoothing factor of the samples-per-second EMA, in (0, 1]: the weight of the newest
    /// interval between two reports (throughput_ema).
    double samples_per_second_alpha = 0.1;
    /// Peers assumed able to join before the epoch ends, absolute and as a fraction of those
    /// seen (>= 0, finite): the refresh comes early enough not to miss the end of the epoch
    /// they would bring forward (estimate_global_progress).
    double expected_drift_peers = 3;
    double expected_drift_rate = 0.2;
};

/// This peer's own progress, as last reported.
struct local_training_progress {
    std::uint64_t epoch = 0;
    std::uint64_t samples_accumulated = 0;
    double samples_per_second = 0; ///< the EMA over the intervals between reports
    time_point report_time{};      ///< when samples_accumulated was reported
};

/// Counters of one tracker.
struct tracker_statistics {
    std::uint64_t publications = 0;         ///< records at least one replica accepted
    std::uint64_t publication_failures = 0; ///< stores no replica accepted
    std::uint64_t fetches = 0;              ///< reads of the run's key (none found included)
    std::uint64_t fetch_failures = 0;       ///< reads that failed (no peers, cancelled)
    std::uint64_t records_skipped =
        0; ///< malformed, expired or stale records read (not tombstones)
};

/// Tracks a run's progress for one peer (see the file comment). Uses (does not own) the peer,
/// which must outlive the tracker; installs the run's schema validator on the peer (it stays
/// installed after the tracker is gone). Publishes this peer's record at once, then whenever
/// a report or a new epoch asks for it (at most once per min_refresh while the epoch stays
/// the same) and every record_expiration / 2; reads the others' records at the adaptive
/// period of estimate_global_progress. Destroying or closing it withdraws the record.
///
/// Threading: the background work runs on the peer's executor (one thread, or a strand);
/// every public member may be called from any thread and never blocks on the network.
template <net::transport Transport>
class tracker {
public:
    using peer_type = basic_peer<Transport>;
    using dht_node_type = dht::node<Transport>;

    /// Validates the options, installs the schema validator and starts publishing and
    /// reading. Throws std::invalid_argument naming the option that is out of range.
    tracker(peer_type& peer, tracker_options options);
    tracker(const tracker&) = delete;
    tracker& operator=(const tracker&) = delete;
    /// close(): withdraws the record without waiting.
    ~tracker();

    const tracker_options& options() const noexcept { return state_->options; }
    /// Whether this peer's record says "client" (tracker_options::client or the peer's mode).
    bool is_client() const noexcept { return state_->client; }
    /// The DHT key of the run's records.
    const std::string& key() const noexcept { return state_->key; }

    /// Reports that this peer has accumulated `samples_accumulated` samples in `epoch`. Cheap:
    /// updates the samples-per-second EMA with the samples added since the previous report
    /// over the time since then (the first report, a report with fewer samples, or another
    /// epoch restarts the measurement instead), refreshes the local estimate, and lets the
    /// background publish it
    /// (at once for a new epoch, else at most once per min_refresh). Ignored after close().
    void report_local_progress(std::uint64_t epoch, std::uint64_t samples_accumulated);

    /// Moves this peer to `new_epoch` with no samples, publishing at once, and reads the
    /// others' records again within min_refresh (they are moving to the new epoch too). The
    /// time until the next report does not count toward the EMA (time spent averaging is not
    /// training).
    void update_epoch(std::uint64_t new_epoch);

    local_training_progress local_progress() const;
    /// The latest estimate: made at each read of the DHT and at each local report.
    global_training_progress global_progress() const;
    /// True when this peer should end its epoch: a peer is already at a later epoch, the
    /// reported samples reach target_batch_size, or the ETA has passed (DESIGN §6).
    bool ready_to_update_epoch() const;
    tracker_statistics statistics() const;

    /// Waits for an estimate newer than `seen_version` (global_training_progress::version):
    /// completes at once if there is one. Completion: void(std::error_code,
    /// global_training_progress) with that estimate. Errors: cancelled (through the token's
    /// cancellation slot, or the tracker closed).
    template <ASIO_COMPLETION_TOKEN_FOR(void(std::error_code, global_training_progress))
                  Token = default_token_t>
    auto async_wait_for_update(std::uint64_t seen_version, Token&& token = default_token_t{}) {
        return asio::async_initiate<Token, void(std::error_code, global_training_progress)>(
            [st = state_, seen_version](auto handler) {
                co_launch(st->executor, wait(st, false, seen_version), std::move(handler),
                          "progress::tracker::async_wait_for_update");
            },
            token);
    }

    /// Waits until ready_to_update_epoch() is true: completes at once if it is, else at the
    /// estimate or the ETA that makes it so. Completion: void(std::error_code,
    /// global_training_progress) with the estimate that made it ready. Errors: cancelled
    /// (through the token's cancellation slot, or the tracker closed).
    template <ASIO_COMPLETION_TOKEN_FOR(void(std::error_code, global_training_progress))
                  Token = default_token_t>
    auto async_wait_until_ready(Token&& token = default_token_t{}) {
        return asio::async_initiate<Token, void(std::error_code, global_training_progress)>(
            [st = state_](auto handler) {
                co_launch(st->executor, wait(st, true, 0), std::move(handler),
                          "progress::tracker::async_wait_until_ready");
            },
            token);
    }

    /// Stops publishing and reading, ends the waits (cancelled), and withdraws this peer's
    /// record by storing an empty value (a tombstone readers skip) that expires 1 ns after the
    /// last record, so the replicas take it over the record. Completion:
    /// void(std::error_code), the tombstone store's error (store_refused when no replica
    /// took it: the record then expires by itself). Call it while the peer runs: the store
    /// starts here, and it completes while the peer runs. Idempotent: a later call completes
    /// at once with no error, as does closing a tracker that never published. Not
    /// cancellable.
    template <ASIO_COMPLETION_TOKEN_FOR(void(std::error_code)) Token = default_token_t>
    auto async_close(Token&& token = default_token_t{}) {
        return asio::async_initiate<Token, void(std::error_code)>(
            [st = state_](auto handler) { shut(st, std::move(handler)); }, token);
    }

    /// async_close() without waiting for the tombstone.
    void close() { async_close(asio::detached); }

private:
    using timer_type = typename Transport::timer_type;

    /// Another peer's record as read, with its DHT expiration.
    struct seen_record {
        progress_record record;
        time_point expiration{};
    };

    struct shared {
        shared(peer_type& peer, tracker_options o, bool is_client)
            : executor(peer.get_executor())
            , options(std::move(o))
            , client(is_client)
            , key(progress_key(options.run_id))
            , key_bytes(to_buffer(as_bytes(key)))
            , own_subkey(to_buffer(as_bytes(dht::owner_marker(peer.rpc().identity().public_key()))))
            , publish_timer(executor)
            , fetch_timer(executor)
            , dht(&peer.dht())
            , ema(options.samples_per_second_alpha) {
            estimate.target_batch_size = options.target_batch_size;
            estimate.min_refresh = options.min_refresh;
            estimate.max_refresh = options.max_refresh;
            estimate.expected_drift_peers = options.expected_drift_peers;
            estimate.expected_drift_rate = options.expected_drift_rate;
        }

        time_point now() const { return net::transport_now<Transport>(executor); }

        // Fixed at construction.
        asio::any_io_executor executor;
        tracker_options options;
        estimate_options estimate;
        bool client;
        std::string key;
        byte_buffer key_bytes;
        byte_buffer own_subkey;

        // The executor's alone.
        timer_type publish_timer;
        timer_type fetch_timer;
        std::vector<std::shared_ptr<wakeup>> waiters;
        std::atomic<bool> wake_posted{false};

        // The peer's DHT node while open; a DHT operation starts under this lock, so none
        // starts after close() returned and the peer may go.
        std::mutex dht_mutex;
        dht_node_type* dht;

        // Everything below, under `mutex`.
        mutable std::mutex mutex;
        bool closed = false;
        local_training_progress local;
        time_point epoch_started{}; ///< when this peer entered local.epoch
        throughput_ema ema;
        bool measuring = false;               ///< a report or new epoch started an interval
        time_point ema_since{};               ///< start of the interval being measured
        std::uint64_t unmeasured_samples = 0; ///< reported in an interval of zero length
        std::vector<seen_record> others;      ///< from the last successful read
        time_point others_read_at{};          ///< when that read began
        global_training_progress snapshot;
        bool publish_pending = false; ///< a report not yet published
        bool publish_now = false;     ///< a new epoch: no throttling
        std::optional<time_point> last_publish;
        time_point last_expiration{}; ///< of the latest record we stored
        tracker_statistics stats;
    };
    using shared_ptr = std::shared_ptr<shared>;

    // ---- options (impl/tracker_reporting.hpp) ------------------------------------------

    static tracker_options checked(tracker_options options);

    // ---- reporting and publishing (impl/tracker_reporting.hpp) --------------------------

    /// Applies a report (under the lock); `new_epoch` publishes without throttling.
    static void apply_report(shared& st, std::uint64_t epoch, std::uint64_t samples,
                             bool force_publish, time_point now);
    /// Wakes the background loops and the waiters to look at the state again (coalesced:
    /// one post however many reports come before it runs).
    static void wake(const shared_ptr& st);
    static asio::awaitable<void> publish_loop(shared_ptr st);
    /// Starts storing `record` (without waiting for it).
    static void publish(const shared_ptr& st, const progress_record& record, time_point now);
    /// What async_close does: see there. Defined below the class, not in impl/: users
    /// instantiate it.
    template <class Handler>
    static void shut(const shared_ptr& st, Handler handler);

    // ---- reading and estimating (impl/tracker_estimating.hpp) --------------------------

    /// The records that count at `now`: the others' that have not expired and were reported
    /// within record_expiration, and ours (if we report samples) under the same rule.
    static std::vector<progress_record> live_records(const shared& st, time_point now);
    /// Replaces the snapshot by a new estimate (under the lock). Unless `fetched`, the next
    /// read does not move later.
    static void reestimate(shared& st, time_point now, bool fetched);
    static void notify_waiters(shared& st);
    static asio::awaitable<void> fetch_loop(shared_ptr st);
    /// Reads the run's records and re-estimates.
    static asio::awaitable<void> fetch(shared_ptr st);
    /// The waits of async_wait_until_ready (`until_ready`) and async_wait_for_update.
    static asio::awaitable<std::pair<std::error_code, global_training_progress>>
    wait(shared_ptr st, bool until_ready, std::uint64_t seen_version);
    /// Runs `loop` on the executor, logging an exception that escapes it.
    static void spawn(const shared_ptr& st, asio::awaitable<void> loop, const char* name);

    shared_ptr state_;
};

// async_close's callers instantiate it, so it is seen in the compiled mode too.
template <net::transport Transport>
template <class Handler>
void tracker<Transport>::shut(const shared_ptr& st, Handler handler) {
    dht_node_type* dht = nullptr;
    {
        std::lock_guard lock(st->dht_mutex);
        dht = std::exchange(st->dht, nullptr);
    }
    const time_point now = st->now();
    time_point tombstone_expiration{};
    {
        std::lock_guard lock(st->mutex);
        st->closed = true;
        if (dht && st->last_publish && st->last_expiration > now)
            tombstone_expiration = st->last_expiration + 1ns;
    }
    asio::post(st->executor, [st] {
        st->publish_timer.cancel();
        st->fetch_timer.cancel();
        notify_waiters(*st);
    });
    if (tombstone_expiration == time_point{}) {
        asio::post(st->executor, [handler = std::move(handler)]() mutable {
            std::move(handler)(std::error_code{});
        });
        return;
    }
    dht::record tombstone{st->key_bytes, st->own_subkey, {}, tombstone_expiration, {}};
    dht->async_store(std::move(tombstone), [handler = std::move(handler)](
                                               std::error_code ec, dht::store_outcome) mutable {
        std::move(handler)(ec);
    });
}

} // namespace hivemesh::progress

// The members defined out of class, one file per job (each includes this file first, so it
// also compiles alone; #pragma once breaks the cycle). Header-only use sees them here. With
// HIVEMESH_SEPARATE_COMPILATION (the hivemesh::compiled target) they are compiled once, in
// src/progress.cpp, for net::tcp and net::sim, and a program links them from there; the TCP
// instantiation is declared extern so that no translation unit instantiates it again.
#if !defined(HIVEMESH_SEPARATE_COMPILATION)
#include "hivemesh/progress/impl/tracker_estimating.hpp"
#include "hivemesh/progress/impl/tracker_reporting.hpp"
#else
#include "hivemesh/net/tcp.hpp"

namespace hivemesh::progress {
extern template class tracker<net::tcp::transport>;
} // namespace hivemesh::progress
#endif
