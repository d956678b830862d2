// Chaos training on the simulated network (issue 22 §2): N peers (basic_peer on one
// net::sim::network, in virtual time, deterministic by seed) train one raw-buffer model with
// the collaborative optimizer in gradient mode while
//   - every link has a one-way latency of a_i + a_j (each node's a uniform in half the
//     [min_latency, max_latency] range) and loses each transmission with probability `loss`;
//   - every churn_every, a random peer other than the bootstrap one crashes and a fresh one
//     joins (it loads the state from the others before it trains), until churn_until;
//   - at partition_at the half of the peers without the bootstrap one is cut off from the
//     rest, and the network heals partition_for later.
// Model: one parameter w of `elements` floats with the loss ½‖w − c_i‖² at peer i, whose target
// c_i is the swarm's c (a sine) plus noise of its own; the swarm's loss is ½·mean_j (w_j − c_j)².
// Each live trainer steps until its local epoch reaches `epochs`. Then every live peer joins
// one final averaging round of its parameters (a separate averager, prefix "final").
// Used by tests/integration/chaos_training_test.cpp (64 peers, in CI) and
// bench/chaos_sim_bench.cpp (256 peers), so it reports rather than asserts.
#pragma once

#include "support/sim_peers.hpp"

#include <hivemesh/averaging/averager.hpp>
#include <hivemesh/optim/collaborative.hpp>
#include <hivemesh/optim/sgd.hpp>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace hivemesh::test {

struct chaos_options {
    std::size_t peers = 64;
    std::uint64_t seed = 1;
    std::size_t elements = 256;
    std::uint64_t batch = 4;     ///< samples per step
    std::uint64_t target = 4096; ///< target_batch_size
    std::uint64_t epochs = 6;    ///< each live trainer stops at this local epoch
    /// A trainer's time between batches, drawn per peer geometrically within the range.
    duration min_interval = std::chrono::milliseconds(200);
    duration max_interval = std::chrono::milliseconds(800);
    duration min_latency = std::chrono::milliseconds(20); ///< one way, per link
    duration max_latency = std::chrono::milliseconds(200);
    double loss = 0.01;
    duration churn_every = std::chrono::seconds(5); ///< 0: no churn
    duration churn_until = std::chrono::seconds(40);
    duration partition_at = std::chrono::seconds(10);
    duration partition_for = std::chrono::seconds(30); ///< 0: no partition
    duration max_virtual = std::chrono::seconds(900);  ///< training and the final round
    /// collaborative_options::matchmaking_time (the other options are the library's).
    duration matchmaking_time = std::chrono::seconds(15);
    /// Two settings that save CPU and change no outcome (see bench/collaborative_sim_bench.cpp).
    duration min_refresh = std::chrono::seconds(2);
    bool cache_on_get = false;
    /// Told of each churn, the partition, the heal and every epoch a live peer first
    /// reaches, with the virtual seconds since the start; none by default.
    std::function<void(double seconds, const std::string& event)> progress;
};

struct chaos_result {
    bool finished = false;             ///< every live trainer reached `epochs` within max_virtual
    std::vector<std::string> failures; ///< step errors of live peers, a final round that failed
    std::size_t crashes = 0;
    std::size_t joins = 0;
    std::size_t live = 0;
    std::uint64_t global_epoch = 0;            ///< the largest local epoch of a live peer
    std::uint64_t min_live_epoch = 0;          ///< the smallest
    std::uint64_t state_loads = 0;             ///< downloads of the state, newcomers' and others'
    std::map<std::string, std::size_t> rounds; ///< gradient rounds at epoch ends: outcome (why)
    /// Per epoch, the mean group size of its gradient rounds (0 for a failed or lone one).
    std::vector<double> group_size_by_epoch;
    std::uint64_t samples = 0;           ///< computed by every trainer
    std::uint64_t samples_averaged = 0;  ///< contributed to rounds averaged with a group
    std::uint64_t samples_partial = 0;   ///< ... to partly averaged ones
    std::uint64_t samples_alone = 0;     ///< ... to rounds that failed or ran alone
    std::uint64_t samples_discarded = 0; ///< dropped by state downloads
    std::uint64_t samples_crashed = 0;   ///< computed by a peer that crashed before contributing
    /// From the heal to the end of the first gradient round whose group was larger than
    /// either side of the partition (virtual seconds); NaN if none.
    double partition_recovery = std::numeric_limits<double>::quiet_NaN();
    std::size_t final_group_min = 0; ///< the final round's smallest group
    double final_disagreement = 0;   ///< largest |w_p − w_q| over live peers after it
    double initial_loss = 0;         ///< the swarm's loss at w = 0
    double final_loss = 0;           ///< ... of peer 0's parameters after the final round
    std::uint64_t trace_hash = 0;    ///< the network's, after the final round
    net::sim::network_statistics network;
    double virtual_seconds = 0; ///< of training and the final round
    double wall_seconds = 0;

    std::uint64_t samples_lost() const {
        return samples_alone + samples_discarded + samples_crashed;
    }
};

namespace detail {

inline double seconds_of(duration d) {
    return std::chrono::duration<double>(d).count();
}

/// A uniform draw in [lo, hi].
inline duration uniform_duration(random_generator& rng, duration lo, duration hi) {
    const auto span = static_cast<std::uint64_t>((hi - lo).count());
    return lo + duration{static_cast<duration::rep>(rng.uniform(span + 1))};
}

class chaos_run {
public:
    using sim_optimizer = optim::collaborative_optimizer<net::sim::transport>;

    explicit chaos_run(const chaos_options& o)
        : o_(o)
        , peers_(o.seed)
        , rng_(o.seed ^ 0xC4A05ULL)
        , swarm_target_(o.elements) {
        for (std::size_t j = 0; j < o.elements; ++j)
            swarm_target_[j] = std::sin(0.05f * static_cast<float>(j));
        peers_.dht_options.cache_on_get = o.cache_on_get;
        // The DHT's upkeep (re-bootstrap, refresh, republish) as a real swarm runs it, which
        // sim_peers turns off for tests that drive every step themselves.
        peers_.dht_options.maintenance_period = dht::node_options{}.maintenance_period;
        peers_.on_node_added = [this](net::sim::node_id node) { connect(node); };
    }

    chaos_run(const chaos_run&) = delete;
    chaos_run& operator=(const chaos_run&) = delete;

    ~chaos_run() {
        finals_.clear();
        for (auto& t : trainers_)
            t.optimizer->close();
        peers_.run_for(std::chrono::seconds(1));
        for (auto& t : trainers_)
            t.optimizer.reset();
    }

    chaos_result run() {
        using wall = std::chrono::steady_clock;
        const auto wall_start = wall::now();
        for (std::size_t i = 0; i < o_.peers; ++i)
            peers_.add_peer();
        for (std::size_t i = 0; i < o_.peers; ++i)
            add_trainer(i);
        // Nobody starts alone: every tracker counts every peer first.
        if (!peers_.run_until(
                [&] {
                    return std::all_of(trainers_.begin(), trainers_.end(), [&](const trainer& t) {
                        return t.optimizer->global_progress().num_peers == o_.peers;
                    });
                },
                std::chrono::seconds(120)))
            result_.failures.push_back("the trackers did not all see every peer in 120 s");

        start_ = peers_.now();
        for (auto& t : trainers_)
            start(t);
        drive();
        final_round();
        summarise();
        result_.virtual_seconds = seconds_of(peers_.now() - start_);
        result_.wall_seconds = std::chrono::duration<double>(wall::now() - wall_start).count();
        return result_;
    }

private:
    struct trainer {
        std::size_t peer = 0; ///< index into peers_.peers
        std::vector<float> value, grad, target;
        std::unique_ptr<sim_optimizer> optimizer;
        duration interval{};
        bool running = false;
        bool crashed = false;
        std::uint64_t samples = 0;             ///< computed
        std::uint64_t samples_contributed = 0; ///< at its epoch ends
    };

    /// The links of a new node to every other one (both ways).
    void connect(net::sim::node_id node) {
        const auto half_min = o_.min_latency / 2;
        const auto half_max = o_.max_latency / 2;
        access_latency_[node] = uniform_duration(rng_, half_min, half_max);
        for (const auto& [other, latency] : access_latency_)
            if (other != node)
                peers_.network.set_links_between(node, other,
                                                 {access_latency_[node] + latency, 0, o_.loss});
    }

    void add_trainer(std::size_t peer) {
        auto& t = trainers_.emplace_back();
        t.peer = peer;
        t.value.assign(o_.elements, 0.0f);
        t.grad.assign(o_.elements, 0.0f);
        t.target = swarm_target_;
        for (float& c : t.target) // noise of ±0.1
            c += static_cast<float>(rng_.uniform_real() * 0.2 - 0.1);
        const double spread = std::chrono::duration<double>(o_.max_interval) /
                              std::chrono::duration<double>(o_.min_interval);
        t.interval = std::chrono::duration_cast<duration>(o_.min_interval *
                                                          std::pow(spread, rng_.uniform_real()));
        optim::collaborative_options c;
        c.run_id = "chaos";
        c.target_batch_size = o_.target;
        c.batch_size_per_step = o_.batch;
        c.matchmaking_time = o_.matchmaking_time;
        c.load_state_timeout = std::chrono::seconds(60);
        c.averaging.target_group_size = o_.peers;
        c.tracking.min_refresh = o_.min_refresh;
        optim::sgd_options sgd;
        sgd.lr = 0.5;
        t.optimizer = std::make_unique<sim_optimizer>(
            peers_.peers[peer], std::vector<optim::parameter>{{t.value, t.grad}}, optim::sgd(sgd),
            c);
    }

    void start(trainer& t) {
        t.running = true;
        asio::co_spawn(peers_.network.get_executor(), train(&t), asio::detached);
    }

    asio::awaitable<void> train(trainer* t) {
        // A newcomer's first step finds the swarm ahead and downloads the state.
        net::sim::timer timer(co_await asio::this_coro::executor);
        while (!t->crashed && t->optimizer->local_epoch() < o_.epochs) {
            timer.expires_after(t->interval);
            co_await timer.async_wait(default_token_t{});
            if (t->crashed) co_return;
            for (std::size_t j = 0; j < t->value.size(); ++j)
                t->grad[j] = t->value[j] - t->target[j];
            t->samples += o_.batch;
            auto [ec, report] = co_await t->optimizer->async_step(o_.batch, default_token_t{});
            if (t->crashed) co_return; // its report no longer counts
            if (ec) {
                note_failure(*t, "a step failed: " + ec.message());
                break;
            }
            if (report.epoch_ended) epoch_ended(*t, report);
        }
        t->running = false;
    }

    void note_failure(const trainer& t, const std::string& what) {
        result_.failures.push_back("peer " + std::to_string(t.peer) + ": " + what);
    }

    void epoch_ended(trainer& t, const optim::step_report& r) {
        const auto& a = r.averaging;
        std::string key(optim::to_string(a.outcome));
        if (a.error) key += " (" + a.error.message() + ")";
        ++result_.rounds[key];
        t.samples_contributed += r.samples_contributed;
        if (r.epoch > 0) { // the epoch the step ended is r.epoch - 1
            if (group_sums_.size() < r.epoch) group_sums_.resize(r.epoch);
            group_sums_[r.epoch - 1].first += static_cast<double>(a.group_size);
            ++group_sums_[r.epoch - 1].second;
        }
        switch (a.outcome) {
        case optim::round_outcome::averaged:
            result_.samples_averaged += r.samples_contributed;
            break;
        case optim::round_outcome::partial:
            result_.samples_partial += r.samples_contributed;
            break;
        default:
            result_.samples_alone += r.samples_contributed;
            break;
        }
        if (r.epoch > furthest_epoch_) {
            furthest_epoch_ = r.epoch;
            tell("epoch " + std::to_string(r.epoch) + " reached (" + key + ", group " +
                 std::to_string(a.group_size) + ")");
        }
        if (healed_at_ && std::isnan(result_.partition_recovery) &&
            a.outcome != optim::round_outcome::failed && a.group_size > largest_side_)
            result_.partition_recovery = seconds_of(peers_.now() - *healed_at_);
    }

    /// Runs training, with the churn and the partition, until every live trainer stopped.
    void drive() {
        const auto deadline = start_ + o_.max_virtual;
        std::optional<time_point> next_churn;
        if (o_.churn_every > duration::zero()) next_churn = start_ + o_.churn_every;
        std::optional<time_point> cut, heal;
        if (o_.partition_for > duration::zero()) {
            cut = start_ + o_.partition_at;
            heal = *cut + o_.partition_for;
        }
        const auto all_stopped = [&] {
            return joining_ == 0 && std::none_of(trainers_.begin(), trainers_.end(),
                                                 [](const trainer& t) { return t.running; });
        };
        while (!all_stopped() && peers_.now() < deadline) {
            time_point next = deadline;
            for (const auto& event : {next_churn, cut, heal})
                if (event) next = std::min(next, *event);
            peers_.run_until(all_stopped, next - peers_.now());
            if (all_stopped()) break;
            const auto now = peers_.now();
            if (cut && now >= *cut) {
                partition();
                cut.reset();
                tell("partitioned");
            } else if (heal && now >= *heal) {
                peers_.network.heal();
                healed_at_ = now;
                heal.reset();
                tell("healed");
            } else if (next_churn && now >= *next_churn) {
                replace_one();
                next_churn = *next_churn + o_.churn_every;
                if (*next_churn > start_ + o_.churn_until) next_churn.reset();
            }
        }
        result_.finished = all_stopped();
    }

    /// Cuts off the half of the live peers that does not hold the bootstrap peer.
    void partition() {
        std::vector<net::sim::node_id> side;
        std::size_t live = 0;
        for (const auto& t : trainers_)
            if (!t.crashed) {
                ++live;
                if (t.peer != 0 && side.size() < live / 2) side.push_back(node_of(t));
            }
        largest_side_ = std::max(side.size(), live - side.size());
        peers_.network.partition(side);
    }

    /// Crashes a random live peer other than the bootstrap one; a fresh peer joins.
    void replace_one() {
        std::vector<trainer*> candidates;
        for (auto& t : trainers_)
            if (!t.crashed && t.peer != 0) candidates.push_back(&t);
        if (candidates.empty()) return;
        auto& doomed = *candidates[rng_.uniform(candidates.size())];
        doomed.crashed = true;
        doomed.running = false;
        result_.samples_crashed += doomed.samples - doomed.samples_contributed;
        peers_.network.crash(node_of(doomed));
        ++result_.crashes;
        tell("peer " + std::to_string(doomed.peer) + " crashed");
        // The newcomer bootstraps while the others train, then loads the state and trains.
        auto& p = peers_.new_peer();
        const std::size_t index = peers_.peers.size() - 1;
        ++joining_;
        p.async_bootstrap([this, index](std::error_code ec, const std::string& problem) {
            --joining_;
            if (ec) {
                result_.failures.push_back("peer " + std::to_string(index) +
                                           " did not bootstrap: " + ec.message());
                return;
            }
            add_trainer(index);
            ++result_.joins;
            start(trainers_.back());
            tell("peer " + std::to_string(index) + " joined" +
                 (problem.empty() ? "" : " (" + problem + ")"));
        });
    }

    void tell(const std::string& event) const {
        if (o_.progress) o_.progress(seconds_of(peers_.now() - start_), event);
    }

    net::sim::node_id node_of(const trainer& t) const { return peers_.nodes[t.peer]; }

    /// Every live peer averages its parameters once more, in one group of all of them.
    void final_round() {
        std::vector<trainer*> live;
        for (auto& t : trainers_)
            if (!t.crashed) live.push_back(&t);
        result_.final_group_min = std::numeric_limits<std::size_t>::max();
        for (auto* t : live) {
            auto& p = peers_.peers[t->peer];
            averaging::averager_options a;
            a.prefix = "final";
            a.target_group_size = live.size();
            a.matchmaking_time = std::chrono::seconds(30);
            a.averaging_timeout = std::chrono::seconds(30);
            auto& averager = finals_.emplace_back(
                std::make_unique<averager_type>(p.rpc(), p.dht(), p.announce_endpoint(),
                                                std::vector<tensor::tensor_ref>{t->value}, a));
            auto control = averager->make_control(0, live.size());
            control->trigger(1.0);
            averager->async_scheduled_step(
                control, [this, t](std::error_code ec, averaging::step_result r) {
                    ++final_done_;
                    if (ec) note_failure(*t, "the final round failed: " + ec.message());
                    result_.final_group_min = std::min(result_.final_group_min, r.group_size);
                });
        }
        if (!peers_.run_until([&] { return final_done_ == live.size(); },
                              std::chrono::seconds(120)))
            result_.failures.push_back("the final round did not end in 120 s");
        for (const auto* t : live)
            for (std::size_t j = 0; j < o_.elements; ++j)
                result_.final_disagreement =
                    std::max(result_.final_disagreement,
                             static_cast<double>(std::abs(t->value[j] - live.front()->value[j])));
    }

    void summarise() {
        bool first = true;
        for (const auto& t : trainers_) {
            result_.samples += t.samples;
            const auto s = t.optimizer->statistics();
            result_.samples_discarded += s.samples_discarded;
            result_.state_loads += s.state_loads;
            if (t.crashed) continue;
            ++result_.live;
            const auto epoch = t.optimizer->local_epoch();
            result_.global_epoch = std::max(result_.global_epoch, epoch);
            result_.min_live_epoch = first ? epoch : std::min(result_.min_live_epoch, epoch);
            first = false;
        }
        for (const auto& [sum, count] : group_sums_)
            result_.group_size_by_epoch.push_back(count == 0 ? 0 : sum / count);
        result_.initial_loss = loss_of(std::vector<float>(o_.elements, 0.0f));
        result_.final_loss = loss_of(trainers_.front().value);
        result_.trace_hash = peers_.network.trace_hash();
        result_.network = peers_.network.statistics();
    }

    double loss_of(const std::vector<float>& w) const {
        double sum = 0;
        for (std::size_t j = 0; j < w.size(); ++j) {
            const double d = static_cast<double>(w[j]) - static_cast<double>(swarm_target_[j]);
            sum += 0.5 * d * d;
        }
        return sum / static_cast<double>(w.size());
    }

    using averager_type = averaging::averager<net::sim::transport>;

    chaos_options o_;
    sim_peers peers_;
    random_generator rng_;
    std::vector<float> swarm_target_;
    std::map<net::sim::node_id, duration> access_latency_;
    std::deque<trainer> trainers_;
    std::vector<std::unique_ptr<averager_type>> finals_;
    time_point start_{};
    std::optional<time_point> healed_at_;
    std::size_t largest_side_ = 0;
    std::size_t final_done_ = 0; ///< final rounds ended
    std::uint64_t furthest_epoch_ = 0;
    std::size_t joining_ = 0;                                ///< newcomers still bootstrapping
    std::vector<std::pair<double, std::size_t>> group_sums_; ///< per epoch: sizes, rounds
    chaos_result result_;
};

} // namespace detail

/// Runs the scenario of the file comment once.
inline chaos_result run_chaos_training(const chaos_options& o) {
    detail::chaos_run run(o);
    return run.run();
}

} // namespace hivemesh::test
