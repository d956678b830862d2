// libtorch: hivemesh's sgd/adam/adamw against torch::optim on the same problem;
// torch_optimizer over a torch::nn::Linear: its state tensors are the optimizer's own, state
// written into a second wrapper continues the first exactly, and its errors; and two peers that
// train a module through it with the collaborative optimizer; adam over a module's parameters
// with and without host staging (the path of tensors on other devices).
//
// <hivemesh/optim/torch.hpp> comes first: it includes <ATen/core/ivalue.h> before the torch
// headers, without which clang 14 in C++20 mode rejects them.
#include <hivemesh/optim/torch.hpp>

#include "support/optimizers.hpp"
#include "support/sim_peers.hpp"

#include <hivemesh/net/sim.hpp>
#include <hivemesh/optim.hpp>
#include <hivemesh/tensor.hpp>
#include <hivemesh/tensor/torch.hpp>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/this_coro.hpp>

#include <catch2/catch.hpp>

#include <ATen/core/Tensor.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/GradMode.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/lbfgs.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace ho = hivemesh::optim;
using hivemesh::test::read;

namespace {

/// A new float32 tensor of shape `sizes` holding `values` in row-major order.
at::Tensor tensor_of(std::vector<float> values, at::IntArrayRef sizes) {
    return at::from_blob(values.data(), sizes, at::kFloat).clone();
}

/// The tensor's elements in row-major order, read by libtorch itself.
std::vector<float> values_of(const at::Tensor& t) {
    const at::Tensor c = t.detach().to(at::kFloat).contiguous();
    return {c.data_ptr<float>(), c.data_ptr<float>() + c.numel()};
}

/// The oracle problem's parameter k as a tensor (shapes 3 × 1 × 1, 1, 549 for the
/// sizes 3, 1, 549), and its gradient of step `step`.
at::Tensor oracle_tensor(std::size_t k, bool gradient, std::size_t step) {
    const auto n = hivemesh::test::oracle_sizes()[k];
    std::vector<float> values(n);
    for (std::size_t i = 0; i < n; ++i)
        values[i] = static_cast<float>(gradient ? hivemesh::test::gradient(step, k, i)
                                                : hivemesh::test::initial_value(k, i));
    const auto size = static_cast<std::int64_t>(n);
    return k == 0 ? tensor_of(values, {size, 1, 1}) : tensor_of(values, {size});
}

/// Five steps of `ours` and of `theirs` (built by `make_theirs` over its parameters) on the
/// oracle problem; after each, every parameter agrees to 1e-6 relative.
template <class MakeTheirs>
void check_same_as_torch(ho::local_optimizer ours, MakeTheirs make_theirs) {
    std::vector<at::Tensor> our_values, our_grads, their_values;
    for (std::size_t k = 0; k < hivemesh::test::oracle_sizes().size(); ++k) {
        our_values.push_back(oracle_tensor(k, false, 0));
        our_grads.push_back(oracle_tensor(k, true, 0));
        their_values.push_back(oracle_tensor(k, false, 0).requires_grad_(true));
    }
    std::vector<ho::parameter> params;
    for (std::size_t k = 0; k < our_values.size(); ++k)
        params.push_back({our_values[k], our_grads[k]});
    auto theirs = make_theirs(their_values);

    for (std::size_t step = 0; step < 5; ++step) {
        for (std::size_t k = 0; k < our_values.size(); ++k) {
            our_grads[k].copy_(oracle_tensor(k, true, step));
            their_values[k].mutable_grad() = oracle_tensor(k, true, step);
        }
        ours.step(params);
        theirs.step();
        INFO("after step " << step + 1);
        for (std::size_t k = 0; k < our_values.size(); ++k) {
            INFO("parameter " << k);
            const auto expected = values_of(their_values[k]);
            const auto actual = values_of(our_values[k]);
            REQUIRE(actual.size() == expected.size());
            for (std::size_t i = 0; i < actual.size(); ++i)
                CHECK(actual[i] == Approx(expected[i]).epsilon(1e-6));
        }
    }
}

/// A small model and a fixed batch; loss() runs forward and backward.
struct linear_problem {
    linear_problem()
        : linear(torch::nn::LinearOptions(3, 2)) {
        const c10::NoGradGuard no_grad;
        linear->weight.copy_(tensor_of({0.5f, -0.25f, 0.75f, 1.0f, 0.125f, -0.5f}, {2, 3}));
        linear->bias.copy_(tensor_of({0.1f, -0.2f}, {2}));
    }

    /// Zeroes the gradients, then backward() of the squared error on the fixed batch (its
    /// targets scaled by `scale`).
    void loss(float scale = 1) {
        linear->zero_grad();
        const auto x = tensor_of({1, 2, 3, -1, 0.5f, 2, 0, -2, 1, 0.25f, 0.75f, -1.5f}, {4, 3});
        const auto y = tensor_of({1, 0, -1, 2, 0.5f, 0.5f, 3, -1}, {4, 2}) * scale;
        (linear->forward(x) - y).pow(2).sum().backward();
    }

    /// Sets this model's parameters to `other`'s.
    void copy_parameters_from(const linear_problem& other) {
        const c10::NoGradGuard no_grad;
        linear->weight.copy_(other.linear->weight);
        linear->bias.copy_(other.linear->bias);
    }

    std::vector<float> parameter_values() const {
        auto v = values_of(linear->weight);
        const auto b = values_of(linear->bias);
        v.insert(v.end(), b.begin(), b.end());
        return v;
    }

    torch::nn::Linear linear;
};

/// The Adam state of parameter `p` in `adam`.
const torch::optim::AdamParamState& adam_state(torch::optim::Adam& adam, const at::Tensor& p) {
    return static_cast<const torch::optim::AdamParamState&>(
        *adam.state().at(c10::guts::to_string(p.unsafeGetTensorImpl())));
}

} // namespace

TEST_CASE("sgd matches torch::optim::SGD", "[optim][torch]") {
    const std::vector<ho::sgd_options> option_sets{
        {.lr = 0.1},
        {.lr = 0.1, .momentum = 0.9, .dampening = 0.3},
        {.lr = 0.05, .momentum = 0.9, .nesterov = true, .weight_decay = 0.1},
    };
    for (const auto& o : option_sets) {
        INFO("momentum " << o.momentum << ", dampening " << o.dampening << ", nesterov "
                         << o.nesterov);
        check_same_as_torch(ho::sgd(o), [&](const std::vector<at::Tensor>& params) {
            return torch::optim::SGD(params, torch::optim::SGDOptions(o.lr)
                                                 .momentum(o.momentum)
                                                 .dampening(o.dampening)
                                                 .nesterov(o.nesterov)
                                                 .weight_decay(o.weight_decay));
        });
    }
}

TEST_CASE("adam matches torch::optim::Adam", "[optim][torch]") {
    const ho::adam_options o{.lr = 0.02, .beta1 = 0.8, .beta2 = 0.99, .weight_decay = 0.1};
    check_same_as_torch(ho::adam(o), [&](const std::vector<at::Tensor>& params) {
        return torch::optim::Adam(params, torch::optim::AdamOptions(o.lr)
                                              .betas({o.beta1, o.beta2})
                                              .eps(o.eps)
                                              .weight_decay(o.weight_decay));
    });
}

TEST_CASE("adamw matches torch::optim::AdamW", "[optim][torch]") {
    const ho::adam_options o{
        .lr = 0.02, .eps = 1e-6, .weight_decay = 0.2, .decoupled_weight_decay = true};
    check_same_as_torch(ho::adam(o), [&](const std::vector<at::Tensor>& params) {
        return torch::optim::AdamW(params, torch::optim::AdamWOptions(o.lr)
                                               .betas({o.beta1, o.beta2})
                                               .eps(o.eps)
                                               .weight_decay(o.weight_decay));
    });
}

TEST_CASE("parameters_of refers to the module's parameters and gradients", "[optim][torch]") {
    linear_problem problem;
    CHECK_FALSE(problem.linear->weight.grad().defined());
    auto params = ho::parameters_of(*problem.linear);
    REQUIRE(params.size() == 2);
    // Before the first backward the gradients exist, as zeros.
    CHECK(read(params.list()[0].grad) == std::vector<float>(6, 0.0f));
    CHECK(read(params.list()[1].value) == std::vector<float>{0.1f, -0.2f});

    problem.loss();
    CHECK(read(params.list()[0].grad) == values_of(problem.linear->weight.grad()));
    CHECK(read(params.list()[1].grad) == values_of(problem.linear->bias.grad()));
    CHECK(read(params.list()[1].grad) != std::vector<float>(2, 0.0f));

    // Moving keeps the references valid, copies of them included.
    const std::vector<ho::parameter> copied = params.list();
    const auto moved = std::move(params);
    REQUIRE(moved.size() == 2);
    moved.list()[0].value.copy_from(std::vector<float>(6, 2.0f));
    CHECK(values_of(problem.linear->weight) == std::vector<float>(6, 2.0f));
    copied[1].value.copy_from(std::vector<float>(2, 3.0f));
    CHECK(values_of(problem.linear->bias) == std::vector<float>(2, 3.0f));
}

namespace {

/// The parameters of a linear_problem after three hivemesh adam steps over its
/// module_parameters with host staging set to `staging`; checks that they stay in their storage.
std::vector<float> adam_steps_with_host_staging(bool staging) {
    const hivemesh::tensor::torch_host_staging_scope scope(staging);
    linear_problem problem;
    const auto params = ho::parameters_of(*problem.linear);
    const void* weight_storage = problem.linear->weight.data_ptr();
    const void* bias_storage = problem.linear->bias.data_ptr();
    CHECK(params.list()[0].value.try_view().has_value() == !staging);
    auto adam = ho::adam({.lr = 0.05,
                          .beta1 = 0.8,
                          .beta2 = 0.99,
                          .eps = 1e-8,
                          .weight_decay = 0.1,
                          .decoupled_weight_decay = false});
    for (int step = 0; step < 3; ++step) {
        problem.loss();
        adam.step(params);
    }
    CHECK(problem.linear->weight.data_ptr() == weight_storage);
    CHECK(problem.linear->bias.data_ptr() == bias_storage);
    CHECK(problem.linear->weight.requires_grad());
    return problem.parameter_values();
}

} // namespace

TEST_CASE("adam over module_parameters gives the same bits with host staging",
          "[optim][torch][staging]") {
    const auto direct = adam_steps_with_host_staging(false);
    const auto staged = adam_steps_with_host_staging(true);
    REQUIRE(staged.size() == direct.size());
    CHECK(staged == direct);
    // Bit for bit (== alone takes -0 for 0).
    CHECK(std::memcmp(staged.data(), direct.data(), staged.size() * sizeof(float)) == 0);
    CHECK(direct != linear_problem().parameter_values()); // the steps changed them
}

TEST_CASE("torch_optimizer exposes Adam's own state and continues from a copied state",
          "[optim][torch][state]") {
    linear_problem problem, plain;
    const auto params = ho::parameters_of(*problem.linear);
    auto adam = std::make_shared<torch::optim::Adam>(problem.linear->parameters(),
                                                     torch::optim::AdamOptions(0.05));
    auto optimizer = ho::torch_optimizer(adam);
    CHECK(optimizer.name() == "torch:Adam");

    // Before the first step: zeros, exp_avg and exp_avg_sq per parameter, in Adam's state.
    const auto state = optimizer.state_tensors(params);
    REQUIRE(state.size() == 4);
    CHECK(read(state[0]) == std::vector<float>(6, 0.0f));
    CHECK(read(state[1]) == std::vector<float>(6, 0.0f));
    CHECK(read(state[2]) == std::vector<float>(2, 0.0f));
    CHECK(read(state[3]) == std::vector<float>(2, 0.0f));
    CHECK(adam->state().size() == 2);
    CHECK(optimizer.step_count() == 0);
    CHECK(optimizer.state_names(params) ==
          std::vector<std::string>{"exp_avg", "exp_avg_sq", "exp_avg", "exp_avg_sq"});

    // Three steps match a plain torch Adam that never had its state made early.
    torch::optim::Adam plain_adam(plain.linear->parameters(), torch::optim::AdamOptions(0.05));
    for (int step = 0; step < 3; ++step) {
        problem.loss();
        optimizer.step(params);
        plain.loss();
        plain_adam.step();
    }
    CHECK(problem.parameter_values() == plain.parameter_values());
    CHECK(optimizer.step_count() == 3);

    // The references taken before the first step hold Adam's moments.
    const auto& weight_state = adam_state(*adam, problem.linear->weight);
    const auto& bias_state = adam_state(*adam, problem.linear->bias);
    CHECK(weight_state.step() == 3);
    CHECK(read(state[0]) == values_of(weight_state.exp_avg()));
    CHECK(read(state[1]) == values_of(weight_state.exp_avg_sq()));
    CHECK(read(state[2]) == values_of(bias_state.exp_avg()));
    CHECK(read(state[3]) == values_of(bias_state.exp_avg_sq()));
    CHECK(read(state[0]) == values_of(adam_state(plain_adam, plain.linear->weight).exp_avg()));

    // A second model and optimizer receive parameters, state tensors and step count.
    linear_problem newcomer;
    newcomer.copy_parameters_from(problem);
    const auto newcomer_params = ho::parameters_of(*newcomer.linear);
    auto newcomer_adam = std::make_shared<torch::optim::Adam>(newcomer.linear->parameters(),
                                                              torch::optim::AdamOptions(0.05));
    auto newcomer_optimizer = ho::torch_optimizer(newcomer_adam);
    const auto newcomer_state = newcomer_optimizer.state_tensors(newcomer_params);
    REQUIRE(newcomer_state.size() == state.size());
    for (std::size_t i = 0; i < state.size(); ++i)
        newcomer_state[i].copy_from(read(state[i]));
    newcomer_optimizer.set_step_count(optimizer.step_count());
    CHECK(adam_state(*newcomer_adam, newcomer.linear->bias).step() == 3);

    for (int step = 0; step < 2; ++step) {
        problem.loss();
        optimizer.step(params);
        newcomer.loss();
        newcomer_optimizer.step(newcomer_params);
    }
    CHECK(newcomer.parameter_values() == problem.parameter_values());
    CHECK(newcomer_optimizer.step_count() == 5);
    for (std::size_t i = 0; i < state.size(); ++i)
        CHECK(read(newcomer_state[i]) == read(state[i]));
}

TEST_CASE("torch_optimizer over SGD: early state does not change the first step",
          "[optim][torch][state]") {
    // torch's SGD sets a new momentum buffer to the gradient; with dampening, decaying the
    // zeros that state_tensors() made would give (1 − dampening)·g instead.
    linear_problem problem, plain;
    const auto params = ho::parameters_of(*problem.linear);
    const auto options = torch::optim::SGDOptions(0.05).momentum(0.9).dampening(0.5);
    auto sgd = std::make_shared<torch::optim::SGD>(problem.linear->parameters(), options);
    auto optimizer = ho::torch_optimizer(sgd);
    CHECK(optimizer.name() == "torch:SGD");
    const auto state = optimizer.state_tensors(params);
    REQUIRE(state.size() == 2);
    CHECK(read(state[0]) == std::vector<float>(6, 0.0f));

    torch::optim::SGD plain_sgd(plain.linear->parameters(), options);
    for (int step = 0; step < 3; ++step) {
        problem.loss();
        optimizer.step(params);
        plain.loss();
        plain_sgd.step();
    }
    CHECK(problem.parameter_values() == plain.parameter_values());
    CHECK(optimizer.step_count() == 3);
    // The references follow the buffers SGD made on its first step.
    const auto& buffer = static_cast<const torch::optim::SGDParamState&>(
        *sgd->state().at(c10::guts::to_string(problem.linear->weight.unsafeGetTensorImpl())));
    CHECK(read(state[0]) == values_of(buffer.momentum_buffer()));
    CHECK(read(state[0]) != std::vector<float>(6, 0.0f));

    // A newcomer given the buffers and the step count continues exactly.
    linear_problem newcomer;
    newcomer.copy_parameters_from(problem);
    const auto newcomer_params = ho::parameters_of(*newcomer.linear);
    auto newcomer_optimizer = ho::torch_optimizer(
        std::make_shared<torch::optim::SGD>(newcomer.linear->parameters(), options));
    const auto newcomer_state = newcomer_optimizer.state_tensors(newcomer_params);
    for (std::size_t i = 0; i < state.size(); ++i)
        newcomer_state[i].copy_from(read(state[i]));
    newcomer_optimizer.set_step_count(optimizer.step_count());
    problem.loss();
    optimizer.step(params);
    newcomer.loss();
    newcomer_optimizer.step(newcomer_params);
    CHECK(newcomer.parameter_values() == problem.parameter_values());
}

TEST_CASE("torch_optimizer copies gradients that are not the parameter's .grad()",
          "[optim][torch]") {
    at::Tensor value = tensor_of({1, 2, 3}, {3}).requires_grad_(true);
    std::vector<float> grad{0.5f, -1, 2};
    const std::vector<ho::parameter> params{{value, grad}};
    auto optimizer = ho::torch_optimizer(std::make_shared<torch::optim::SGD>(
        std::vector<at::Tensor>{value}, torch::optim::SGDOptions(0.1)));
    optimizer.step(params);
    CHECK(values_of(value.grad()) == grad);
    CHECK(values_of(value) == std::vector<float>{1 - 0.05f, 2 + 0.1f, 3 - 0.2f});
}

TEST_CASE("torch_optimizer sets the learning rate of every param group", "[optim][torch]") {
    linear_problem problem;
    auto adam = std::make_shared<torch::optim::Adam>(problem.linear->parameters(),
                                                     torch::optim::AdamOptions(0.05));
    auto optimizer = ho::torch_optimizer(adam);
    CHECK(optimizer.learning_rate() == 0.05);
    optimizer.set_learning_rate(0.01);
    CHECK(optimizer.learning_rate() == 0.01);
    for (const auto& group : adam->param_groups())
        CHECK(group.options().get_lr() == 0.01);
    CHECK_THROWS_AS(optimizer.set_learning_rate(-1), std::invalid_argument);
}

TEST_CASE("torch_optimizer errors", "[optim][torch][errors]") {
    using Catch::Matchers::Contains;
    linear_problem problem, other;
    const auto params = ho::parameters_of(*problem.linear);
    const auto other_params = ho::parameters_of(*other.linear);

    // State of an optimizer class it does not know.
    auto lbfgs =
        ho::torch_optimizer(std::make_shared<torch::optim::LBFGS>(problem.linear->parameters()));
    CHECK(lbfgs.name() == "torch:LBFGS");
    CHECK_THROWS_WITH(lbfgs.state_tensors(params), Contains("Adam") && Contains("LBFGS"));

    auto optimizer = ho::torch_optimizer(std::make_shared<torch::optim::Adam>(
        problem.linear->parameters(), torch::optim::AdamOptions(0.05)));
    // Another module's parameters, or too few.
    CHECK_THROWS_WITH(optimizer.step(other_params), Contains("not the optimizer's parameter"));
    CHECK_THROWS_WITH(optimizer.state_tensors(std::span(params.list()).first(1)),
                      Contains("2 parameters"));
    CHECK(problem.parameter_values() == other.parameter_values());
    CHECK_THROWS_AS(ho::torch_optimizer(nullptr), std::invalid_argument);
}

namespace {

/// A peer training `problem` with `optimizer`: a batch every `interval` until epoch 3.
asio::awaitable<void> train_module(linear_problem* problem,
                                   ho::collaborative_optimizer<hivemesh::net::sim::transport>* opt,
                                   float scale, hivemesh::duration interval, bool* running) {
    hivemesh::net::sim::timer timer(co_await asio::this_coro::executor);
    while (opt->local_epoch() < 3) {
        timer.expires_after(interval);
        co_await timer.async_wait(hivemesh::default_token_t{});
        problem->loss(scale);
        auto [ec, report] = co_await opt->async_step(0, hivemesh::default_token_t{});
        REQUIRE_FALSE(ec);
    }
    *running = false;
}

} // namespace

TEST_CASE("two peers train a module through torch::optim::Adam to identical parameters and "
          "Adam state",
          "[optim][torch][collaborative]") {
    using namespace std::chrono_literals;
    using sim_optimizer = ho::collaborative_optimizer<hivemesh::net::sim::transport>;
    hivemesh::test::sim_peers swarm(51);
    std::deque<linear_problem> problems(2);
    std::deque<ho::module_parameters> params;
    std::deque<std::shared_ptr<torch::optim::Adam>> adams;
    std::deque<sim_optimizer> optimizers;
    for (std::size_t p = 0; p < 2; ++p) {
        auto& peer = swarm.add_peer();
        params.push_back(ho::parameters_of(*problems[p].linear));
        adams.push_back(std::make_shared<torch::optim::Adam>(problems[p].linear->parameters(),
                                                             torch::optim::AdamOptions(0.05)));
        ho::collaborative_options o;
        o.run_id = "torch";
        o.target_batch_size = 256;
        o.batch_size_per_step = 16;
        o.matchmaking_time = 3s;
        o.averaging_timeout = 10s;
        o.averaging.target_group_size = 2;
        optimizers.emplace_back(peer, params.back().list(), ho::torch_optimizer(adams.back()), o);
    }
    REQUIRE(swarm.run_until(
        [&] {
            return optimizers[0].global_progress().num_peers == 2 &&
                   optimizers[1].global_progress().num_peers == 2;
        },
        60s));
    bool running[2] = {true, true};
    asio::co_spawn(swarm.network.get_executor(),
                   train_module(&problems[0], &optimizers[0], 1.0f, 100ms, &running[0]),
                   asio::detached);
    asio::co_spawn(swarm.network.get_executor(),
                   train_module(&problems[1], &optimizers[1], -2.0f, 170ms, &running[1]),
                   asio::detached);
    REQUIRE(swarm.run_until([&] { return !running[0] && !running[1]; }, 300s));

    CHECK(optimizers[0].statistics().rounds_averaged == 6);
    CHECK(problems[0].parameter_values() == problems[1].parameter_values());
    CHECK(problems[0].parameter_values() != linear_problem().parameter_values());
    const auto state0 = optimizers[0].optimizer().state_tensors(params[0].list());
    const auto state1 = optimizers[1].optimizer().state_tensors(params[1].list());
    REQUIRE(state0.size() == 4);
    for (std::size_t i = 0; i < state0.size(); ++i)
        CHECK(read(state0[i]) == read(state1[i]));
    CHECK(adam_state(*adams[0], problems[0].linear->weight).step() == 3);
    for (auto& o : optimizers)
        o.close();
    swarm.run_for(1s);
}

namespace {

/// Linear, then BatchNorm: a model with running statistics (float) and a batch count (int64).
struct batchnorm_net : torch::nn::Module {
    batchnorm_net()
        : fc(register_module("fc", torch::nn::Linear(4, 6)))
        , bn(register_module("bn", torch::nn::BatchNorm1d(6))) {
        const c10::NoGradGuard no_grad;
        std::vector<float> w(24);
        for (std::size_t i = 0; i < w.size(); ++i)
            w[i] = -1.0f + static_cast<float>(i) / 11.5f;
        fc->weight.copy_(tensor_of(w, {6, 4}));
        fc->bias.zero_();
    }

    /// Forward and backward in training mode on peer `peer`'s batch of step `step`, which
    /// updates the running statistics as training does. Those are then rounded to multiples
    /// of 1/64, so that the mean of four peers' is exact in float32 and the test's oracle can
    /// be equality.
    void train_step(std::size_t peer, std::uint64_t step) {
        for (auto& p : parameters())
            p.mutable_grad().zero_();
        std::vector<float> batch(32);
        for (std::size_t i = 0; i < batch.size(); ++i)
            batch[i] = (-1.0f + static_cast<float>(i) / 15.5f) * static_cast<float>(peer + 1) +
                       static_cast<float>(step % 5);
        const auto x = tensor_of(batch, {8, 4});
        bn->forward(fc->forward(x)).pow(2).mean().backward();
        const c10::NoGradGuard no_grad;
        for (auto* b : {&bn->running_mean, &bn->running_var})
            b->copy_((*b * 64).round() / 64);
    }

    std::vector<float> running_statistics() const {
        auto v = values_of(bn->running_mean);
        const auto var = values_of(bn->running_var);
        v.insert(v.end(), var.begin(), var.end());
        return v;
    }
    std::int64_t batches() const { return bn->num_batches_tracked.item<std::int64_t>(); }

    torch::nn::Linear fc;
    torch::nn::BatchNorm1d bn;
};

using sim_optimizer = ho::collaborative_optimizer<hivemesh::net::sim::transport>;

ho::collaborative_options batchnorm_options(std::size_t group) {
    using namespace std::chrono_literals;
    ho::collaborative_options o;
    o.run_id = "batchnorm";
    o.target_batch_size = 512;
    o.batch_size_per_step = 32;
    o.matchmaking_time = 3s;
    o.averaging_timeout = 10s;
    o.averaging.target_group_size = group;
    return o;
}

/// One peer of the BatchNorm swarm and what it saw at each epoch's end.
struct batchnorm_peer {
    batchnorm_peer(hivemesh::test::sim_peer& peer, std::size_t group)
        : params(ho::parameters_of(*net))
        , optimizer(peer, params.list(), ho::sgd({.lr = 0.1}), batchnorm_options(group),
                    params.buffers()) {}

    std::shared_ptr<batchnorm_net> net = std::make_shared<batchnorm_net>();
    ho::module_parameters params;
    sim_optimizer optimizer;
    std::vector<std::vector<float>> held_before_round, after_round;
    std::uint64_t steps = 0;
    bool running = true;
};

asio::awaitable<void> train_batchnorm(batchnorm_peer* p, std::size_t index,
                                      hivemesh::duration interval) {
    hivemesh::net::sim::timer timer(co_await asio::this_coro::executor);
    while (p->optimizer.local_epoch() < 2) {
        timer.expires_after(interval);
        co_await timer.async_wait(hivemesh::default_token_t{});
        p->net->train_step(index, p->steps++);
        const auto held = p->net->running_statistics();
        auto [ec, report] = co_await p->optimizer.async_step(0, hivemesh::default_token_t{});
        REQUIRE_FALSE(ec);
        if (report.epoch_ended) {
            CHECK(report.state_averaging.outcome == ho::round_outcome::averaged);
            p->held_before_round.push_back(held);
            p->after_round.push_back(p->net->running_statistics());
        }
    }
    p->running = false;
}

} // namespace

TEST_CASE("a BatchNorm model: each state round gives every peer the mean of the running "
          "statistics, each keeps its batch count, and a newcomer takes its donor's",
          "[optim][torch][collaborative]") {
    using namespace std::chrono_literals;
    // Staged through host memory as tensors on a GPU are, or read in place.
    const bool staging = GENERATE(false, true);
    INFO("host staging " << staging);
    const hivemesh::tensor::torch_host_staging_scope scope(staging);
    constexpr std::size_t peers = 4;
    hivemesh::test::sim_peers swarm(52);
    std::deque<batchnorm_peer> members;
    for (std::size_t p = 0; p < peers; ++p)
        members.emplace_back(swarm.add_peer(), peers);
    CHECK(members[0].params.buffers().averaged.size() == 2);
    CHECK(members[0].params.buffers().carried.size() == 1);
    REQUIRE(swarm.run_until(
        [&] {
            return std::all_of(members.begin(), members.end(), [](const batchnorm_peer& m) {
                return m.optimizer.global_progress().num_peers == peers;
            });
        },
        60s));
    const std::vector<hivemesh::duration> intervals{100ms, 170ms, 230ms, 130ms};
    for (std::size_t p = 0; p < peers; ++p)
        asio::co_spawn(swarm.network.get_executor(), train_batchnorm(&members[p], p, intervals[p]),
                       asio::detached);
    REQUIRE(swarm.run_until(
        [&] {
            return std::none_of(members.begin(), members.end(),
                                [](const batchnorm_peer& m) { return m.running; });
        },
        300s));

    for (std::size_t e = 0; e < 2; ++e) {
        INFO("epoch " << e);
        std::vector<float> mean(12, 0.0f);
        for (const auto& m : members) {
            REQUIRE(m.held_before_round.size() == 2);
            for (std::size_t j = 0; j < mean.size(); ++j)
                mean[j] += m.held_before_round[e][j] / static_cast<float>(peers);
        }
        for (const auto& m : members)
            CHECK(m.after_round[e] == mean);
    }
    for (const auto& m : members) // one forward pass a step, never averaged
        CHECK(m.net->batches() == static_cast<std::int64_t>(m.steps));
    CHECK(members[0].params.buffers().averaged.size() == 2);

    // A newcomer's first step finds the swarm ahead and downloads the state.
    auto& late = members.emplace_back(swarm.add_peer(), peers + 1);
    late.net->train_step(7, 0);
    std::optional<ho::step_report> first;
    late.optimizer.async_step(0, [&](std::error_code ec, ho::step_report r) {
        CHECK_FALSE(ec);
        first = r;
    });
    REQUIRE(swarm.run_until([&] { return first.has_value(); }, 60s));
    REQUIRE(first->state_loaded);
    REQUIRE_FALSE(first->state_error);
    CHECK(late.net->running_statistics() == members[0].net->running_statistics());
    CHECK(std::any_of(members.begin(), members.end() - 1, [&](const batchnorm_peer& m) {
        return m.net->batches() == late.net->batches();
    }));
    CHECK(late.net->batches() != 1);
    CHECK(values_of(late.net->fc->weight) == values_of(members[0].net->fc->weight));

    // The state of a libtorch model saves and restores through a checkpoint file's bytes.
    std::optional<ho::checkpoint> saved;
    members[1].optimizer.async_state_dict([&](std::error_code ec, ho::checkpoint c) {
        REQUIRE_FALSE(ec);
        saved = std::move(c);
    });
    REQUIRE(swarm.run_until([&] { return saved.has_value(); }, 60s));
    ho::checkpoint decoded;
    REQUIRE_FALSE(ho::decode(ho::encode(*saved), decoded));
    auto& restored = members.emplace_back(swarm.add_peer(), peers + 2);
    std::optional<std::error_code> loaded;
    restored.optimizer.async_load_state_dict(std::move(decoded),
                                             [&](std::error_code ec) { loaded = ec; });
    REQUIRE(swarm.run_until([&] { return loaded.has_value(); }, 60s));
    REQUIRE_FALSE(*loaded);
    CHECK(restored.net->running_statistics() == members[1].net->running_statistics());
    CHECK(restored.net->batches() == members[1].net->batches());
    CHECK(values_of(restored.net->fc->weight) == values_of(members[1].net->fc->weight));
    CHECK(values_of(restored.net->bn->weight) == values_of(members[1].net->bn->weight));
    CHECK(restored.optimizer.local_epoch() == 2);

    for (auto& m : members)
        m.optimizer.close();
    swarm.run_for(1s);
}
