// The collaborative trainer's options: one struct, its command line (CLI11) and its JSON form
// for the report. The launcher passes its own command line on to the peer processes it starts,
// with the options of the worker group added, so both parse the same way.
#pragma once

#include "program.hpp"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace hivemesh::examples {

/// The models --model names (examples/trainer/model.hpp).
inline const std::vector<std::string> model_names{"cnn", "cnn-bn", "mlp", "resnet18"};

struct trainer_options {
    // The swarm.
    std::size_t peers = 4;
    std::string listen;
    std::vector<std::string> join;
    std::string run_id = "fashion-mnist";
    bool plaintext = false;
    std::string identity;
    std::string swarm_key;
    double join_timeout = 30; ///< seconds bootstrapping may take
    // The model and its training.
    std::string model = "cnn";
    std::uint64_t batch_size = 64;
    std::uint64_t target_batch_size = 1024;
    std::string optimizer = "adam";
    double lr = 0.01;
    bool local_updates = false;
    std::uint64_t average_state_every = 1;
    std::string grad_compression = "none";
    double max_norm_ratio = 0;   ///< allreduce_options::max_norm_ratio; 0: no bound
    double matchmaking_time = 1; ///< seconds
    // When to stop: whichever comes first (0: no limit).
    std::uint64_t epochs = 100;
    std::uint64_t max_samples = 0;
    double max_time = 0; ///< seconds
    // Resources and runs.
    std::size_t threads = 1;
    std::uint64_t seed = 1;
    double churn = 0;              ///< seconds between replacements; 0: none
    std::vector<std::string> kill; ///< RANK@SECONDS: kill that peer then, no replacement
    bool single = false;
    std::string report = "report";
    std::string checkpoint; ///< directory of the peers' checkpoints; empty: none
    std::uint64_t checkpoint_every = 10;
    bool resume = false;
    std::string data = "/usr/share/datasets/fashion-mnist";
    // Set by the launcher for the processes it starts.
    bool worker = false;
    std::size_t rank = 0;
    std::size_t expect_peers = 1; ///< wait until the tracker sees this many peers
    /// The first peer of the launcher's loopback swarm, which the others bootstrap from. Not
    /// --join: that makes a multi-host peer, with the settings of the internet.
    std::string bootstrap;

    /// Multi-host mode: --listen or --join given, this process runs one peer of it.
    bool multi_host() const { return !listen.empty() || !join.empty(); }

    /// Collaborative epochs to train: --epochs, or fewer when --max-samples says so.
    std::uint64_t epoch_limit() const {
        if (max_samples == 0) return epochs;
        const std::uint64_t by_samples = (max_samples + target_batch_size - 1) / target_batch_size;
        return epochs == 0 ? by_samples : std::min(epochs, by_samples);
    }
};

namespace detail {

/// Set by SIGINT and SIGTERM: the launcher asks its peers to stop, a peer stops after its step.
inline std::atomic<bool> stop_requested{false};

extern "C" inline void request_stop(int) {
    stop_requested = true;
}

} // namespace detail

/// Declares every option on `app`, defaults shown in --help.
inline void add_trainer_options(CLI::App& app, trainer_options& o) {
    app.option_defaults()->always_capture_default();
    const auto swarm = "Swarm";
    app.add_option("--peers", o.peers,
                   "Peer processes to start on loopback; the first one is "
                   "the bootstrap peer")
        ->check(CLI::Range(std::size_t{1}, std::size_t{64}))
        ->group(swarm);
    app.add_option("--listen", o.listen,
                   "Run one peer of a multi-host swarm, listening here (e.g. "
                   "/ip4/0.0.0.0/tcp/31337)")
        ->group(swarm);
    app.add_option("--join", o.join,
                   "Run one peer of a multi-host swarm, bootstrapping from "
                   "these peers (/ip4/HOST/tcp/PORT/p2p/PEERID)")
        ->group(swarm);
    app.add_option("--run-id", o.run_id, "Names the run (peers of one run train together)")
        ->group(swarm);
    app.add_flag("--plaintext", o.plaintext,
                 "Authenticated but unencrypted connections (every peer must agree)")
        ->group(swarm);
    app.add_option("--identity", o.identity,
                   "Key file of this peer's identity (on loopback: peer 0's), loaded or created "
                   "(default: a fresh one)")
        ->group(swarm);
    app.add_option("--swarm-key", o.swarm_key,
                   "Shared secret: only peers with the same one can connect")
        ->group(swarm);
    app.add_option("--join-timeout", o.join_timeout, "Seconds bootstrapping may take")
        ->check(program::positive)
        ->group(swarm);

    const auto training = "Training";
    app.add_option("--model", o.model, "The model")
        ->check(CLI::IsMember(model_names))
        ->group(training);
    app.add_option("--batch-size", o.batch_size, "Samples per local batch")
        ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{60000}))
        ->group(training);
    app.add_option("--target-batch-size", o.target_batch_size,
                   "Samples the swarm accumulates per collaborative epoch")
        ->check(program::positive)
        ->group(training);
    app.add_option("--optimizer", o.optimizer, "The local optimizer")
        ->check(CLI::IsMember({"sgd", "adam"}))
        ->group(training);
    app.add_option("--lr", o.lr, "Learning rate")->check(program::positive)->group(training);
    app.add_flag("--local-updates", o.local_updates,
                 "A local step per batch and the parameters averaged each epoch (instead of "
                 "averaged gradients)")
        ->group(training);
    app.add_option("--average-state-every", o.average_state_every,
                   "Average parameters and optimizer state every this many epochs (0: never)")
        ->check(program::non_negative)
        ->group(training);
    app.add_option("--grad-compression", o.grad_compression, "Codec of the averaged gradients")
        ->check(CLI::IsMember({"none", "float16", "blockwise_8bit"}))
        ->group(training);
    app.add_option("--max-norm-ratio", o.max_norm_ratio,
                   "Leave out of each averaged part a peer's values whose norm exceeds this "
                   "many times the median's (0: no bound; NaN and infinity are always left out)")
        ->check(program::non_negative)
        ->check([](const std::string& text) -> std::string {
            const double ratio = std::strtod(text.c_str(), nullptr);
            return ratio == 0 || ratio >= 1 ? "" : "Value " + text + " is neither 0 nor >= 1";
        })
        ->group(training);
    app.add_option("--matchmaking-time", o.matchmaking_time,
                   "Seconds before the estimated end of an epoch that matchmaking starts")
        ->check(program::positive)
        ->group(training);

    const auto stop = "Stopping (whichever comes first; 0: no limit)";
    app.add_option("--epochs", o.epochs, "Collaborative epochs")
        ->check(program::non_negative)
        ->group(stop);
    app.add_option("--max-samples", o.max_samples,
                   "Samples the swarm trains on (rounded up to whole epochs)")
        ->check(program::non_negative)
        ->group(stop);
    app.add_option("--max-time", o.max_time, "Seconds of training")
        ->check(program::non_negative)
        ->group(stop);

    const auto run = "Run";
    app.add_option("--threads", o.threads, "Compute threads per peer")
        ->check(CLI::Range(std::size_t{1}, std::size_t{256}))
        ->group(run);
    app.add_option("--seed", o.seed, "Seeds the model's initial parameters and the batches")
        ->check(program::non_negative)
        ->group(run);
    app.add_option("--churn", o.churn,
                   "Every this many seconds, kill a random non-bootstrap peer (SIGKILL) and "
                   "start a fresh one, which loads state from the others (0: never)")
        ->check(program::non_negative)
        ->group(run);
    app.add_option("--kill", o.kill, "RANK@SECONDS: kill that peer then (SIGKILL), not replaced")
        ->group(run);
    app.add_flag("--single", o.single,
                 "The single-node baseline: one process with the same total samples and threads "
                 "(peers x threads), the same epochs, no swarm")
        ->group(run);
    app.add_option("--report", o.report,
                   "Directory of the report (report.json, metrics.csv, charts)")
        ->group(run);
    app.add_option("--data", o.data, "Directory of the Fashion-MNIST IDX files")->group(run);
    app.add_option("--checkpoint", o.checkpoint,
                   "Directory where each peer saves its whole state (peer-RANK.ckpt), every "
                   "--checkpoint-every epochs and when it stops, atomically")
        ->group(run);
    app.add_option("--checkpoint-every", o.checkpoint_every, "Epochs between checkpoints")
        ->check(program::positive)
        ->group(run);
    app.add_flag("--resume", o.resume,
                 "Each peer continues from its checkpoint in --checkpoint, if it has one")
        ->group(run);

    // The launcher's options for the processes it starts; not for users.
    app.add_flag("--worker", o.worker)->group("");
    app.add_option("--rank", o.rank)->group("");
    app.add_option("--expect-peers", o.expect_peers)->group("");
    app.add_option("--bootstrap", o.bootstrap)->group("");
}

/// The options as the report records them.
inline nlohmann::ordered_json to_json(const trainer_options& o) {
    return {{"peers", o.peers},
            {"listen", o.listen},
            {"join", o.join},
            {"run_id", o.run_id},
            {"plaintext", o.plaintext},
            {"model", o.model},
            {"batch_size", o.batch_size},
            {"target_batch_size", o.target_batch_size},
            {"optimizer", o.optimizer},
            {"lr", o.lr},
            {"local_updates", o.local_updates},
            {"average_state_every", o.average_state_every},
            {"grad_compression", o.grad_compression},
            {"max_norm_ratio", o.max_norm_ratio},
            {"matchmaking_time", o.matchmaking_time},
            {"epochs", o.epochs},
            {"max_samples", o.max_samples},
            {"max_time", o.max_time},
            {"threads", o.threads},
            {"seed", o.seed},
            {"churn", o.churn},
            {"kill", o.kill},
            {"single", o.single},
            {"checkpoint", o.checkpoint},
            {"checkpoint_every", o.checkpoint_every},
            {"resume", o.resume},
            {"data", o.data}};
}

} // namespace hivemesh::examples
