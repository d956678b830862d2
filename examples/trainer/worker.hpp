// One peer of the collaborative trainer (or the single-node baseline): it trains the model on
// Fashion-MNIST and tells the launcher what it does, as JSON lines on stdout (see
// worker_events). Include <hivemesh/optim/torch.hpp> before this header.
#pragma once

#include "model.hpp"
#include "options.hpp"
#include "phases.hpp"

#include <hivemesh/compression/kind.hpp>
#include <hivemesh/optim.hpp>
#include <hivemesh/peer.hpp>

#include <ATen/Parallel.h>

#include <sys/prctl.h>
#include <xxhash.h>

#include <asio/use_future.hpp>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace hivemesh::examples {

using seconds_f = std::chrono::duration<double>;

inline double seconds_of(hivemesh::duration d) {
    return std::chrono::duration_cast<seconds_f>(d).count();
}

namespace detail {

/// The events a worker sends, one JSON object per line on stdout:
///   {"event":"listening","rank":R,"addresses":[...]}       (a swarm peer, once it listens)
///   {"event":"joined","rank":R,"epoch":E,"global_epoch":G,"state_loaded":B,
///    "resumed_from_epoch":K|null} (training starts, after restoring its checkpoint (epoch K)
///    and after a state download if the swarm was ahead; G: the swarm's epoch before it)
///   {"event":"progress","rank":R,"epoch":..,"samples":..,"samples_per_second":..,
///    "loss":..,"next_round":S|null,"global_epoch":..,"peers":..}
///   {"event":"snapshot","rank":R,"epoch":E,"file":PATH,"final":B}
///   {"event":"done","rank":R,"epoch":..,"samples":..,"wall":..,"parameters_hash":HEX,
///    "buffers_hash":HEX,"phases":{..},"stats":{..}}   (the hashes: of the parameters and
///    of the float buffers, which every peer of a swarm ends with the same)
///   {"event":"error","rank":R,"message":TEXT}
class worker_events {
public:
    explicit worker_events(std::size_t rank)
        : rank_(rank) {}

    void send(nlohmann::ordered_json event) const {
        event["rank"] = rank_;
        const std::string line = event.dump() + "\n";
        std::fwrite(line.data(), 1, line.size(), stdout);
        std::fflush(stdout);
    }

private:
    std::size_t rank_;
};

inline optim::local_optimizer make_local_optimizer(const trainer_options& o) {
    if (o.optimizer == "sgd") {
        optim::sgd_options s;
        s.lr = o.lr;
        s.momentum = 0.9;
        return optim::sgd(s);
    }
    optim::adam_options a;
    a.lr = o.lr;
    return optim::adam(a);
}

/// XXH3-64 of the tensors' float32 values, in hex.
inline std::string hash_of(const std::vector<at::Tensor>& tensors) {
    XXH3_state_t* state = XXH3_createState();
    XXH3_64bits_reset(state);
    for (const auto& t : tensors) {
        const auto c = t.detach().to(at::kFloat).contiguous();
        XXH3_64bits_update(state, c.data_ptr<float>(), static_cast<std::size_t>(c.numel()) * 4);
    }
    const auto hash = XXH3_64bits_digest(state);
    XXH3_freeState(state);
    return program::format("%016llx", static_cast<unsigned long long>(hash));
}

/// The file of this peer's checkpoints in --checkpoint.
inline std::filesystem::path checkpoint_file(const trainer_options& o) {
    return std::filesystem::path(o.checkpoint) / ("peer-" + std::to_string(o.rank) + ".ckpt");
}

/// Writes the model's parameters and float buffers to `<report>/snapshots/epoch-<E>.bin`
/// (flat float32).
inline std::string write_snapshot(classifier& model, const trainer_options& o, std::uint64_t epoch,
                                  bool final) {
    const auto directory = std::filesystem::path(o.report) / "snapshots";
    std::filesystem::create_directories(directory);
    const auto path = directory / (final ? "final.bin" : "epoch-" + std::to_string(epoch) + ".bin");
    const auto values = flat_parameters(model);
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(values.data()),
              static_cast<std::streamsize>(values.size() * sizeof(float)));
    if (!out) throw std::runtime_error("cannot write " + path.string());
    return path.string();
}

/// What the training loops of both modes share: a batch and its forward and backward pass
/// (timed as data and compute), progress every half second, snapshots, the final report.
class training_loop {
public:
    using clock = std::chrono::steady_clock;

    training_loop(const trainer_options& o, classifier& model, const image_set& train,
                  std::vector<at::Tensor> grads, const worker_events& events)
        : o_(o)
        , model_(model)
        , sampler_(train, o.seed * 1000003 + o.rank)
        , grads_(std::move(grads))
        , events_(events)
        , started_(clock::now()) {}

    /// Seconds since the loop was made.
    double elapsed() const { return seconds_f(clock::now() - started_).count(); }

    bool should_stop(std::uint64_t epoch) const {
        return stop_requested || (o_.epoch_limit() > 0 && epoch >= o_.epoch_limit()) ||
               (o_.max_time > 0 && elapsed() >= o_.max_time);
    }

    /// One batch: data and compute timed into `phases`; the loss is kept for progress.
    void forward_backward(phase_seconds& phases) {
        const auto t0 = clock::now();
        auto [images, labels] = sampler_.next(o_.batch_size);
        const auto t1 = clock::now();
        for (auto& g : grads_)
            g.zero_();
        const auto loss = torch::nn::functional::cross_entropy(model_.forward(images), labels);
        loss.backward();
        loss_sum_ += loss.item<double>();
        ++losses_;
        samples_ += o_.batch_size;
        const auto t2 = clock::now();
        phases.data += seconds_f(t1 - t0).count();
        phases.compute += seconds_f(t2 - t1).count();
    }

    /// Sends a progress event if half a second passed since the last; `extra` adds fields.
    void maybe_report(std::uint64_t epoch, nlohmann::ordered_json extra = {}) {
        const double now = elapsed();
        if (now - last_report_ < 0.5 || losses_ == 0) return;
        nlohmann::ordered_json e{
            {"event", "progress"},
            {"epoch", epoch},
            {"samples", samples_},
            {"samples_per_second",
             static_cast<double>(samples_ - last_samples_) / (now - last_report_)},
            {"loss", loss_sum_ / static_cast<double>(losses_)}};
        for (auto& [key, value] : extra.items())
            e[key] = value;
        events_.send(std::move(e));
        last_report_ = now;
        last_samples_ = samples_;
        loss_sum_ = 0;
        losses_ = 0;
    }

    /// Peer 0 writes its parameters for the launcher's evaluation. That is not training: its
    /// time is left out of the wall time (and reported as snapshot_seconds).
    void snapshot(std::uint64_t epoch, bool final) {
        if (o_.rank != 0) return;
        const auto t0 = clock::now();
        events_.send({{"event", "snapshot"},
                      {"epoch", epoch},
                      {"file", write_snapshot(model_, o_, epoch, final)},
                      {"final", final}});
        snapshot_seconds_ += seconds_f(clock::now() - t0).count();
    }

    void done(std::uint64_t epoch, phase_seconds phases, nlohmann::ordered_json stats) {
        const double wall = elapsed() - snapshot_seconds_;
        phases.other = std::max(0.0, wall - phases.named());
        std::vector<at::Tensor> float_buffers;
        for (const auto& b : model_.buffers())
            if (at::isFloatingType(b.scalar_type())) float_buffers.push_back(b);
        events_.send({{"event", "done"},
                      {"epoch", epoch},
                      {"samples", samples_},
                      {"wall", wall},
                      {"snapshot_seconds", snapshot_seconds_},
                      {"parameters_hash", hash_of(model_.parameters())},
                      {"buffers_hash", hash_of(float_buffers)},
                      {"phases", to_json(phases)},
                      {"stats", std::move(stats)}});
    }

private:
    const trainer_options& o_;
    classifier& model_;
    batch_sampler sampler_;
    std::vector<at::Tensor> grads_;
    const worker_events& events_;
    clock::time_point started_;
    std::uint64_t samples_ = 0, last_samples_ = 0;
    double loss_sum_ = 0;
    std::size_t losses_ = 0;
    double last_report_ = 0;
    double snapshot_seconds_ = 0;
};

/// The single-node baseline: the collaborative optimizer's arithmetic without a swarm.
/// Gradient mode sums batch x gradient until target_batch_size samples, then steps with the
/// mean; local updates step every batch and count epochs the same way.
inline void train_single(const trainer_options& o, classifier& model, const image_set& train,
                         const optim::module_parameters& params, const worker_events& events) {
    auto local = make_local_optimizer(o);
    training_loop loop(o, model, train, params.grads(), events);
    std::vector<at::Tensor> sums;
    for (const auto& g : params.grads())
        sums.push_back(at::zeros_like(g));
    std::uint64_t epoch = 0, in_epoch = 0;
    phase_seconds phases;
    events.send({{"event", "joined"}, {"epoch", 0}, {"global_epoch", 0}});
    while (!loop.should_stop(epoch)) {
        loop.forward_backward(phases);
        const auto t0 = training_loop::clock::now();
        in_epoch += o.batch_size;
        if (o.local_updates) {
            local.step(params);
        } else {
            for (std::size_t k = 0; k < sums.size(); ++k)
                sums[k].add_(params.grads()[k], static_cast<double>(o.batch_size));
        }
        const bool epoch_ended = in_epoch >= o.target_batch_size;
        if (epoch_ended && !o.local_updates) {
            for (std::size_t k = 0; k < sums.size(); ++k) {
                params.grads()[k].copy_(sums[k]).div_(static_cast<double>(in_epoch));
                sums[k].zero_();
            }
            local.step(params);
        }
        phases.optimizer += seconds_f(training_loop::clock::now() - t0).count();
        if (epoch_ended) {
            ++epoch;
            in_epoch = 0;
            loop.snapshot(epoch, false);
        }
        loop.maybe_report(epoch, {{"global_epoch", epoch}, {"peers", 1}});
    }
    loop.snapshot(epoch, true);
    loop.done(epoch, phases, nlohmann::ordered_json::object());
}

inline nlohmann::ordered_json to_json(const optim::optimizer_statistics& s) {
    return {{"steps", s.steps},
            {"epochs", s.epochs},
            {"samples_discarded", s.samples_discarded},
            {"rounds_averaged", s.rounds_averaged},
            {"rounds_partial", s.rounds_partial},
            {"rounds_failed", s.rounds_failed},
            {"rounds_alone", s.rounds_alone},
            {"state_loads", s.state_loads},
            {"state_load_failures", s.state_load_failures},
            {"members_excluded", s.members_excluded},
            {"parts_refused", s.parts_refused},
            {"bytes_sent", s.bytes_sent},
            {"bytes_received", s.bytes_received}};
}

/// A peer of the swarm: joins, catches up with the swarm's epoch, then trains.
inline void train_in_swarm(const trainer_options& o, classifier& model, const image_set& train,
                           const optim::module_parameters& params, const worker_events& events) {
    peer_options po;
    po.listen = {o.listen.empty() ? "/ip4/127.0.0.1/tcp/0" : o.listen};
    po.initial_peers = o.join;
    if (!o.bootstrap.empty()) po.initial_peers.push_back(o.bootstrap);
    // On loopback only peer 0 has the --identity (its address then stays the same); in
    // multi-host mode this process is the only peer, rank 0.
    if (o.rank == 0) po.identity_path = o.identity;
    po.swarm_key = o.swarm_key;
    po.plaintext = o.plaintext;
    po.bootstrap_timeout = std::chrono::duration_cast<duration>(seconds_f(o.join_timeout));
    peer swarm_peer(po);
    events.send({{"event", "listening"}, {"addresses", swarm_peer.addresses()}});

    optim::collaborative_options co;
    co.run_id = o.run_id;
    co.target_batch_size = o.target_batch_size;
    co.batch_size_per_step = o.batch_size;
    co.matchmaking_time = std::chrono::duration_cast<duration>(seconds_f(o.matchmaking_time));
    co.averaging_timeout = 30s;
    co.use_local_updates = o.local_updates;
    co.average_state_every = o.average_state_every;
    co.grad_compression = *compression::parse_kind(o.grad_compression);
    co.averaging.allreduce.max_norm_ratio = o.max_norm_ratio;
    // On loopback (every peer the launcher started; they bootstrap with --bootstrap, not
    // --join) the whole swarm is known: a group of every peer forms at once, also while a
    // killed peer's record still counts (the optimizer's own rule waits for every peer its
    // tracker counts until that record is two epochs behind). The trackers and matchmakers
    // read the DHT more often than over the internet, so that even the first epoch, before
    // anyone knows the others' rates, ends soon after the swarm reaches the target.
    if (!o.multi_host()) {
        co.averaging.target_group_size = std::max<std::size_t>(2, o.peers);
        co.tracking.min_refresh = 100ms;
        co.averaging.matchmaking.poll_interval = 100ms;
    }
    std::optional<optim::checkpoint> resumed;
    if (o.resume && std::filesystem::exists(checkpoint_file(o))) {
        resumed = optim::load_checkpoint(checkpoint_file(o));
        co.tracking.initial_epoch = resumed->epoch; // its first record already says so
    }
    optim::collaborative_optimizer optimizer(swarm_peer, params.list(), make_local_optimizer(o), co,
                                             params.buffers());
    std::optional<std::uint64_t> resumed_from;
    if (resumed) {
        resumed_from = resumed->epoch;
        optimizer.load_state_dict(std::move(*resumed));
    }
    if (!o.checkpoint.empty()) std::filesystem::create_directories(o.checkpoint);
    // Saving happens between steps: the trainer's thread owns the model then.
    const auto save = [&] {
        if (!o.checkpoint.empty())
            optim::save_checkpoint(checkpoint_file(o), optimizer.state_dict());
    };

    // The peers the launcher started train from the same moment; a newcomer waits only for
    // its tracker's first read of the DHT, which tells whether the swarm is ahead.
    const auto wait_until = std::chrono::steady_clock::now() + seconds_f(o.join_timeout);
    while ((optimizer.tracker().statistics().fetches == 0 ||
            optimizer.global_progress().num_peers < o.expect_peers) &&
           !stop_requested && std::chrono::steady_clock::now() < wait_until)
        std::this_thread::sleep_for(20ms);

    training_loop loop(o, model, train, params.grads(), events);
    phase_seconds phases;
    double step_seconds = 0;
    // The swarm's epoch as the newcomer found it: the state it loads is checked against
    // this, not against where the swarm got while the download ran.
    const std::uint64_t global_at_join = optimizer.global_progress().epoch;
    if (global_at_join > optimizer.local_epoch()) {
        try {
            optimizer.async_load_state_from_peers(asio::use_future).get();
        } catch (const std::system_error& e) {
            // step() tries again while the peer is behind.
            events.send(
                {{"event", "warning"}, {"message", std::string("state download: ") + e.what()}});
        }
    }
    const duration initial_load = optimizer.statistics().state_download;
    events.send({{"event", "joined"},
                 {"epoch", optimizer.local_epoch()},
                 {"global_epoch", global_at_join},
                 {"state_loaded", optimizer.statistics().state_loads > 0},
                 {"resumed_from_epoch", resumed_from ? nlohmann::ordered_json(*resumed_from)
                                                     : nlohmann::ordered_json()}});
    while (!loop.should_stop(optimizer.local_epoch())) {
        loop.forward_backward(phases);
        const auto t0 = training_loop::clock::now();
        const auto report = optimizer.step(o.batch_size);
        step_seconds += seconds_f(training_loop::clock::now() - t0).count();
        if (report.epoch_ended) {
            loop.snapshot(report.epoch, false);
            if (report.epoch % o.checkpoint_every == 0) save();
        }
        const auto progress = optimizer.global_progress();
        std::optional<double> next_round;
        if (progress.eta != time_point::max())
            next_round = std::max(0.0, seconds_of(progress.eta - wall_clock().now()));
        loop.maybe_report(optimizer.local_epoch(),
                          {{"global_epoch", progress.epoch},
                           {"peers", progress.num_peers},
                           {"next_round", next_round ? nlohmann::ordered_json(*next_round)
                                                     : nlohmann::ordered_json()}});
    }
    loop.snapshot(optimizer.local_epoch(), true);
    save();
    const auto s = optimizer.statistics();
    phases.matchmaking = seconds_of(s.waiting_for_group);
    phases.allreduce = seconds_of(s.averaging);
    phases.state_load = seconds_of(s.state_download);
    // The rest of step(): accumulating, the local optimizer step, copies into and out of the
    // averaging buffers, and the hand-offs between this thread and the peer's threads.
    phases.optimizer = std::max(0.0, step_seconds - phases.matchmaking - phases.allreduce -
                                         (phases.state_load - seconds_of(initial_load)));
    loop.done(optimizer.local_epoch(), phases, to_json(s));
    // Leaves before the peer goes: the others stop counting this peer, asking it for state
    // and grouping with it at once, not when its records expire. This thread is not the
    // peer's io thread, so blocking on the future is safe. A failed withdrawal needs no
    // report: the last peers to leave may find no replica, and their records then expire.
    try {
        optimizer.async_close(asio::use_future).get();
    } catch (const std::system_error&) {
    }
}

} // namespace detail

/// A worker process: trains as --single or as one peer, sending events on stdout. Returns the
/// exit status; errors go out as an "error" event and on stderr.
inline int run_worker(const trainer_options& o) {
    detail::worker_events events(o.rank);
    std::signal(SIGTERM, detail::request_stop);
    std::signal(SIGINT, detail::request_stop);
    prctl(PR_SET_PDEATHSIG, SIGTERM); // the launcher is gone: stop too
    try {
        at::set_num_threads(static_cast<int>(o.single ? o.threads * o.peers : o.threads));
        const image_set train = load_split(o.data, "train");
        auto model = make_model(o.model, o.seed);
        const auto params = optim::parameters_of(*model);
        if (o.single)
            detail::train_single(o, *model, train, params, events);
        else
            detail::train_in_swarm(o, *model, train, params, events);
        return 0;
    } catch (const std::exception& e) {
        events.send({{"event", "error"}, {"message", e.what()}});
        std::fprintf(stderr, "collaborative_trainer peer %zu: %s\n", o.rank, e.what());
        return 1;
    }
}

} // namespace hivemesh::examples
