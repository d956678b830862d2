// The collaborative optimizer (DESIGN §7): one model trained by a swarm of peers, each calling
// step() after each of its local batches.
//
// Gradient mode (the default): step() adds the batch's gradient, weighted by its samples, to
// this peer's accumulator and reports the samples to the progress tracker. When the swarm has
// accumulated target_batch_size samples, the peers of the epoch average their mean gradients
// weighted by their samples, every peer applies its local optimizer to the result, and the
// epoch advances. Matchmaking for that round starts matchmaking_time before the estimated end
// of the epoch, so it overlaps the last batches.
//
// Local-update mode: every step() is a local optimizer step, and the peers average their
// parameters at the end of each epoch. DiLoCo (outer_optimizer): local inner steps, and each
// epoch the peers average the pseudo-gradient θ_start − θ and an outer SGD step applies it to
// θ_start. In every mode, every average_state_every epochs a round averages the parameters
// together with the optimizer's state. With delay_grad_averaging / delay_optimizer_step the
// gradient round and the optimizer step run in the background while the next epoch's batches
// compute, and a later step() applies the update. A peer that is behind the
// swarm (a newcomer, or one more than an epoch late) downloads the parameters, the buffers,
// the optimizer's state and the epoch from a peer before it continues.
//
// Buffers (model_buffers: BatchNorm's running statistics) are averaged with the parameters
// wherever the parameters are (state rounds, and the parameter rounds of local-update mode);
// integer buffers only travel with downloads and checkpoints. state_dict() and
// load_state_dict() take and restore the whole state, for checkpoints.
//
// DHT keys and RPC methods, for run_id R: progress records under "R_progress"; the epoch's
// rounds under the prefix "R_grads" (gradients), "R_params" (parameters) or "R_outer" (DiLoCo);
// state rounds, state donors and downloads under the prefix "R" ("R.0b…", "R_state_donors",
// "R.state").
#pragma once

#include "hivemesh/averaging/averager.hpp"
#include "hivemesh/compression/kind.hpp"
#include "hivemesh/core/async.hpp"
#include "hivemesh/core/bytes.hpp"
#include "hivemesh/core/clock.hpp"
#include "hivemesh/core/error.hpp"
#include "hivemesh/net/transport.hpp"
#include "hivemesh/optim/checkpoint.hpp"
#include "hivemesh/optim/local_optimizer.hpp"
#include "hivemesh/optim/sgd.hpp"
#include "hivemesh/optim/state_metadata.hpp"
#include "hivemesh/peer.hpp"
#include "hivemesh/progress/tracker.hpp"
#include "hivemesh/tensor/tensor.hpp"

#include <asio/async_result.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/use_future.hpp>

#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace hivemesh::optim {

using namespace std::chrono_literals;

/// How a peer trains with the swarm (DESIGN §7). The defaults are those of practice.
struct collaborative_options {
    /// Names the run (see the file comment for the keys it prefixes): 1..90 characters of
    /// [A-Za-z0-9_.:/-].
    std::string run_id;
    /// Samples the swarm accumulates per epoch (> 0).
    std::uint64_t target_batch_size = 0;
    /// Samples behind each step() that does not name its own batch size.
    std::uint64_t batch_size_per_step = 0;
    /// How long before the estimated end of an epoch matchmaking starts, and how long it may
    /// look for a group.
    duration matchmaking_time = 15s;
    /// True: matchmaking for an epoch's rounds starts matchmaking_time before the estimated
    /// end of the epoch, so the group is ready when the epoch ends; false: only once it ended.
    bool schedule_ahead = true;
    /// How long one all-reduce may take.
    duration averaging_timeout = 60s;
    /// How long a state download may take, every donor tried.
    duration load_state_timeout = 600s;
    /// False: accumulate gradients and average them each epoch; true: a local optimizer step
    /// on every batch, and the parameters averaged each epoch.
    bool use_local_updates = false;
    /// Every this many epochs a round averages the parameters and the optimizer's state
    /// (with equal weights); 0: never.
    std::uint64_t average_state_every = 1;
    /// Which of the local optimizer's state tensors the state rounds average, by name
    /// (local_optimizer::state_names: "exp_avg", "exp_avg_sq", "momentum_buffer", ...), as
    /// hivemind's average_opt_statistics; std::nullopt: all of them; empty: none. The others
    /// stay each peer's own in a round, and still travel with downloads and checkpoints.
    std::optional<std::vector<std::string>> average_opt_statistics;
    /// Gradient mode only. delay_grad_averaging: the epoch's gradient round runs in the
    /// background while the trainer computes the next epoch's batches (from parameters one
    /// update late), and the first step() after the round applies the optimizer step.
    /// delay_optimizer_step: the optimizer step also runs in the background, on a copy of the
    /// parameters that the first step() after it copies in; it needs an optimizer that
    /// updates the values it is given (sgd, adam; not torch_optimizer, which updates its
    /// module's own tensors). In both, the state round (when due) runs in the step that
    /// applies the update.
    bool delay_grad_averaging = false;
    bool delay_optimizer_step = false;
    /// DiLoCo: set, the inner steps are local (as with use_local_updates), and at the end of
    /// each epoch the peers average the pseudo-gradient θ_start − θ, weighted by samples, and
    /// this SGD (DiLoCo: lr 0.7, momentum 0.9, Nesterov) takes an outer step from θ_start with
    /// it. Its momentum travels with the state.
    std::optional<sgd_options> outer_optimizer;
    /// Codecs on the wire: for gradients, and for parameters, optimizer state and downloads.
    /// Where the group's announced bandwidths show a link slower than this peer compresses,
    /// the rounds send gradients in blockwise_8bit and parameters and state in float16
    /// instead (averaging.allreduce.slow_link_codec: std::nullopt turns that off).
    compression::kind grad_compression = compression::kind::none;
    compression::kind state_compression = compression::kind::none;
    /// node: trains, averages and serves state; client: trains and averages but reduces no
    /// part and serves nothing (forced when the peer is in client mode); aux: trains on
    /// nothing, reports no samples and only helps reduce (its step() takes no batch and
    /// leaves its parameters alone).
    averaging::member_role role = averaging::member_role::node;
    /// Called with the new epoch whenever the epoch changes (and with the first epoch at
    /// construction); its result becomes the local optimizer's learning rate.
    std::function<double(std::uint64_t epoch)> learning_rate_schedule;
    /// Group sizes, announced bandwidth and all-reduce details. The prefix, role, times and
    /// codec come from the fields above.
    averaging::averager_options averaging;
    /// Progress tracking: refresh and expiry of the records, and initial_epoch, the epoch this
    /// peer starts at (e.g. its checkpoint's). run_id, target_batch_size, client and
    /// reports_samples come from the fields above.
    progress::tracker_options tracking;
};

/// What became of one averaging round.
enum class round_outcome : std::uint8_t {
    none,     ///< no round ran
    averaged, ///< every element was averaged with the group
    partial,  ///< the round ended, but some parts kept this peer's own values
    failed,   ///< no group or a failed round: this peer's own values were used (see the error)
    alone,    ///< the tracker saw no other peer: this peer's own values were used
};

inline constexpr std::string_view to_string(round_outcome o) noexcept {
    switch (o) {
    case round_outcome::none:
        return "none";
    case round_outcome::averaged:
        return "averaged";
    case round_outcome::partial:
        return "partial";
    case round_outcome::failed:
        return "failed";
    case round_outcome::alone:
        return "alone";
    }
    return "unknown";
}

/// One round as a step saw it.
struct round_report {
    round_outcome outcome = round_outcome::none;
    std::error_code error; ///< why it failed (failed), or the round's error (partial)
    std::size_t group_size = 0;
    double fraction_averaged = 0;
    /// Members left out of parts of the round for the values they sent, and parts whose
    /// average this peer refused, keeping its own values (see averaging::allreduce_result::
    /// excluded and parts_refused; allreduce_options::max_norm_ratio).
    std::size_t members_excluded = 0;
    std::size_t parts_refused = 0;
};

/// What one step() did.
struct step_report {
    /// The local epoch after the step, and this peer's samples in it so far.
    std::uint64_t epoch = 0;
    std::uint64_t samples = 0;
    /// The step ended an epoch, to which this peer contributed `samples_contributed`
    /// samples.
    bool epoch_ended = false;
    std::uint64_t samples_contributed = 0;
    /// The step updated the parameters from an epoch's round (`averaging`): the epoch it
    /// ended, or with the delayed modes an earlier one.
    bool update_applied = false;
    /// The step downloaded state from a peer (its own batch was discarded), or tried to and
    /// failed (state_error).
    bool state_loaded = false;
    std::error_code state_error;
    /// The epoch's round (gradients, or parameters in local-update mode), and the state round.
    round_report averaging;
    round_report state_averaging;
};

/// Counters of one collaborative optimizer. Times are on the transport's clock (virtual time
/// on the simulated network), summed over the optimizer's life.
struct optimizer_statistics {
    std::uint64_t steps = 0;
    std::uint64_t epochs = 0;
    std::uint64_t samples = 0;           ///< reported in steps
    std::uint64_t samples_discarded = 0; ///< of batches dropped by a state download
    std::uint64_t rounds_averaged = 0;   ///< fully; gradient, parameter and state rounds
    std::uint64_t rounds_partial = 0;
    std::uint64_t rounds_failed = 0;
    std::uint64_t rounds_alone = 0;
    std::uint64_t state_loads = 0;
    std::uint64_t state_load_failures = 0;
    std::uint64_t members_excluded = 0; ///< round_report::members_excluded, summed
    std::uint64_t parts_refused = 0;    ///< round_report::parts_refused, summed
    duration accumulating{};            ///< adding gradients (gradient mode)
    duration waiting_for_group{};       ///< from the end of an epoch until its all-reduce started
    duration averaging{};               ///< all-reduces, compression included
    duration optimizer_step{};          ///< local optimizer steps
    duration state_download{};
    std::uint64_t bytes_sent = 0; ///< all-reduce message bytes
    std::uint64_t bytes_received = 0;
    std::uint64_t state_bytes_downloaded = 0; ///< float32 bytes of the states downloaded
};

/// The longest run_id: the prefixes the optimizer derives from it stay valid.
inline constexpr std::size_t max_collaborative_run_id_length = 90;
static_assert(max_collaborative_run_id_length <= max_checkpoint_name_length);

namespace detail {

inline constexpr std::string_view collaborative_who = "hivemesh::optim::collaborative_optimizer";

/// The options, checked; throws std::invalid_argument naming the one out of range.
inline collaborative_options checked(collaborative_options o) {
    if (o.run_id.empty() || o.run_id.size() > max_collaborative_run_id_length ||
        !progress::is_valid_run_id(o.run_id))
        throw_invalid(collaborative_who, "run_id \"" + o.run_id + "\" must be 1.." +
                                             std::to_string(max_collaborative_run_id_length) +
                                             " characters of [A-Za-z0-9_.:/-]");
    if (o.target_batch_size == 0) throw_invalid(collaborative_who, "target_batch_size must be > 0");
    if (o.matchmaking_time <= duration::zero())
        throw_invalid(collaborative_who, "matchmaking_time must be > 0");
    if (o.averaging_timeout <= duration::zero())
        throw_invalid(collaborative_who, "averaging_timeout must be > 0");
    if (o.load_state_timeout <= duration::zero())
        throw_invalid(collaborative_who, "load_state_timeout must be > 0");
    if (o.outer_optimizer) o.use_local_updates = true;
    if ((o.delay_grad_averaging || o.delay_optimizer_step) && o.use_local_updates)
        throw_invalid(collaborative_who, "delay_grad_averaging and delay_optimizer_step are for "
                                         "gradient mode (not use_local_updates or DiLoCo)");
    return o;
}

/// The averager options of one kind of round: `prefix`, with the optimizer's role, times and
/// `codec` over the user's averaging options. Rounds of parameters or optimizer state
/// (`state`) take float16, not 8 bits, on slow links when the adaptive choice is on: they
/// carry the values themselves, not one step's noisy direction.
inline averaging::averager_options round_options(const collaborative_options& o, std::string prefix,
                                                 averaging::member_role role,
                                                 compression::kind codec, bool state) {
    averaging::averager_options a = o.averaging;
    a.prefix = std::move(prefix);
    a.role = role;
    a.matchmaking_time = o.matchmaking_time;
    a.averaging_timeout = o.averaging_timeout;
    a.allreduce.codec = codec;
    if (state && a.allreduce.slow_link_codec)
        a.allreduce.slow_link_codec = compression::kind::float16;
    return a;
}

/// Copies of the tensors' values.
inline std::vector<std::vector<float>> copies_of(std::span<const tensor::tensor_ref> tensors) {
    std::vector<std::vector<float>> out;
    out.reserve(tensors.size());
    for (const auto& t : tensors) {
        auto& copy = out.emplace_back(t.size());
        t.copy_to(copy);
    }
    return out;
}

/// True when no value in `list` is NaN or infinite.
inline bool all_finite(const std::vector<std::vector<float>>& list) {
    for (const auto& t : list)
        for (const float x : t)
            if (!std::isfinite(x)) return false;
    return true;
}

/// True when `list` has one tensor of each of `tensors`' sizes.
template <class Tensors, class T>
bool same_sizes(const Tensors& tensors, const std::vector<std::vector<T>>& list) {
    if (list.size() != tensors.size()) return false;
    for (std::size_t i = 0; i < list.size(); ++i)
        if (list[i].size() != tensors[i].size()) return false;
    return true;
}

/// Clears a flag when the scope ends.
struct flag_release {
    std::atomic<bool>& flag;
    ~flag_release() { flag = false; }
};

/// The round tag of an epoch (0 means "untagged" to the averager).
inline std::uint64_t round_tag(std::uint64_t epoch) noexcept {
    return epoch + 1;
}

} // namespace detail

/// Trains one model with the swarm (see the file comment). Uses (does not own) the peer,
/// which must outlive the optimizer and what it started; keeps the parameters by reference
/// (their tensors must outlive it and keep their sizes).
///
/// Threading: one step at a time, from any thread; the network work runs on the peer's
/// executor, and the optimizer's own CPU work on the caller's thread (adding gradients, local
/// updates) or on the peer's compute executor (applying a round). Between steps the trainer
/// owns the gradients; during a step the optimizer owns the parameters and the gradients.
template <net::transport Transport>
class collaborative_optimizer {
public:
    using peer_type = basic_peer<Transport>;
    using averager_type = averaging::averager<Transport>;
    using completion_signature = void(std::error_code, step_report);

    /// Starts tracking progress and serving state. `buffers` are the model's tensors that are
    /// not trained but must agree across the swarm (see model_buffers); kept by reference like
    /// the parameters. Throws std::invalid_argument for bad options or parameters (a value and
    /// grad of different sizes, none at all).
    collaborative_optimizer(peer_type& peer, std::vector<parameter> params,
                            local_optimizer optimizer, collaborative_options options,
                            model_buffers buffers = {});
    collaborative_optimizer(const collaborative_optimizer&) = delete;
    collaborative_optimizer& operator=(const collaborative_optimizer&) = delete;
    /// close().
    ~collaborative_optimizer();

    /// One training step: `batch_size` samples (0: batch_size_per_step) whose mean gradient
    /// is in the parameters' grads (see the file comment). The caller's thread adds the
    /// gradient (or takes the local step) before this returns; the rest completes on the
    /// peer's executor. Completion: void(std::error_code, step_report). Averaging failures
    /// are not errors (see step_report); the error is cancelled when the optimizer was
    /// closed. Throws, before anything changed, std::invalid_argument when a step is already
    /// running or no batch size is known, and std::system_error(size_mismatch) when a grad's
    /// size changed. Not cancellable: a round ends by its own deadlines.
    template <ASIO_COMPLETION_TOKEN_FOR(completion_signature) Token = default_token_t>
    auto async_step(std::uint64_t batch_size = 0, Token&& token = default_token_t{}) {
        return asio::async_initiate<Token, completion_signature>(
            [st = state_, batch_size](auto handler) {
                const std::uint64_t batch = begin_step(*st, batch_size);
                co_launch(st->executor, run_step(st, batch), std::move(handler),
                          "optim::collaborative_optimizer::async_step");
            },
            token);
    }

    /// async_step for training loops: blocks until the step completes. Throws what
    /// async_step throws, and std::system_error: wrong_thread on the peer's io thread, else
    /// async_step's error.
    step_report step(std::uint64_t batch_size = 0);

    /// Downloads the parameters, the optimizer's state and the epoch from the best donor,
    /// dropping this epoch's gradients. step() does this by itself when the peer is behind.
    /// Completion: void(std::error_code): averaging::async_load_state's errors, or
    /// corrupt_data / size_mismatch for a state that does not fit these parameters, or
    /// invalid_argument while a step runs. Not cancellable.
    template <ASIO_COMPLETION_TOKEN_FOR(void(std::error_code)) Token = default_token_t>
    auto async_load_state_from_peers(Token&& token = default_token_t{}) {
        return asio::async_initiate<Token, void(std::error_code)>(
            [st = state_](auto handler) {
                co_launch(st->executor, load_state_alone(st), std::move(handler),
                          "optim::collaborative_optimizer::async_load_state_from_peers");
            },
            token);
    }

    /// The optimizer's whole state, for a checkpoint (save_checkpoint writes it to a file):
    /// the parameters, buffers, local (and DiLoCo's outer) optimizer state, step counts,
    /// epoch and run_id. Not in it: the gradients accumulated in the current epoch. In the
    /// delayed modes an update still running in the background is waited for and applied
    /// first, as the next step would. Completion: void(std::error_code, checkpoint);
    /// invalid_argument while a step runs, cancelled once closed. Not cancellable.
    template <ASIO_COMPLETION_TOKEN_FOR(void(std::error_code, checkpoint)) Token = default_token_t>
    auto async_state_dict(Token&& token = default_token_t{}) {
        return asio::async_initiate<Token, void(std::error_code, checkpoint)>(
            [st = state_](auto handler) {
                co_launch(st->executor, take_checkpoint(st), std::move(handler),
                          "optim::collaborative_optimizer::async_state_dict");
            },
            token);
    }
    /// async_state_dict for training loops: blocks until it completes. Throws
    /// std::system_error: wrong_thread on the peer's io thread, else its error.
    checkpoint state_dict();

    /// Restores a state that state_dict() took from an optimizer of the same run, local
    /// optimizer and model: the local epoch becomes the checkpoint's, the gradients
    /// accumulated in the current epoch are dropped, and a donor serves the restored state.
    /// Everything is checked before anything changes. Completion: void(std::error_code):
    /// invalid_argument for another run_id or local optimizer or while a step runs (the
    /// reason is logged), size_mismatch for other tensor counts or sizes, corrupt_data for a
    /// value that is not finite, cancelled once closed. Not cancellable.
    template <ASIO_COMPLETION_TOKEN_FOR(void(std::error_code)) Token = default_token_t>
    auto async_load_state_dict(checkpoint state, Token&& token = default_token_t{}) {
        return asio::async_initiate<Token, void(std::error_code)>(
            [st = state_](auto handler, checkpoint c) {
                co_launch(st->executor, restore_checkpoint(st, std::move(c)), std::move(handler),
                          "optim::collaborative_optimizer::async_load_state_dict");
            },
            token, std::move(state));
    }
    /// async_load_state_dict for training loops: blocks until it completes. Throws
    /// std::system_error: wrong_thread on the peer's io thread, else its error.
    void load_state_dict(checkpoint state);

    /// The local epoch: epochs this peer has completed (or loaded). Any thread.
    std::uint64_t local_epoch() const noexcept { return state_->epoch.load(); }
    /// The swarm's progress as this peer's tracker estimates it.
    progress::global_training_progress global_progress() const {
        return state_->tracker.global_progress();
    }
    optimizer_statistics statistics() const {
        std::lock_guard lock(state_->mutex);
        return state_->stats;
    }
    const collaborative_options& options() const noexcept { return state_->options; }
    averaging::member_role role() const noexcept { return state_->role; }
    /// The local optimizer (e.g. for its learning rate); not while a step runs.
    local_optimizer& optimizer() noexcept { return state_->local; }
    const std::vector<parameter>& parameters() const noexcept { return state_->params; }
    const model_buffers& buffers() const noexcept { return state_->model; }
    progress::tracker<Transport>& tracker() noexcept { return state_->tracker; }

    /// Stops: starts withdrawing the progress record and the donor record, and cancels the
    /// rounds scheduled ahead (and a delayed round in the background), without waiting for
    /// any of it (async_close waits). A step running on completes with what it has; a delayed
    /// update in the background no longer reads the parameters once this returns.
    /// Idempotent. Any thread.
    void close();

    /// Leaves the swarm: does what close() does, then waits until the rounds it cancelled
    /// have ended, and until the tombstones of the progress record and the donor record and
    /// the withdrawals of every matchmaking declaration the optimizer's rounds made have
    /// completed (stored or failed), so that the others see this peer leave at once rather
    /// than when its records expire. Completion: void(std::error_code), the first error of
    /// those stores in that order (store_refused when no replica took one: that record then
    /// expires by itself), or success. A round that a step still running waits for is
    /// neither cancelled nor waited for: call it between steps. Idempotent: after close() or
    /// another async_close it completes at once with no error. Not cancellable: it completes
    /// within the rounds' and the DHT's own timeouts. Call it while the peer (and its DHT
    /// node) runs: the stores start here and complete on the peer's executor, so the peer
    /// must outlive the operation; the optimizer need not. Any thread.
    template <ASIO_COMPLETION_TOKEN_FOR(void(std::error_code)) Token = default_token_t>
    auto async_close(Token&& token = default_token_t{}) {
        return asio::async_initiate<Token, void(std::error_code)>(
            [st = state_](auto handler) {
                close_and_wait(
                    st, erased_handler<void(std::error_code)>(std::move(handler), st->executor));
            },
            token);
    }

private:
    /// An averaging step started ahead of its trigger.
    struct pending_round {
        explicit pending_round(const asio::any_io_executor& ex)
            : finished(ex) {}
        std::shared_ptr<averaging::step_control> control;
        asio::cancellation_signal cancel;
        wakeup finished;
        bool done = false;
        time_point triggered_at{};
        std::error_code error;
        averaging::step_result result;
    };
    using pending_ptr = std::shared_ptr<pending_round>;

    /// A gradient round (and with delay_optimizer_step, the optimizer step) running in the
    /// background.
    struct delayed_update {
        explicit delayed_update(const asio::any_io_executor& ex)
            : finished(ex) {}
        std::uint64_t epoch = 0; ///< that the round ends
        bool state_due = false;  ///< a state round follows the update
        pending_ptr round;
        wakeup finished;
        bool done = false;
        bool dropped = false; ///< load_state discards it
        round_report report;
    };

    /// The results of the tombstone stores async_close waits for, set on the executor.
    struct closing {
        explicit closing(const asio::any_io_executor& ex)
            : stored(ex) {}
        std::optional<std::error_code> progress_record;
        std::optional<std::error_code> donor_record;
        wakeup stored;
    };
    using closing_ptr = std::shared_ptr<closing>;

    /// The snapshot donors serve; swapped at each epoch.
    struct served_state {
        std::mutex mutex;
        std::shared_ptr<const averaging::state_snapshot> current;
    };

    struct shared {
        shared(peer_type& peer, std::vector<parameter> params, model_buffers model,
               local_optimizer optimizer, collaborative_options options,
               averaging::member_role role);

        time_point now() const { return net::transport_now<Transport>(executor); }
        bool serves_state() const { return server != nullptr; }

        asio::any_io_executor executor;
        std::optional<asio::any_io_executor> compute;
        collaborative_options options;
        averaging::member_role role;
        std::vector<parameter> params;
        model_buffers model;
        local_optimizer local;
        bool delayed() const {
            return options.delay_grad_averaging || options.delay_optimizer_step;
        }

        /// Gradient mode: Σ batch·grad over the epoch's steps.
        std::vector<std::vector<float>> accumulators;
        /// What the epoch's round averages: the mean gradient, or DiLoCo's pseudo-gradient.
        std::vector<std::vector<float>> buffers;
        /// {value, buffer}: what the local optimizer steps with in gradient mode.
        std::vector<parameter> buffered;
        /// DiLoCo: the outer optimizer, θ_start, and {θ_start, buffer}.
        std::optional<local_optimizer> outer;
        std::vector<std::vector<float>> start_values;
        std::vector<parameter> outer_params;
        /// delay_optimizer_step: the values the background step updates, and {those, buffer}.
        std::vector<std::vector<float>> update_values;
        std::vector<parameter> update_params;
        /// The parameters' values, the averaged buffers, then the optimizer's state tensors
        /// (the local optimizer's, then the outer one's): what downloads and checkpoints carry.
        std::vector<tensor::tensor_ref> state_tensors;
        /// What the state rounds average: state_tensors less the local optimizer's state that
        /// average_opt_statistics leaves out.
        std::vector<tensor::tensor_ref> averaged_state;
        progress::tracker<Transport> tracker;
        /// The epoch's round: gradients, or parameters in local-update mode (none when every
        /// epoch averages the state).
        std::unique_ptr<averager_type> rounds;
        /// State rounds, and state serving and loading.
        std::unique_ptr<averager_type> state;
        std::shared_ptr<served_state> server;

        std::atomic<std::uint64_t> epoch{0};
        std::atomic<bool> stepping{false};
        std::atomic<bool> closed{false};

        // The caller's thread during begin_step, else the executor's (steps never overlap).
        std::uint64_t samples = 0; ///< this epoch's
        std::uint64_t accumulated_steps = 0;

        // The executor's alone.
        std::shared_ptr<delayed_update> delayed_round;
        pending_ptr scheduled_round;
        pending_ptr scheduled_state;
        bool first_read = false;      ///< the tracker has read the DHT once
        bool check_sync = true;       ///< compare with the global epoch after the next read
        std::uint64_t fetch_mark = 0; ///< tracker reads before the epoch began
        time_point next_load_attempt{};

        mutable std::mutex mutex; ///< guards stats
        optimizer_statistics stats;
        /// Held while the background step reads the parameters outside a step; close() takes
        /// it, so none does once the optimizer (which they need only outlive) is gone.
        std::mutex background_mutex;
        /// Notified whenever a scheduled or delayed round ends, for async_close (the executor's).
        std::shared_ptr<wakeup> round_ended;
    };
    using shared_ptr = std::shared_ptr<shared>;

    // ---- the step (impl/collaborative_step.hpp) -----------------------------------------

    /// The caller's part of a step: adds the gradient or takes the local step; returns the
    /// batch size. Throws as async_step does.
    static std::uint64_t begin_step(shared& st, std::uint64_t batch_size);
    /// Adds batch · grad to the accumulators (the first step of an epoch overwrites them).
    static void accumulate(shared& st, std::uint64_t batch);
    static asio::awaitable<std::pair<std::error_code, step_report>> run_step(shared_ptr st,
                                                                             std::uint64_t batch);
    /// Which rounds end the epoch before `next`: the epoch's (gradients, or parameters) and
    /// the state's.
    struct rounds_due {
        bool round = false;
        bool state = false;
    };
    static rounds_due rounds_at(const shared& st, std::uint64_t next);
    /// Waits until the tracker has read the others' records once (or failed to).
    static asio::awaitable<void> wait_for_first_read(shared_ptr st);
    /// Starts the rounds of the coming epoch end when its ETA is near.
    static void maybe_schedule(const shared_ptr& st);
    /// Averages, applies and moves to the next epoch.
    static asio::awaitable<void> end_epoch(shared_ptr st, step_report& report);
    /// `work` on the compute executor, its time added to `phase`.
    template <class Work>
    static asio::awaitable<void> timed(shared_ptr st, duration optimizer_statistics::*phase,
                                       Work& work);
    /// A round of `averager` (see run_round), or none when the peer is alone; counted.
    static asio::awaitable<round_report> round_or_alone(shared_ptr st, averager_type& averager,
                                                        pending_ptr& scheduled, std::uint64_t epoch,
                                                        double weight, bool alone);
    /// Fills the buffers with what the epoch's round averages.
    static asio::awaitable<void> fill_buffers(shared_ptr st);
    /// Applies the epoch's averaged buffers: the optimizer step, or DiLoCo's outer step.
    static asio::awaitable<void> apply_buffers(shared_ptr st);
    /// The state round after an update, if due.
    static asio::awaitable<void> average_state(shared_ptr st, std::uint64_t epoch, bool alone,
                                               step_report& report);

    // ---- the delayed modes (impl/collaborative_delayed.hpp) -------------------------------

    /// Starts the epoch's gradient round in the background.
    static void start_delayed(const shared_ptr& st, std::uint64_t epoch, double weight, bool alone,
                              bool state_due);
    static asio::awaitable<void> run_delayed(shared_ptr st, std::shared_ptr<delayed_update> d,
                                             double weight, bool alone);
    /// Applies a finished background update (`wait`: waits for a running one first).
    static asio::awaitable<void> apply_delayed(shared_ptr st, bool wait, step_report& report);
    /// Cancels a background update and drops it.
    static asio::awaitable<void> drop_delayed(shared_ptr st);

    // ---- rounds (impl/collaborative_rounds.hpp) -----------------------------------------

    /// The members a round of the current epoch expects (step_control::expected_members).
    static std::size_t expected_members(const shared& st);
    /// Starts a step of `averager` tagged with `epoch`, to be triggered later.
    static pending_ptr schedule(shared& st, averager_type& averager, std::uint64_t epoch);
    /// Triggers `pending` (or a fresh step when it is unusable) and waits for it.
    static asio::awaitable<round_report> run_round(shared_ptr st, averager_type& averager,
                                                   pending_ptr pending, std::uint64_t epoch,
                                                   double weight);
    /// Cancels a scheduled round and waits for it to end.
    static asio::awaitable<void> abandon(pending_ptr& pending);
    static void count(shared& st, const round_report& r);

    // ---- closing (impl/collaborative_state.hpp) ------------------------------------------

    /// close()'s work on the caller's thread: marks the optimizer closed, waits out the
    /// background step's read of the parameters and starts the tracker's tombstone (its
    /// result into `waiting`, if any). False if it was closed already.
    static bool begin_close(const shared_ptr& st, const closing_ptr& waiting);
    /// close()'s work on the executor: cancel_rounds, and starts the donor's tombstone (its
    /// result into `waiting`, if any).
    static void stop_on_executor(shared& st, const closing_ptr& waiting);
    /// Cancels the rounds still running (scheduled ahead, or the delayed one's); true while
    /// one of them, or the delayed update, has not ended. Repeatable.
    static bool cancel_rounds(shared& st);
    /// async_close: begin_close, then close_rest on the executor, then `handler`.
    static void close_and_wait(const shared_ptr& st, erased_handler<void(std::error_code)> handler);
    static asio::awaitable<std::error_code> close_rest(shared_ptr st, closing_ptr waiting);

    // ---- state (impl/collaborative_state.hpp) --------------------------------------------

    static bool should_load_state(shared& st);
    static asio::awaitable<std::error_code> load_state(shared_ptr st);
    /// async_load_state_from_peers: load_state outside a step.
    static asio::awaitable<std::error_code> load_state_alone(shared_ptr st);
    /// Validates a downloaded state and copies it into the parameters and optimizer state.
    static std::error_code apply_state(shared& st, const averaging::state_snapshot& state,
                                       state_metadata& meta);
    /// Replaces the served snapshot by a copy of the current state. Any thread.
    static void refresh_served_state(shared& st);
    /// refresh_served_state on the compute executor, then advertises the epoch.
    static asio::awaitable<void> publish_served_state(shared_ptr st);
    /// Moves to `epoch`: the tracker, the learning rate, the accumulators, the sync check.
    static void enter_epoch(shared& st, std::uint64_t epoch);
    /// The parameters' values: the first entries of state_tensors.
    static std::span<const tensor::tensor_ref> parameter_values(const shared& st) {
        return std::span(st.state_tensors).first(st.params.size());
    }
    /// The integer buffers' values.
    static std::vector<std::vector<std::int64_t>> integer_values(const shared& st);
    /// Writes the integer buffers; on an error (a value the tensor cannot hold) restores
    /// those already written and returns invalid_argument.
    static std::error_code write_integers(shared& st,
                                          const std::vector<std::vector<std::int64_t>>& values);

    // ---- checkpoints (impl/collaborative_checkpoint.hpp) ---------------------------------

    static asio::awaitable<std::pair<std::error_code, checkpoint>> take_checkpoint(shared_ptr st);
    static asio::awaitable<std::error_code> restore_checkpoint(shared_ptr st, checkpoint c);
    /// Why `c` cannot be restored here (logged), or success.
    static std::error_code check_checkpoint(shared& st, const checkpoint& c);

    shared_ptr state_;
};

template <net::transport Transport>
collaborative_optimizer(basic_peer<Transport>&, std::vector<parameter>, local_optimizer,
                        collaborative_options) -> collaborative_optimizer<Transport>;
template <net::transport Transport>
collaborative_optimizer(basic_peer<Transport>&, std::vector<parameter>, local_optimizer,
                        collaborative_options, model_buffers) -> collaborative_optimizer<Transport>;

} // namespace hivemesh::optim

// The members defined out of class, one file per job (each includes this file first, so it
// also compiles alone; #pragma once breaks the cycle). Header-only use sees them here. With
// HIVEMESH_SEPARATE_COMPILATION (the hivemesh::compiled target) they are compiled once, in
// src/optim.cpp, for net::tcp and net::sim, and a program links them from there; the TCP
// instantiation is declared extern so that no translation unit instantiates it again.
#if !defined(HIVEMESH_SEPARATE_COMPILATION)
#include "hivemesh/optim/impl/collaborative_checkpoint.hpp"
#include "hivemesh/optim/impl/collaborative_delayed.hpp"
#include "hivemesh/optim/impl/collaborative_rounds.hpp"
#include "hivemesh/optim/impl/collaborative_state.hpp"
#include "hivemesh/optim/impl/collaborative_step.hpp"
#else
#include "hivemesh/net/tcp.hpp"

namespace hivemesh::optim {
extern template class collaborative_optimizer<net::tcp::transport>;
} // namespace hivemesh::optim
#endif
