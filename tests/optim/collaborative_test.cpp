// optim::collaborative_optimizer on simulated swarms in virtual time: the contract of a
// gradient-mode epoch pinned down exactly, parameter and state averaging, the roles,
// compression, catching up and a peer alone.
#include "support/optimizers.hpp"
#include "support/sim_peers.hpp"

#include <hivemesh/net/sim.hpp>
#include <hivemesh/optim/collaborative.hpp>
#include <hivemesh/peer.hpp>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/post.hpp>
#include <asio/this_coro.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

using namespace hivemesh;
using namespace std::chrono_literals;

namespace {

using sim_optimizer = optim::collaborative_optimizer<net::sim::transport>;
using test::sim_peers;

/// Sizes of the model's two parameters.
constexpr std::size_t first_size = 700;
constexpr std::size_t second_size = 300;

/// A peer's model and its quadratic loss ½‖w − c‖², whose gradient is w − c: every element of
/// both parameters in one vector, split into the two parameters by views.
struct quadratic_model {
    /// Every peer starts from zeros, with a target of its own.
    explicit quadratic_model(std::size_t peer = 0) {
        for (std::size_t j = 0; j < target.size(); ++j)
            target[j] = static_cast<float>(peer + 1) * std::sin(0.01f * static_cast<float>(j)) +
                        0.5f * static_cast<float>(peer);
    }

    std::vector<optim::parameter> parameters() {
        return {optim::parameter{first_value, first_grad},
                optim::parameter{second_value, second_grad}};
    }

    /// The values of both parameters, in order.
    std::vector<float> values() const {
        std::vector<float> out(first_value);
        out.insert(out.end(), second_value.begin(), second_value.end());
        return out;
    }

    /// Writes w − c into the grads.
    void compute_gradient() {
        for (std::size_t j = 0; j < first_size; ++j)
            first_grad[j] = first_value[j] - target[j];
        for (std::size_t j = 0; j < second_size; ++j)
            second_grad[j] = second_value[j] - target[first_size + j];
    }

    std::vector<float> first_value = std::vector<float>(first_size, 0.0f);
    std::vector<float> first_grad = std::vector<float>(first_size, 0.0f);
    std::vector<float> second_value = std::vector<float>(second_size, 0.0f);
    std::vector<float> second_grad = std::vector<float>(second_size, 0.0f);
    std::vector<float> target = std::vector<float>(first_size + second_size);
};

/// One peer's training loop in virtual time: a batch every `interval`, until `last_epoch`.
struct trainer {
    std::unique_ptr<sim_optimizer> optimizer;
    quadratic_model model;
    duration interval{};
    std::uint64_t last_epoch = 3;
    /// Before each step, after the gradient: lets a test record what the step starts from.
    std::function<void(trainer&)> before_step;
    /// After each step.
    std::function<void(trainer&, const optim::step_report&)> after_step;

    /// Buffers, for the optimizers made with them: BatchNorm's running statistics and count.
    std::vector<float> running_stat = std::vector<float>(64, 0.0f);
    std::vector<std::int64_t> tracked = {0};

    std::vector<optim::step_report> epoch_ends;   ///< the reports of the steps that ended one
    std::vector<std::vector<float>> values_after; ///< the values after each of those
    std::uint64_t steps = 0;
    bool running = false;
};

asio::awaitable<void> train(trainer* t) {
    net::sim::timer timer(co_await asio::this_coro::executor);
    while (t->optimizer->local_epoch() < t->last_epoch) {
        timer.expires_after(t->interval);
        co_await timer.async_wait(default_token_t{});
        t->model.compute_gradient();
        if (t->before_step) t->before_step(*t);
        auto [ec, report] = co_await t->optimizer->async_step(0, default_token_t{});
        REQUIRE_FALSE(ec);
        ++t->steps;
        if (t->after_step) t->after_step(*t, report);
        if (report.epoch_ended) {
            t->epoch_ends.push_back(report);
            t->values_after.push_back(t->model.values());
        }
    }
    t->running = false;
}

struct collaborative_swarm {
    explicit collaborative_swarm(std::uint64_t seed)
        : peers(seed) {}

    trainer& add(optim::collaborative_options options, optim::local_optimizer local,
                 duration interval, bool client_mode = false, bool with_buffers = false) {
        auto& p = peers.add_peer(client_mode);
        auto& t = trainers.emplace_back();
        t.model = quadratic_model(trainers.size() - 1);
        t.interval = interval;
        optim::model_buffers buffers;
        if (with_buffers) buffers = {{t.running_stat}, {t.tracked}};
        t.optimizer = std::make_unique<sim_optimizer>(p, t.model.parameters(), std::move(local),
                                                      std::move(options), std::move(buffers));
        return t;
    }

    /// Waits until every tracker counts `count` reporting peers (so nobody starts alone).
    void wait_until_all_seen(std::size_t count) {
        REQUIRE(peers.run_until(
            [&] {
                return std::all_of(trainers.begin(), trainers.end(), [&](const trainer& t) {
                    return t.optimizer->role() == averaging::member_role::aux ||
                           t.optimizer->global_progress().num_peers == count;
                });
            },
            60s));
    }

    void start(trainer& t) {
        t.running = true;
        asio::co_spawn(peers.network.get_executor(), train(&t), asio::detached);
    }

    /// One step of `t` outside its training loop, with a fresh gradient; its report.
    std::optional<optim::step_report> one_step(trainer& t) {
        std::optional<optim::step_report> report;
        t.model.compute_gradient();
        t.optimizer->async_step(0, [&](std::error_code ec, optim::step_report r) {
            CHECK_FALSE(ec);
            report = r;
        });
        REQUIRE(peers.run_until([&] { return report.has_value(); }, 60s));
        return report;
    }

    /// Starts every trainer and runs until all stop (REQUIREd within `max`).
    void run(duration max = 600s) {
        for (auto& t : trainers)
            start(t);
        REQUIRE(peers.run_until(
            [&] {
                return std::none_of(trainers.begin(), trainers.end(),
                                    [](const trainer& t) { return t.running; });
            },
            max));
    }

    /// Closes every optimizer and lets the withdrawals go out, before the peers go.
    ~collaborative_swarm() {
        for (auto& t : trainers)
            if (t.optimizer) t.optimizer->close();
        peers.run_for(1s);
        for (auto& t : trainers)
            t.optimizer.reset();
    }

    sim_peers peers;
    std::deque<trainer> trainers;
};

optim::collaborative_options run_options(std::uint64_t target, std::size_t group) {
    optim::collaborative_options o;
    o.run_id = "run";
    o.target_batch_size = target;
    o.batch_size_per_step = 32;
    o.matchmaking_time = 3s;
    o.averaging_timeout = 10s;
    o.averaging.target_group_size = group;
    return o;
}

optim::local_optimizer plain_sgd(double lr) {
    optim::sgd_options o;
    o.lr = lr;
    return optim::sgd(o);
}

/// The largest |a − b| over two vectors of one size.
double max_difference(const std::vector<float>& a, const std::vector<double>& b) {
    REQUIRE(a.size() == b.size());
    double worst = 0;
    for (std::size_t j = 0; j < a.size(); ++j)
        worst = std::max(worst, std::abs(static_cast<double>(a[j]) - b[j]));
    return worst;
}

/// What one training peer of an exactness run did: its target, and the reports of the steps
/// that ended an epoch with its values after each.
struct epoch_trace {
    const std::vector<float>* target;
    const std::vector<optim::step_report>* ends;
    const std::vector<std::vector<float>>* values_after;
};

/// The contract of a gradient-mode epoch over `epochs` epochs: after epoch e every peer's values
/// are w − lr·(w − Σ s_p c_p / Σ s_p) (from w = 0), s_p being the samples each contributed, to
/// `tolerance`, and identical on every peer (lossy codecs too: everyone applies what the
/// reducers sent, bit for bit); every round averaged. Returns the samples of all epochs.
std::uint64_t check_contract(const std::vector<epoch_trace>& peers, double lr, std::size_t epochs,
                             double tolerance) {
    std::vector<double> w(first_size + second_size, 0.0);
    std::uint64_t total = 0;
    for (std::size_t e = 0; e < epochs; ++e) {
        INFO("epoch " << e);
        std::vector<double> weighted(w.size(), 0.0);
        double samples = 0;
        for (const auto& peer : peers) {
            REQUIRE(peer.ends->size() == epochs);
            const auto& r = (*peer.ends)[e];
            CHECK(r.averaging.outcome == optim::round_outcome::averaged);
            const auto s = static_cast<double>(r.samples_contributed);
            samples += s;
            total += r.samples_contributed;
            for (std::size_t j = 0; j < w.size(); ++j)
                weighted[j] += s * static_cast<double>((*peer.target)[j]);
        }
        for (std::size_t j = 0; j < w.size(); ++j)
            w[j] -= lr * (w[j] - weighted[j] / samples);
        for (const auto& peer : peers) {
            CHECK(max_difference((*peer.values_after)[e], w) <= tolerance);
            CHECK((*peer.values_after)[e] == (*peers.front().values_after)[e]);
        }
    }
    return total;
}

/// A gradient-mode swarm for the exactness contract.
struct gradient_run {
    std::size_t nodes = 2;
    std::size_t clients = 0; ///< peers in client mode, after the nodes
    std::size_t aux = 0;     ///< aux peers, after the clients
    compression::kind codec = compression::kind::none;
    double tolerance = 1e-5; ///< to the oracle
    std::uint64_t seed = 21;
};

/// The contract of a gradient-mode epoch (issue 19 §5) on peers of uneven speed: after each of
/// 3 epochs every training peer's values are w − lr·(w − Σ s_p c_p / Σ s_p), where s_p are the
/// samples each contributed; every peer ends at epoch 3, and the swarm's samples overshoot the
/// target by less than a fifth.
void check_exact_epochs(const gradient_run& run) {
    constexpr std::uint64_t target = 1024;
    constexpr double lr = 0.5;
    const std::vector<duration> intervals{100ms, 170ms, 230ms, 310ms, 130ms};
    const std::size_t training = run.nodes + run.clients;
    const std::size_t total_peers = training + run.aux;
    collaborative_swarm swarm(run.seed);
    for (std::size_t p = 0; p < total_peers; ++p) {
        auto options = run_options(target, total_peers);
        options.grad_compression = run.codec;
        if (p >= training) options.role = averaging::member_role::aux;
        swarm.add(options, plain_sgd(lr), intervals[p % intervals.size()],
                  p >= run.nodes && p < training);
    }
    swarm.wait_until_all_seen(training);
    swarm.run();

    std::vector<epoch_trace> traces;
    for (std::size_t p = 0; p < training; ++p) {
        const auto& t = swarm.trainers[p];
        traces.push_back({&t.model.target, &t.epoch_ends, &t.values_after});
    }
    const std::uint64_t total = check_contract(traces, lr, 3, run.tolerance);
    for (const auto& t : swarm.trainers) {
        REQUIRE(t.epoch_ends.size() == 3);
        for (const auto& r : t.epoch_ends)
            CHECK(r.averaging.group_size == total_peers);
    }
    for (std::size_t p = training; p < total_peers; ++p)
        for (const auto& r : swarm.trainers[p].epoch_ends) {
            CHECK(r.averaging.outcome == optim::round_outcome::averaged);
            CHECK(r.samples_contributed == 0);
        }
    INFO("samples over 3 epochs: " << total);
    CHECK(total >= 3 * target);
    CHECK(total <= 3 * target * 6 / 5);
    swarm.peers.run_for(2s); // the last records reach everyone
    for (std::size_t p = 0; p < total_peers; ++p) {
        const auto& t = swarm.trainers[p];
        CHECK(t.optimizer->local_epoch() == 3);
        CHECK(t.optimizer->global_progress().epoch == 3);
        const auto stats = t.optimizer->statistics();
        CHECK(stats.epochs == 3);
        CHECK(stats.rounds_averaged == 6); // gradients, then the state, each epoch
        CHECK(stats.rounds_failed + stats.rounds_partial + stats.rounds_alone == 0);
        CHECK(stats.samples == (p < training ? t.steps * 32 : 0));
        CHECK(stats.samples_discarded == 0);
        CHECK(stats.bytes_sent > 0);
    }
    // An aux peer trains nothing: its values are where they started.
    for (std::size_t p = training; p < total_peers; ++p)
        CHECK(swarm.trainers[p].model.values() ==
              std::vector<float>(first_size + second_size, 0.0f));
}

/// The subkey of `peer`'s records: its owner marker.
byte_buffer marker_of(test::sim_peer& peer) {
    return to_buffer(as_bytes(dht::owner_marker(peer.rpc().identity().public_key())));
}

/// How many peers other than `owner` hold a live record of `owner` under `key` (a value
/// that has not expired and is not a tombstone).
std::size_t live_held(sim_peers& peers, std::size_t owner, const std::string& key) {
    const byte_buffer subkey = marker_of(peers.peers[owner]);
    std::size_t holders = 0;
    for (std::size_t i = 0; i < peers.peers.size(); ++i) {
        if (i == owner) continue;
        const auto entry =
            peers.peers[i].dht().local_storage().get(dht::id::of_key(key), peers.now());
        if (!entry) continue;
        const auto it = entry->dictionary.find(subkey);
        if (it != entry->dictionary.end() && !it->second.value.empty()) ++holders;
    }
    return holders;
}

/// What peer `reader` finds under `key` for `owner`'s marker with a DHT read (latest values):
/// nullopt when nothing is there.
std::optional<dht::stored_value> read_record(sim_peers& peers, std::size_t reader,
                                             std::size_t owner, const std::string& key) {
    dht::get_options options;
    options.latest = true;
    std::optional<std::error_code> done;
    dht::key_entry entry;
    peers.peers[reader].dht().async_get(as_bytes(key), options,
                                        [&](std::error_code ec, dht::key_entry got) {
                                            done = ec;
                                            entry = std::move(got);
                                        });
    REQUIRE(peers.run_until([&] { return done.has_value(); }, 60s));
    if (*done == errc::not_found) return std::nullopt;
    REQUIRE_FALSE(*done);
    const auto it = entry.dictionary.find(marker_of(peers.peers[owner]));
    if (it == entry.dictionary.end()) return std::nullopt;
    return it->second;
}

/// The DHT keys of run "run" under which a peer leaves records: progress, donors, and the
/// matchmaking declarations of the gradient and state rounds.
std::vector<std::string> run_keys() {
    return {progress::progress_key("run"), averaging::donors_key("run"),
            averaging::group_key("run_grads", averaging::group_bits()),
            averaging::group_key("run", averaging::group_bits())};
}

/// Checks that no peer but `owner` holds a live record of it under `keys`, and that peer
/// `reader` reads none there (a tombstone, or nothing).
void check_withdrawn(sim_peers& peers, std::size_t owner, std::size_t reader,
                     const std::vector<std::string>& keys) {
    for (const auto& key : keys) {
        INFO("key " << key);
        CHECK(live_held(peers, owner, key) == 0);
    }
    for (const auto& key : keys) {
        INFO("key " << key);
        const auto found = read_record(peers, reader, owner, key);
        CHECK((!found || found->value.empty()));
    }
}

} // namespace

TEST_CASE("two peers of uneven speed end every epoch with the samples-weighted gradient",
          "[optim][collaborative][sim]") {
    check_exact_epochs({.nodes = 2, .seed = 21});
}

TEST_CASE("four peers of uneven speed end every epoch with the samples-weighted gradient",
          "[optim][collaborative][sim]") {
    check_exact_epochs({.nodes = 4, .seed = 22});
}

TEST_CASE("a client's samples count like a node's, and an aux peer only helps reduce",
          "[optim][collaborative][sim]") {
    check_exact_epochs({.nodes = 2, .clients = 1, .aux = 1, .seed = 23});
}

TEST_CASE("compressed gradients give every peer the same values, near the exact ones",
          "[optim][collaborative][sim]") {
    SECTION("float16") {
        check_exact_epochs(
            {.nodes = 3, .codec = compression::kind::float16, .tolerance = 1e-2, .seed = 24});
    }
    SECTION("blockwise 8-bit") {
        check_exact_epochs(
            {.nodes = 3, .codec = compression::kind::blockwise_8bit, .tolerance = 0.1, .seed = 25});
    }
}

TEST_CASE("with the norm bound, a peer sending 1e30-scaled gradients is left out of every mean "
          "and every peer counts it",
          "[optim][collaborative][sim][hostile]") {
    constexpr double lr = 0.5;
    constexpr std::size_t honest = 3;
    collaborative_swarm swarm(26);
    for (const auto interval : {100ms, 170ms, 230ms, 130ms}) {
        auto options = run_options(1024, honest + 1);
        options.averaging.allreduce.max_norm_ratio = 100;
        swarm.add(options, plain_sgd(lr), interval);
    }
    // Finite, so the peer's own check passes; its norm is ~1e31 against honest ones of ~10.
    swarm.trainers[honest].before_step = [](trainer& t) {
        for (auto* grad : {&t.model.first_grad, &t.model.second_grad})
            for (float& g : *grad)
                g *= 1e30f;
    };
    swarm.wait_until_all_seen(honest + 1);
    swarm.run();

    // The honest peers' epochs follow the contract over their own samples alone.
    std::vector<epoch_trace> traces;
    for (std::size_t p = 0; p < honest; ++p) {
        const auto& t = swarm.trainers[p];
        traces.push_back({&t.model.target, &t.epoch_ends, &t.values_after});
    }
    check_contract(traces, lr, 3, 1e-5);
    const auto& hostile = swarm.trainers[honest];
    REQUIRE(hostile.values_after.size() == 3);
    // It left itself out of its own span's mean too, so it holds what everyone holds.
    CHECK(hostile.values_after == swarm.trainers[0].values_after);
    for (const auto& t : swarm.trainers) {
        for (const auto& r : t.epoch_ends) {
            CHECK(r.averaging.group_size == honest + 1);
            CHECK(r.averaging.members_excluded == 1);
            CHECK(r.averaging.parts_refused == 0);
            CHECK(r.state_averaging.members_excluded == 0);
        }
        const auto stats = t.optimizer->statistics();
        CHECK(stats.members_excluded == 3); // the gradient rounds; the state rounds agree
        CHECK(stats.parts_refused == 0);
        CHECK(stats.rounds_averaged == 6);
    }
}

TEST_CASE("a peer alone applies its own gradient every epoch at the rate of its schedule, and "
          "says it was alone",
          "[optim][collaborative][sim]") {
    collaborative_swarm swarm(26);
    auto options = run_options(256, 4);
    std::vector<std::uint64_t> scheduled;
    options.learning_rate_schedule = [&](std::uint64_t epoch) {
        scheduled.push_back(epoch);
        return 0.5 / static_cast<double>(epoch + 1);
    };
    auto& t = swarm.add(options, plain_sgd(1.0), 100ms);
    swarm.run();
    std::vector<double> w(first_size + second_size, 0.0);
    REQUIRE(t.epoch_ends.size() == 3);
    for (std::size_t e = 0; e < 3; ++e) {
        const auto& r = t.epoch_ends[e];
        CHECK(r.averaging.outcome == optim::round_outcome::alone);
        CHECK(r.state_averaging.outcome == optim::round_outcome::alone);
        CHECK(r.samples_contributed == 256);
        const double lr = 0.5 / static_cast<double>(e + 1);
        for (std::size_t j = 0; j < w.size(); ++j)
            w[j] -= lr * (w[j] - static_cast<double>(t.model.target[j]));
        CHECK(max_difference(t.values_after[e], w) <= 1e-5);
    }
    // Once at construction, then once per epoch.
    CHECK(scheduled == std::vector<std::uint64_t>{0, 1, 2, 3});
    CHECK(t.optimizer->optimizer().learning_rate() == 0.125);
    const auto stats = t.optimizer->statistics();
    CHECK(stats.rounds_alone == 6);
    CHECK(stats.rounds_averaged + stats.rounds_failed + stats.rounds_partial == 0);
    CHECK(stats.waiting_for_group == duration::zero()); // nothing was scheduled
}

TEST_CASE("local updates: a step per batch, and each epoch the parameters and Adam's moments "
          "(or those average_opt_statistics names) become their mean",
          "[optim][collaborative][sim]") {
    // All of Adam's state, or its second moment only (the first stays each peer's own).
    const bool second_moment_only = GENERATE(false, true);
    INFO("average_opt_statistics: " << (second_moment_only ? "exp_avg_sq" : "all"));
    constexpr std::size_t peers = 3;
    optim::adam_options adam;
    adam.lr = 0.05;
    collaborative_swarm swarm(27);
    const std::vector<duration> intervals{100ms, 170ms, 230ms};
    for (std::size_t p = 0; p < peers; ++p) {
        auto o = run_options(512, peers);
        o.use_local_updates = true;
        if (second_moment_only) o.average_opt_statistics = std::vector<std::string>{"exp_avg_sq"};
        swarm.add(o, optim::adam(adam), intervals[p]).last_epoch = 2;
    }
    /// Values and Adam state, each as one vector.
    struct snapshot {
        std::vector<float> values;
        std::vector<std::vector<float>> state;
    };
    const auto state_of = [](std::vector<tensor::tensor_ref> tensors) {
        std::vector<std::vector<float>> out;
        for (const auto& t : tensors) {
            auto& v = out.emplace_back(t.size());
            t.copy_to(v);
        }
        return out;
    };
    // Before each step, the same Adam step on copies: what the peer holds before the round.
    std::vector<snapshot> before_round(peers);
    std::vector<std::vector<snapshot>> at_epoch_end(peers), after_epoch_end(peers);
    for (std::size_t p = 0; p < peers; ++p) {
        auto& t = swarm.trainers[p];
        t.before_step = [&, p](trainer& t) {
            quadratic_model copy = t.model;
            const auto params = copy.parameters();
            auto shadow = optim::adam(adam);
            auto& real = t.optimizer->optimizer();
            const auto real_state = real.state_tensors(t.optimizer->parameters());
            const auto shadow_state = shadow.state_tensors(params);
            for (std::size_t k = 0; k < real_state.size(); ++k)
                shadow_state[k].copy_from(state_of({real_state[k]}).front());
            shadow.set_step_count(real.step_count());
            shadow.step(params);
            before_round[p] = {copy.values(), state_of(shadow_state)};
        };
        t.after_step = [&, p](trainer& t, const optim::step_report& r) {
            if (!r.epoch_ended) return;
            CHECK(r.state_averaging.outcome == optim::round_outcome::averaged);
            at_epoch_end[p].push_back(before_round[p]);
            after_epoch_end[p].push_back(
                {t.model.values(),
                 state_of(t.optimizer->optimizer().state_tensors(t.optimizer->parameters()))});
        };
    }
    swarm.wait_until_all_seen(peers);
    swarm.run();
    for (std::size_t e = 0; e < 2; ++e) {
        INFO("epoch " << e);
        const auto mean_of = [&](auto pick) {
            const std::vector<float>& first = pick(at_epoch_end[0][e]);
            std::vector<double> mean(first.size(), 0.0);
            for (std::size_t p = 0; p < peers; ++p) {
                REQUIRE(at_epoch_end[p].size() == 2);
                const std::vector<float>& v = pick(at_epoch_end[p][e]);
                for (std::size_t j = 0; j < v.size(); ++j)
                    mean[j] += static_cast<double>(v[j]) / peers;
            }
            return mean;
        };
        const auto values = mean_of([](const snapshot& s) -> const auto& { return s.values; });
        for (std::size_t p = 0; p < peers; ++p)
            CHECK(max_difference(after_epoch_end[p][e].values, values) <= 1e-5);
        const std::size_t tensors = at_epoch_end[0][e].state.size();
        CHECK(tensors == 4); // exp_avg and exp_avg_sq of both parameters
        for (std::size_t k = 0; k < tensors; ++k) {
            INFO("state tensor " << k);
            const auto state =
                mean_of([k](const snapshot& s) -> const auto& { return s.state[k]; });
            for (std::size_t p = 0; p < peers; ++p) {
                if (second_moment_only && k % 2 == 0) { // exp_avg: the peer's own
                    CHECK(after_epoch_end[p][e].state[k] == at_epoch_end[p][e].state[k]);
                    CHECK(max_difference(after_epoch_end[p][e].state[k], state) > 1e-3);
                } else {
                    CHECK(max_difference(after_epoch_end[p][e].state[k], state) <= 1e-5);
                }
            }
        }
    }
    for (const auto& t : swarm.trainers)
        CHECK(t.optimizer->statistics().optimizer_step >= duration::zero());
}

TEST_CASE("buffers: each state round averages the float buffers exactly and leaves the integer "
          "ones, and a newcomer downloads both from its donor",
          "[optim][collaborative][sim]") {
    constexpr std::size_t peers = 4;
    collaborative_swarm swarm(33);
    const std::vector<duration> intervals{100ms, 170ms, 230ms, 130ms};
    // What each peer's buffers held going into the round of each epoch.
    std::vector<std::vector<std::vector<float>>> before_round(peers);
    for (std::size_t p = 0; p < peers; ++p) {
        auto& t = swarm.add(run_options(1024, peers), plain_sgd(0.5), intervals[p], false, true);
        t.last_epoch = 2;
        // As a forward pass in training mode updates BatchNorm's statistics: values that are
        // multiples of 1/8, so that the mean of four is exact in float32.
        t.before_step = [p](trainer& t) {
            for (std::size_t j = 0; j < t.running_stat.size(); ++j)
                t.running_stat[j] = static_cast<float>((p + 1) * (j + t.steps)) / 8.0f - 3.0f;
            t.tracked[0] = static_cast<std::int64_t>(1000 * p + t.steps);
        };
        t.after_step = [p, &before_round](trainer& t, const optim::step_report& r) {
            if (!r.epoch_ended) return;
            CHECK(r.state_averaging.outcome == optim::round_outcome::averaged);
            // before_step ran just before this step, with the step count before it.
            std::vector<float> held(t.running_stat.size());
            for (std::size_t j = 0; j < held.size(); ++j)
                held[j] = static_cast<float>((p + 1) * (j + t.steps - 1)) / 8.0f - 3.0f;
            before_round[p].push_back(held);
            CHECK(t.tracked[0] == static_cast<std::int64_t>(1000 * p + t.steps - 1));
        };
    }
    std::vector<std::vector<std::vector<float>>> after_round(peers);
    for (std::size_t p = 0; p < peers; ++p) {
        auto previous = std::move(swarm.trainers[p].after_step);
        swarm.trainers[p].after_step = [p, previous, &after_round](trainer& t,
                                                                   const optim::step_report& r) {
            previous(t, r);
            if (r.epoch_ended) after_round[p].push_back(t.running_stat);
        };
    }
    swarm.wait_until_all_seen(peers);
    swarm.run();
    for (std::size_t e = 0; e < 2; ++e) {
        INFO("epoch " << e);
        std::vector<float> mean(64, 0.0f);
        for (std::size_t p = 0; p < peers; ++p) {
            REQUIRE(before_round[p].size() == 2);
            for (std::size_t j = 0; j < mean.size(); ++j)
                mean[j] += before_round[p][e][j] / peers;
        }
        for (std::size_t p = 0; p < peers; ++p)
            CHECK(after_round[p][e] == mean);
    }

    // A newcomer (no buffers trained) takes its donor's, integers too.
    auto& late = swarm.add(run_options(1024, peers + 1), plain_sgd(0.5), 150ms, false, true);
    late.running_stat.assign(64, 99.0f);
    late.tracked[0] = -5;
    const auto first = swarm.one_step(late);
    REQUIRE(first->state_loaded);
    REQUIRE_FALSE(first->state_error);
    CHECK(late.running_stat == after_round[0][1]);
    const auto donor = std::find_if(swarm.trainers.begin(), swarm.trainers.end() - 1,
                                    [&](const trainer& t) { return t.tracked == late.tracked; });
    CHECK(donor != swarm.trainers.end() - 1);
    CHECK(late.model.values() == swarm.trainers[0].model.values());
    CHECK(late.optimizer->statistics().state_bytes_downloaded ==
          (first_size + second_size + 64) * sizeof(float));
}

TEST_CASE("a late joiner loads the state and trains on at the global epoch",
          "[optim][collaborative][sim]") {
    collaborative_swarm swarm(28);
    for (const auto interval : {100ms, 170ms})
        swarm.add(run_options(1024, 3), plain_sgd(0.5), interval).last_epoch = 2;
    swarm.wait_until_all_seen(2);
    swarm.run();
    REQUIRE(swarm.trainers[0].optimizer->local_epoch() == 2);

    auto& late = swarm.add(run_options(1024, 3), plain_sgd(0.5), 150ms);
    // Its first step finds the swarm ahead: the batch is dropped and the state downloaded.
    const auto first = swarm.one_step(late);
    CHECK(first->state_loaded);
    CHECK_FALSE(first->state_error);
    CHECK(first->epoch == 2);
    CHECK(first->samples == 0);
    CHECK(late.optimizer->local_epoch() == 2);
    CHECK(late.model.values() == swarm.trainers[0].model.values());
    const auto stats = late.optimizer->statistics();
    CHECK(stats.state_loads == 1);
    CHECK(stats.samples_discarded == 32);
    CHECK(stats.state_bytes_downloaded == (first_size + second_size) * sizeof(float));

    // Then the three train the next epoch together.
    for (auto& t : swarm.trainers)
        t.last_epoch = 3;
    swarm.wait_until_all_seen(3);
    swarm.run();
    REQUIRE(late.epoch_ends.size() == 1);
    CHECK(late.epoch_ends[0].averaging.outcome == optim::round_outcome::averaged);
    CHECK(late.epoch_ends[0].averaging.group_size == 3);
    for (const auto& t : swarm.trainers) {
        CHECK(t.optimizer->local_epoch() == 3);
        CHECK(t.model.values() == late.model.values());
    }
}

TEST_CASE("a peer killed mid-epoch does not stop the others, who stop waiting for it once its "
          "record is two epochs behind",
          "[optim][collaborative][sim]") {
    collaborative_swarm swarm(29);
    for (const auto interval : {100ms, 170ms, 230ms})
        swarm.add(run_options(1024, 3), plain_sgd(0.5), interval).last_epoch = 5;
    auto& doomed = swarm.trainers[2];
    const auto node = swarm.peers.nodes[2];
    doomed.after_step = [&](trainer& t, const optim::step_report& r) {
        if (r.epoch == 1 && r.samples >= 96) {
            swarm.peers.network.crash(node);
            t.last_epoch = 0; // its loop ends here
        }
    };
    // Each survivor's time waiting for a group, after each epoch it ended.
    std::vector<std::vector<duration>> waited(2);
    for (std::size_t p = 0; p < 2; ++p)
        swarm.trainers[p].after_step = [&waited, p](trainer& t, const optim::step_report& r) {
            if (r.epoch_ended) waited[p].push_back(t.optimizer->statistics().waiting_for_group);
        };
    swarm.wait_until_all_seen(3);
    swarm.run(600s);
    CHECK(doomed.optimizer->local_epoch() == 1);
    const auto& a = swarm.trainers[0];
    const auto& b = swarm.trainers[1];
    CHECK(a.optimizer->local_epoch() == 5);
    CHECK(b.optimizer->local_epoch() == 5);
    // Once the dead peer is out of the groups, the survivors average with each other.
    REQUIRE(a.epoch_ends.size() == 5);
    for (std::size_t e = 2; e < 5; ++e) {
        INFO("epoch " << e);
        CHECK(a.epoch_ends[e].averaging.outcome == optim::round_outcome::averaged);
        CHECK(a.epoch_ends[e].averaging.group_size == 2);
    }
    CHECK(a.model.values() == b.model.values());
    // Its record lives on (record_expiration, 60 s), at epoch 1. Up to epoch 2 the survivors
    // count it and their rounds wait for their windows to end (matchmaking_time, 3 s); from
    // epoch 3 on it is more than an epoch behind and not expected, so the rounds form once
    // both survivors ended the epoch. Each of those epochs still holds the target's samples.
    for (std::size_t p = 0; p < 2; ++p) {
        INFO("peer " << p);
        REQUIRE(waited[p].size() == 5);
        for (std::size_t e = 3; e < 5; ++e) {
            INFO("epoch " << e);
            CHECK(waited[p][e] - waited[p][e - 1] < 500ms);
        }
    }
    for (std::size_t e = 3; e < 5; ++e) {
        INFO("epoch " << e);
        CHECK(a.epoch_ends[e].samples_contributed + b.epoch_ends[e].samples_contributed >= 1024);
    }
}

TEST_CASE("after a partition heals, the half an epoch behind forms its round without waiting "
          "for the half ahead",
          "[optim][collaborative][sim]") {
    // A and B are slow (32 samples a step, every 2 s each), C and D fast. Cut off from A and B,
    // C and D end epoch 0 in a group of two when their window ends (they still count A and
    // B, whose records are at epoch 0) and stop at epoch 1. After the heal, A and B learn
    // that the swarm is at epoch 1 and end epoch 0 at once; C and D, at epoch 1, have had
    // their round of epoch 0, so A and B expect only each other.
    collaborative_swarm swarm(33);
    // The DHT's upkeep brings the halves' routing tables together again after the heal.
    swarm.peers.dht_options.maintenance_period = dht::node_options{}.maintenance_period;
    auto options = run_options(1024, 4);
    options.matchmaking_time = 20s;
    options.tracking.max_refresh = 1s; // the heal is seen within a second
    for (const auto interval : {2000ms, 2000ms, 50ms, 50ms})
        swarm.add(options, plain_sgd(0.5), interval).last_epoch = 1;
    swarm.wait_until_all_seen(4);
    swarm.peers.network.partition({swarm.peers.nodes[2], swarm.peers.nodes[3]});
    for (auto& t : swarm.trainers)
        swarm.start(t);
    auto& fast = swarm.trainers[2];
    REQUIRE(
        swarm.peers.run_until([&] { return !fast.running && !swarm.trainers[3].running; }, 60s));
    REQUIRE(fast.epoch_ends.size() == 1);
    CHECK(fast.epoch_ends[0].averaging.outcome == optim::round_outcome::averaged);
    CHECK(fast.epoch_ends[0].averaging.group_size == 2);
    CHECK(swarm.trainers[0].optimizer->local_epoch() == 0); // still short of the target
    swarm.peers.network.heal();
    REQUIRE(swarm.peers.run_until(
        [&] { return !swarm.trainers[0].running && !swarm.trainers[1].running; }, 60s));
    for (std::size_t p = 0; p < 2; ++p) {
        INFO("peer " << p);
        const auto& t = swarm.trainers[p];
        REQUIRE(t.epoch_ends.size() == 1);
        CHECK(t.epoch_ends[0].averaging.outcome == optim::round_outcome::averaged);
        CHECK(t.epoch_ends[0].averaging.group_size == 2);
        CHECK(t.epoch_ends[0].samples_contributed < 1024 / 2);
        // Both rounds' groups were complete once the second peer ended the epoch (within a
        // read of the DHT and a step, 3 s, of the first), not at the end of their windows.
        CHECK(t.optimizer->statistics().waiting_for_group < 4s);
    }
    CHECK(swarm.trainers[0].model.values() == swarm.trainers[1].model.values());
}

TEST_CASE("a peer that leaves with async_close has withdrawn its progress and donor records "
          "when it completes, and a second call completes at once",
          "[optim][collaborative][sim][leave]") {
    collaborative_swarm swarm(31);
    for (const auto interval : {100ms, 170ms, 230ms, 130ms})
        swarm.add(run_options(1024, 4), plain_sgd(0.5), interval).last_epoch = 2;
    swarm.wait_until_all_seen(4);
    swarm.run();
    auto& peers = swarm.peers;
    constexpr std::size_t leaver = 3;
    const auto keys = run_keys();
    // It trained and serves: the three others hold its progress and donor records.
    REQUIRE(swarm.trainers[leaver].optimizer->local_epoch() == 2);
    CHECK(live_held(peers, leaver, keys[0]) == 3);
    CHECK(live_held(peers, leaver, keys[1]) == 3);

    auto& optimizer = *swarm.trainers[leaver].optimizer;
    std::optional<std::error_code> closed;
    std::optional<std::error_code> again;
    const time_point start = peers.now();
    optimizer.async_close([&](std::error_code ec) { closed = ec; });
    optimizer.async_close([&](std::error_code ec) { again = ec; });
    // The second completes at once, while the first still waits for its stores.
    REQUIRE(peers.run_until([&] { return again.has_value(); }, 60s));
    CHECK_FALSE(*again);
    CHECK(peers.now() == start);
    CHECK_FALSE(closed.has_value());
    REQUIRE(peers.run_until([&] { return closed.has_value(); }, 60s));
    CHECK_FALSE(*closed);
    CHECK(peers.now() > start);
    // At that instant no replica holds a live record of it, and another peer reads none.
    check_withdrawn(peers, leaver, 0, keys);
}

namespace {

/// Four nodes (and an aux peer, with `aux_leaves`) train; the last peer, once its round
/// scheduled ahead has declared it (stored on the others), stops training and leaves with
/// async_close. When that completes, its declaration and records are withdrawn. An aux peer
/// has no progress or donor record: only the withdrawal of its declarations is waited for.
void check_leaving_mid_matchmaking(bool aux_leaves, std::uint64_t seed) {
    collaborative_swarm swarm(seed);
    for (const auto interval : {100ms, 170ms, 230ms, 130ms})
        swarm.add(run_options(1024, 5), plain_sgd(0.5), interval);
    if (aux_leaves) {
        auto options = run_options(1024, 5);
        options.role = averaging::member_role::aux;
        swarm.add(options, plain_sgd(0.5), 100ms);
    }
    auto& peers = swarm.peers;
    const std::size_t leaver = swarm.trainers.size() - 1;
    const std::size_t others = leaver;
    const auto keys = run_keys();
    const std::string& declarations = keys[2]; // the gradient rounds'
    std::optional<std::error_code> closed;
    std::size_t declared_when_closing = 0;
    std::uint64_t epoch_when_closing = 0;
    swarm.trainers[leaver].after_step = [&](trainer& t, const optim::step_report& r) {
        if (t.last_epoch == 0) return;
        declared_when_closing = live_held(peers, leaver, declarations);
        if (declared_when_closing == 0) return;
        epoch_when_closing = r.epoch;
        t.last_epoch = 0; // its loop ends here
        t.optimizer->async_close([&](std::error_code ec) { closed = ec; });
    };
    swarm.wait_until_all_seen(4);
    for (auto& t : swarm.trainers)
        swarm.start(t);
    REQUIRE(peers.run_until([&] { return closed.has_value(); }, 600s));
    CHECK_FALSE(*closed);
    CHECK(declared_when_closing == others);
    CHECK(epoch_when_closing == 0);
    check_withdrawn(peers, leaver, 0, keys);

    // The others stop after their current step.
    for (auto& t : swarm.trainers)
        t.last_epoch = 0;
    REQUIRE(peers.run_until(
        [&] {
            return std::none_of(swarm.trainers.begin(), swarm.trainers.end(),
                                [](const trainer& t) { return t.running; });
        },
        600s));
}

} // namespace

TEST_CASE("a peer that leaves with async_close while its round looks for a group has "
          "withdrawn its declaration and records when it completes",
          "[optim][collaborative][sim][leave]") {
    check_leaving_mid_matchmaking(false, 32);
}

TEST_CASE("an aux peer that leaves with async_close while its round looks for a group has "
          "withdrawn its declaration when it completes",
          "[optim][collaborative][sim][leave]") {
    check_leaving_mid_matchmaking(true, 34);
}

TEST_CASE("async_close of an optimizer that never published completes with success",
          "[optim][collaborative][sim][leave]") {
    sim_peers peers(33);
    auto& first = peers.add_peer();
    auto& second = peers.add_peer();
    quadratic_model model;
    const auto keys = run_keys();

    // An aux peer publishes no progress record and serves nothing: nothing to wait for.
    auto aux_options = run_options(256, 2);
    aux_options.role = averaging::member_role::aux;
    sim_optimizer aux(first, model.parameters(), plain_sgd(0.1), aux_options);
    std::optional<std::error_code> aux_closed;
    const time_point start = peers.now();
    aux.async_close([&](std::error_code ec) { aux_closed = ec; });
    REQUIRE(peers.run_until([&] { return aux_closed.has_value(); }, 10s));
    CHECK_FALSE(*aux_closed);
    CHECK(peers.now() == start);

    // A node closed before its first record went out: success, and nothing of it stays live.
    quadratic_model other_model(1);
    sim_optimizer node(second, other_model.parameters(), plain_sgd(0.1), run_options(256, 2));
    std::optional<std::error_code> node_closed;
    node.async_close([&](std::error_code ec) { node_closed = ec; });
    REQUIRE(peers.run_until([&] { return node_closed.has_value(); }, 60s));
    CHECK_FALSE(*node_closed);
    check_withdrawn(peers, 1, 0, keys);
    peers.run_for(5s);
    for (const auto& key : keys)
        CHECK(live_held(peers, 1, key) == 0);
}

TEST_CASE("short epochs with the default options: each epoch's group is ready when the epoch "
          "ends, and the epoch ends as the swarm reaches the target",
          "[optim][collaborative][sim]") {
    // Four peers, 32 samples a step every 25, 30, 35 and 40 ms: 4,060 samples/s together, so a
    // target of 4096 makes epochs of about a second, and one of 1024 epochs shorter than the
    // trackers' least time between reads (min_refresh, 0.5 s). Everything else is the
    // default: groups of up to 16 (more than the swarm), matchmaking_time 15 s, a state round
    // after each gradient round. Before the groups formed once every peer the tracker counts
    // was in, each round waited for its leader's window to end (14 s an epoch here); before
    // the records of the epoch before counted from this peer's start of the epoch, a peer
    // that had not yet read the others' new records ended its epoch only when its own samples
    // reached the target (1280 to 1664 samples for 1024).
    constexpr std::uint64_t batch = 32;
    constexpr std::uint64_t epochs = 8;
    const std::uint64_t target = GENERATE(std::uint64_t{1024}, std::uint64_t{4096});
    INFO("target " << target);
    collaborative_swarm swarm(32);
    const std::vector<duration> intervals{25ms, 30ms, 35ms, 40ms};
    for (const auto interval : intervals) {
        optim::collaborative_options o;
        o.run_id = "run";
        o.target_batch_size = target;
        o.batch_size_per_step = batch;
        swarm.add(o, plain_sgd(0.5), interval).last_epoch = epochs;
    }
    // Per peer and epoch: when its steps started with the samples it had in the epoch then,
    // and its waiting for the group in the epoch's rounds.
    struct sample_point {
        time_point at;
        std::size_t peer;
        std::uint64_t samples;
    };
    std::vector<std::vector<sample_point>> points(epochs);
    std::vector<std::vector<duration>> waits(swarm.trainers.size());
    std::vector<std::vector<time_point>> ended(swarm.trainers.size());
    std::vector<time_point> started(swarm.trainers.size());
    for (std::size_t p = 0; p < swarm.trainers.size(); ++p) {
        auto& t = swarm.trainers[p];
        t.before_step = [&, p](trainer&) { started[p] = swarm.peers.now(); };
        t.after_step = [&, p, seen = duration{}](trainer& self,
                                                 const optim::step_report& r) mutable {
            const std::size_t e = self.epoch_ends.size(); // the epoch the step began in
            if (e >= epochs) return;
            points[e].push_back({started[p], p, r.epoch_ended ? r.samples_contributed : r.samples});
            if (!r.epoch_ended) return;
            const duration total = self.optimizer->statistics().waiting_for_group;
            waits[p].push_back(total - seen);
            seen = total;
            ended[p].push_back(started[p]);
        };
    }
    swarm.wait_until_all_seen(4);
    swarm.run();

    for (std::uint64_t e = 0; e < epochs; ++e) {
        INFO("epoch " << e);
        std::uint64_t samples = 0;
        for (const auto& t : swarm.trainers) {
            REQUIRE(t.epoch_ends.size() == epochs);
            const auto& r = t.epoch_ends[e];
            CHECK(r.averaging.outcome == optim::round_outcome::averaged);
            CHECK(r.averaging.group_size == 4);
            CHECK(r.state_averaging.outcome == optim::round_outcome::averaged);
            samples += r.samples_contributed;
        }
        // When the samples the peers had reported in the epoch first reached the target.
        std::vector<std::uint64_t> latest(swarm.trainers.size(), 0);
        std::optional<time_point> reached;
        for (const auto& point : points[e]) {
            latest[point.peer] = point.samples;
            if (!reached &&
                std::accumulate(latest.begin(), latest.end(), std::uint64_t{0}) >= target)
                reached = point.at;
        }
        REQUIRE(reached);
        if (e == 0) continue; // the first epoch starts before anyone knows the others' rates
        // Every peer ends the epoch at its first step at or after the estimated end, so the
        // swarm overshoots by less than a step per peer.
        CHECK(samples >= target);
        CHECK(samples <= target + intervals.size() * batch);
        for (std::size_t p = 0; p < swarm.trainers.size(); ++p) {
            INFO("peer " << p);
            // Within the slowest peer's step of the swarm reaching the target.
            CHECK(ended[p][e] - *reached <= 40ms);
            // Its groups were ready: each of the two rounds waited at most for the leader's
            // own end of the epoch (at most a step later) and the group's way to this peer
            // (a link of 10 ms).
            CHECK(waits[p][e] <= 2 * (40ms + 10ms));
        }
    }
}

TEST_CASE("two peers over loopback TCP end every epoch with the samples-weighted gradient",
          "[optim][collaborative][tcp]") {
    using tcp_optimizer = optim::collaborative_optimizer<net::tcp::transport>;
    constexpr std::uint64_t target = 1024;
    constexpr double lr = 0.5;
    peer_options po;
    po.listen = {"/ip4/127.0.0.1/tcp/0"};
    po.dht.maintenance_period = 0s;
    peer first(po);
    po.initial_peers = {first.addresses().front()};
    peer second(po);
    std::deque<quadratic_model> models;
    models.emplace_back(0);
    models.emplace_back(1);
    auto options = run_options(target, 2);
    options.matchmaking_time = 1s;
    options.averaging_timeout = 5s;
    options.tracking.min_refresh = 100ms;
    std::deque<tcp_optimizer> optimizers;
    optimizers.emplace_back(first, models[0].parameters(), plain_sgd(lr), options);
    optimizers.emplace_back(second, models[1].parameters(), plain_sgd(lr), options);
    // CTAD from a hivemesh::peer, as the README writes it.
    static_assert(std::is_same_v<decltype(optim::collaborative_optimizer(
                                     first, models[0].parameters(), plain_sgd(lr), options)),
                                 tcp_optimizer>);
    for (int i = 0; i < 200 && (optimizers[0].global_progress().num_peers < 2 ||
                                optimizers[1].global_progress().num_peers < 2);
         ++i)
        std::this_thread::sleep_for(50ms);
    REQUIRE(optimizers[1].global_progress().num_peers == 2);

    // Two trainer threads of uneven speed, each blocking in step().
    std::vector<std::vector<optim::step_report>> ends(2);
    std::vector<std::vector<std::vector<float>>> values(2);
    const auto train = [&](std::size_t p, duration pause) {
        for (int steps = 0; steps < 2000 && optimizers[p].local_epoch() < 3; ++steps) {
            std::this_thread::sleep_for(pause);
            models[p].compute_gradient();
            const auto report = optimizers[p].step();
            if (report.epoch_ended) {
                ends[p].push_back(report);
                values[p].push_back(models[p].values());
            }
        }
    };
    std::thread fast(train, 0, 20ms);
    std::thread slow(train, 1, 35ms);
    fast.join();
    slow.join();

    const std::uint64_t total = check_contract(
        {{&models[0].target, &ends[0], &values[0]}, {&models[1].target, &ends[1], &values[1]}}, lr,
        3, 1e-5);
    INFO("samples over 3 epochs: " << total);
    CHECK(total >= 3 * target);
    CHECK(total <= 3 * target * 6 / 5);
    for (auto& o : optimizers)
        CHECK(o.local_epoch() == 3);
    // A blocking step on the peer's own io thread would wait for itself.
    std::promise<std::string> refused;
    asio::post(first.get_executor(), [&] {
        try {
            optimizers[0].step();
            refused.set_value("no exception");
        } catch (const std::system_error& e) {
            refused.set_value(e.code() == errc::wrong_thread ? "wrong_thread" : e.what());
        }
    });
    CHECK(refused.get_future().get() == "wrong_thread");
}

TEST_CASE("the delayed modes over loopback TCP: trainer threads step while the rounds and the "
          "optimizer step run on the io and compute threads",
          "[optim][collaborative][tcp]") {
    using tcp_optimizer = optim::collaborative_optimizer<net::tcp::transport>;
    const bool optimizer_step = GENERATE(false, true);
    INFO("delay_optimizer_step " << optimizer_step);
    constexpr double lr = 0.5;
    peer_options po;
    po.listen = {"/ip4/127.0.0.1/tcp/0"};
    po.dht.maintenance_period = 0s;
    // More than one of each, so the background work really runs beside the trainers.
    po.io_threads = 2;
    po.compute_threads = 2;
    peer first(po);
    po.initial_peers = {first.addresses().front()};
    peer second(po);
    std::deque<quadratic_model> models;
    models.emplace_back(0);
    models.emplace_back(1);
    auto options = run_options(1024, 2);
    options.matchmaking_time = 1s;
    options.averaging_timeout = 5s;
    options.tracking.min_refresh = 100ms;
    options.delay_grad_averaging = true;
    options.delay_optimizer_step = optimizer_step;
    std::deque<tcp_optimizer> optimizers;
    optimizers.emplace_back(first, models[0].parameters(), plain_sgd(lr), options);
    optimizers.emplace_back(second, models[1].parameters(), plain_sgd(lr), options);
    for (int i = 0; i < 200 && (optimizers[0].global_progress().num_peers < 2 ||
                                optimizers[1].global_progress().num_peers < 2);
         ++i)
        std::this_thread::sleep_for(50ms);
    REQUIRE(optimizers[1].global_progress().num_peers == 2);

    std::vector<std::vector<optim::step_report>> ends(2), applied(2);
    std::vector<std::vector<std::vector<float>>> values(2);
    const auto train = [&](std::size_t p, duration pause) {
        for (int steps = 0; steps < 2000 && optimizers[p].local_epoch() < 3; ++steps) {
            std::this_thread::sleep_for(pause);
            models[p].compute_gradient();
            const auto report = optimizers[p].step();
            if (report.update_applied) applied[p].push_back(report);
            if (report.epoch_ended) {
                ends[p].push_back(report);
                values[p].push_back(models[p].values());
            }
        }
    };
    std::thread fast(train, 0, 20ms);
    std::thread slow(train, 1, 35ms);
    fast.join();
    slow.join();

    for (std::size_t p = 0; p < 2; ++p) {
        INFO("peer " << p);
        REQUIRE(ends[p].size() == 3);
        CHECK(optimizers[p].local_epoch() == 3);
        CHECK_FALSE(ends[p][0].update_applied);
        // A step after a round applies it, at the next epoch's end at the latest: by the
        // third end the first two rounds are applied and the third is running.
        REQUIRE(applied[p].size() == 2);
        for (const auto& r : applied[p])
            CHECK(r.averaging.outcome == optim::round_outcome::averaged);
    }
    // By the third end both have applied the same two averaged gradients, from zeros.
    CHECK(values[0][2] == values[1][2]);
    CHECK(values[0][2] != std::vector<float>(first_size + second_size, 0.0f));
}

namespace {

/// max |values − Σ c_p / n| over the swarm's mean target.
double distance_to_mean_target(const collaborative_swarm& swarm, const std::vector<float>& values) {
    double worst = 0;
    const auto n = static_cast<double>(swarm.trainers.size());
    for (std::size_t j = 0; j < values.size(); ++j) {
        double mean = 0;
        for (const auto& t : swarm.trainers)
            mean += static_cast<double>(t.model.target[j]) / n;
        worst = std::max(worst, std::abs(static_cast<double>(values[j]) - mean));
    }
    return worst;
}

} // namespace

TEST_CASE("the delayed modes average and step in the background, and a later step applies it",
          "[optim][collaborative][sim]") {
    const bool optimizer_step = GENERATE(false, true);
    INFO("delay_optimizer_step " << optimizer_step);
    collaborative_swarm swarm(30);
    for (const auto interval : {100ms, 170ms, 230ms}) {
        auto o = run_options(1024, 3);
        o.delay_grad_averaging = true;
        o.delay_optimizer_step = optimizer_step;
        swarm.add(o, plain_sgd(0.5), interval);
    }
    const double initial = distance_to_mean_target(swarm, swarm.trainers[0].model.values());
    swarm.wait_until_all_seen(3);
    swarm.run();
    // The epoch advances at once; the update comes one step after its round.
    for (const auto& t : swarm.trainers) {
        REQUIRE(t.epoch_ends.size() == 3);
        CHECK_FALSE(t.epoch_ends[0].update_applied);
        CHECK(t.optimizer->statistics().rounds_averaged >= 3);
    }
    swarm.peers.run_for(15s); // the last round ends
    // One more step each, together: it applies the update, and the state round follows.
    std::vector<std::optional<optim::step_report>> last(swarm.trainers.size());
    for (std::size_t p = 0; p < swarm.trainers.size(); ++p) {
        auto& t = swarm.trainers[p];
        t.model.compute_gradient();
        t.optimizer->async_step(0, [&last, p](std::error_code ec, optim::step_report r) {
            CHECK_FALSE(ec);
            last[p] = r;
        });
    }
    REQUIRE(swarm.peers.run_until(
        [&] {
            return std::all_of(last.begin(), last.end(), [](auto& r) { return r.has_value(); });
        },
        60s));
    for (const auto& r : last) {
        CHECK(r->update_applied);
        CHECK(r->averaging.outcome == optim::round_outcome::averaged);
        CHECK(r->state_averaging.outcome == optim::round_outcome::averaged);
    }
    const auto values = swarm.trainers[0].model.values();
    for (const auto& t : swarm.trainers)
        CHECK(t.model.values() == values);
    CHECK(distance_to_mean_target(swarm, values) < 0.5 * initial);
}

TEST_CASE("DiLoCo: local inner steps, and an outer Nesterov step on the averaged "
          "pseudo-gradient converges on a convex problem",
          "[optim][collaborative][sim]") {
    collaborative_swarm swarm(31);
    // DiLoCo's momentum of 0.9 suits long non-convex runs; on a quadratic it circles the
    // minimum for many epochs, so this run damps it.
    optim::sgd_options outer;
    outer.lr = 0.7;
    outer.momentum = 0.5;
    outer.nesterov = true;
    for (std::size_t p = 0; p < 3; ++p) {
        auto o = run_options(768, 3);
        o.outer_optimizer = outer;
        swarm.add(o, plain_sgd(0.2), 150ms).last_epoch = 10;
    }
    const double initial = distance_to_mean_target(swarm, swarm.trainers[0].model.values());
    swarm.wait_until_all_seen(3);
    swarm.run();
    std::vector<double> distances;
    for (std::size_t e = 0; e < 10; ++e) {
        INFO("epoch " << e);
        for (const auto& t : swarm.trainers) {
            REQUIRE(t.epoch_ends.size() == 10);
            CHECK(t.epoch_ends[e].averaging.outcome == optim::round_outcome::averaged);
            CHECK(t.values_after[e] == swarm.trainers[0].values_after[e]);
        }
        distances.push_back(distance_to_mean_target(swarm, swarm.trainers[0].values_after[e]));
    }
    INFO("distance to the mean target: " << initial << " at first, then "
                                         << Catch::Detail::stringify(distances));
    CHECK(distances.back() < 0.05 * initial);
    // Each epoch: the pseudo-gradients, then the state (values and the outer momentum).
    CHECK(swarm.trainers[0].optimizer->statistics().rounds_averaged == 20);
}

TEST_CASE("the averaged gradient is the gradient over the union of the epoch's batches",
          "[optim][collaborative][sim]") {
    const std::size_t peers = GENERATE(2, 4);
    INFO(peers << " peers");
    constexpr double lr = 0.5;
    constexpr std::size_t batch = 32;
    const std::vector<duration> intervals{100ms, 170ms, 230ms, 310ms};
    collaborative_swarm swarm(40 + peers);
    // Every batch of every peer has samples of its own: the gradient of ½‖w − x‖² averaged
    // over a batch is w − (the batch's mean sample), and each step draws a new batch.
    struct batch_record {
        std::uint64_t epoch;
        std::vector<double> sample_sum; ///< Σ x over the batch
    };
    std::vector<std::vector<batch_record>> batches(peers);
    for (std::size_t p = 0; p < peers; ++p) {
        auto& t = swarm.add(run_options(1024, peers), plain_sgd(lr), intervals[p]);
        t.last_epoch = 2;
        t.before_step = [&, p](trainer& t) {
            const std::size_t step = batches[p].size();
            batch_record record{t.optimizer->local_epoch(),
                                std::vector<double>(first_size + second_size, 0.0)};
            std::vector<float> mean(record.sample_sum.size(), 0.0f);
            for (std::size_t i = 0; i < batch; ++i)
                for (std::size_t j = 0; j < mean.size(); ++j) {
                    const double x =
                        std::sin(0.001 * static_cast<double>(
                                             (p * 7919 + step * 104729 + i * 31) % 100003 + j));
                    record.sample_sum[j] += x;
                    mean[j] += static_cast<float>(x / batch);
                }
            t.model.target = mean;
            t.model.compute_gradient();
            batches[p].push_back(std::move(record));
        };
    }
    swarm.wait_until_all_seen(peers);
    swarm.run();
    std::vector<double> w(first_size + second_size, 0.0);
    for (std::uint64_t e = 0; e < 2; ++e) {
        INFO("epoch " << e);
        // One process over the union of the epoch's batches: the gradient at w is w − mean(x).
        std::vector<double> sum(w.size(), 0.0);
        double samples = 0;
        for (const auto& records : batches)
            for (const auto& r : records)
                if (r.epoch == e) {
                    samples += batch;
                    for (std::size_t j = 0; j < w.size(); ++j)
                        sum[j] += r.sample_sum[j];
                }
        for (std::size_t j = 0; j < w.size(); ++j)
            w[j] -= lr * (w[j] - sum[j] / samples);
        for (const auto& t : swarm.trainers) {
            REQUIRE(t.epoch_ends.size() == 2);
            CHECK(max_difference(t.values_after[e], w) <= 1e-5);
        }
    }
}

TEST_CASE("the optimizer as the README shows it: a plain vector model on a peer",
          "[optim][collaborative][tcp]") {
    peer_options po;
    po.listen = {"/ip4/127.0.0.1/tcp/0"};
    hivemesh::peer peer(po);
    const std::size_t n = 1000;
    // From here on, as written in the README (a peer alone: its rounds are skipped).
    std::vector<float> weights(n), grads(n);
    hivemesh::optim::collaborative_options co;
    co.run_id = "demo";
    co.target_batch_size = 256;
    co.batch_size_per_step = 32;
    co.matchmaking_time = 2s;
    co.averaging_timeout = 10s;
    hivemesh::optim::sgd_options so;
    so.lr = 0.5;
    hivemesh::optim::collaborative_optimizer opt(peer, {hivemesh::optim::parameter{weights, grads}},
                                                 hivemesh::optim::sgd(so), co);
    for (int step = 0; step < 16; ++step) {
        for (std::size_t j = 0; j < n; ++j)
            grads[j] = weights[j] - 1.0f; // the gradient of ½‖w − 1‖²
        opt.step();
    }
    std::size_t e = opt.local_epoch();
    CHECK(e == 2);
    CHECK(weights == std::vector<float>(n, 0.75f)); // 0 → 0.5 → 0.75
    CHECK(opt.statistics().rounds_alone == 4);
}

TEST_CASE("the state metadata round-trips and refuses what is not it", "[optim][collaborative]") {
    const optim::state_metadata m{
        .epoch = 41, .step_count = 7, .integer_buffers = {{1, -2, 1LL << 50}, {}}};
    const byte_buffer bytes = optim::encode(m);
    CHECK(bytes.size() == 1 + 8 + 8 + 4 + (8 + 3 * 8) + 8);
    optim::state_metadata back;
    REQUIRE_FALSE(optim::decode(bytes, back));
    CHECK(back == m);
    for (std::size_t n = 0; n < bytes.size(); ++n)
        CHECK(optim::decode(byte_view(bytes).first(n), back) == errc::truncated_input);
    byte_buffer huge = optim::encode(optim::state_metadata{});
    huge[17] = std::byte{0xff}; // 255 buffers announced, none there
    CHECK(optim::decode(huge, back) == errc::truncated_input);
    byte_buffer longer = bytes;
    longer.push_back(std::byte{0});
    CHECK(optim::decode(longer, back) == errc::trailing_data);
    byte_buffer other = bytes;
    other[0] = std::byte{1};
    CHECK(optim::decode(other, back) == errc::unsupported_version);
}

TEST_CASE("bad options, parameters and calls are refused with a message that names them",
          "[optim][collaborative][errors]") {
    sim_peers swarm(60);
    auto& peer = swarm.add_peer();
    auto& client = swarm.add_peer(true);
    quadratic_model model;
    const auto refused = [&](auto change, const std::string& words, test::sim_peer* on = nullptr) {
        auto o = run_options(256, 2);
        change(o);
        try {
            sim_optimizer opt(on ? *on : peer, model.parameters(), plain_sgd(0.1), o);
            FAIL("accepted: " << words);
        } catch (const std::invalid_argument& e) {
            CHECK_THAT(e.what(), Catch::Contains(words));
        }
    };
    refused([](auto& o) { o.run_id = ""; }, "run_id");
    refused([](auto& o) { o.run_id = std::string(91, 'a'); }, "run_id");
    refused([](auto& o) { o.run_id = "a b"; }, "run_id");
    refused([](auto& o) { o.target_batch_size = 0; }, "target_batch_size");
    refused([](auto& o) { o.matchmaking_time = 0s; }, "matchmaking_time");
    refused([](auto& o) { o.averaging_timeout = -1s; }, "averaging_timeout");
    refused([](auto& o) { o.load_state_timeout = 0s; }, "load_state_timeout");
    refused(
        [](auto& o) {
            o.use_local_updates = true;
            o.delay_grad_averaging = true;
        },
        "gradient mode");
    refused(
        [](auto& o) {
            o.outer_optimizer = optim::sgd_options{};
            o.delay_optimizer_step = true;
        },
        "gradient mode");
    refused([](auto& o) { o.role = averaging::member_role::aux; }, "client mode", &client);
    refused([](auto& o) { o.average_opt_statistics = std::vector<std::string>{"exp_avg"}; },
            "no state named \"exp_avg\"");

    const auto o = run_options(256, 2);
    CHECK_THROWS_WITH(sim_optimizer(peer, {}, plain_sgd(0.1), o), Catch::Contains("no parameters"));
    std::vector<float> short_grad(3), value(4);
    CHECK_THROWS_AS(sim_optimizer(peer, {optim::parameter{value, short_grad}}, plain_sgd(0.1), o),
                    std::system_error);

    // A step without a batch size, a second step while one runs, and a grad that shrank.
    auto no_batch = o;
    no_batch.batch_size_per_step = 0;
    sim_optimizer opt(peer, model.parameters(), plain_sgd(0.1), no_batch);
    CHECK_THROWS_WITH(opt.async_step(0, asio::detached), Catch::Contains("batch size"));
    bool done = false;
    opt.async_step(32, [&](std::error_code ec, optim::step_report) {
        CHECK_FALSE(ec);
        done = true;
    });
    CHECK_THROWS_WITH(opt.async_step(32, asio::detached), Catch::Contains("already running"));
    REQUIRE(swarm.run_until([&] { return done; }, 60s));
    model.second_grad.resize(10);
    try {
        opt.async_step(32, asio::detached);
        FAIL("a grad of another size was accepted");
    } catch (const std::system_error& e) {
        CHECK(e.code() == errc::size_mismatch);
    }
    model.second_grad.resize(second_size);
    // Closed: a step completes with cancelled.
    opt.close();
    std::optional<std::error_code> after_close;
    opt.async_step(32, [&](std::error_code ec, optim::step_report) { after_close = ec; });
    REQUIRE(swarm.run_until([&] { return after_close.has_value(); }, 10s));
    CHECK(*after_close == errc::cancelled);
    swarm.run_for(1s);
}
