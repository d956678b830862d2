// SGD: hand-computed steps, the double-precision reference on raw tensors for every option,
// learning-rate changes, its state tensors, and option validation.
#include "support/optimizers.hpp"

#include <hivemesh/optim.hpp>
#include <hivemesh/tensor.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace ho = hivemesh::optim;
using hivemesh::test::check_against_reference;
using hivemesh::test::check_values;
using hivemesh::test::read;
using hivemesh::test::reference_sgd;
using hivemesh::test::vector_parameters;

namespace {

/// The value of a one-element parameter starting at 1 after each step with these gradients.
std::vector<float> one_element_run(const ho::sgd_options& options,
                                   const std::vector<float>& grads) {
    std::vector<float> value{1.0f}, grad{0.0f};
    const std::vector<ho::parameter> params{{value, grad}};
    auto optimizer = ho::sgd(options);
    std::vector<float> after;
    for (const float g : grads) {
        grad[0] = g;
        optimizer.step(params);
        after.push_back(value[0]);
    }
    return after;
}

/// Every option combination the reference test runs.
std::vector<ho::sgd_options> option_sets() {
    return {
        {.lr = 0.1},
        {.lr = 0.1, .momentum = 0.9},
        {.lr = 0.1, .momentum = 0.9, .dampening = 0.3},
        {.lr = 0.05, .momentum = 0.8, .nesterov = true},
        {.lr = 0.1, .weight_decay = 0.2},
        {.lr = 0.05, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.1},
        {.lr = 0.05, .momentum = 0.9, .nesterov = true, .weight_decay = 0.1},
    };
}

std::string describe(const ho::sgd_options& o) {
    return "lr " + std::to_string(o.lr) + ", momentum " + std::to_string(o.momentum) +
           ", dampening " + std::to_string(o.dampening) + ", nesterov " +
           std::to_string(o.nesterov) + ", weight_decay " + std::to_string(o.weight_decay);
}

} // namespace

TEST_CASE("sgd matches hand-computed steps", "[optim][sgd]") {
    // From 1 with gradient 0.5 twice and lr 0.1.
    check_values(one_element_run({.lr = 0.1}, {0.5f, 0.5f}), {0.95, 0.9});
    // Momentum 0.9: the buffer starts as the gradient (0.5), then 0.9·0.5 + 0.5 = 0.95.
    check_values(one_element_run({.lr = 0.1, .momentum = 0.9}, {0.5f, 0.5f}), {0.95, 0.855});
    // Dampening 0.5 does not touch the first buffer; then 0.9·0.5 + 0.5·0.5 = 0.7.
    check_values(one_element_run({.lr = 0.1, .momentum = 0.9, .dampening = 0.5}, {0.5f, 0.5f}),
                 {0.95, 0.88});
    // Nesterov: d = g + 0.9·buffer: 0.95, then 0.5 + 0.9·0.95 = 1.355.
    check_values(one_element_run({.lr = 0.1, .momentum = 0.9, .nesterov = true}, {0.5f, 0.5f}),
                 {0.905, 0.7695});
    // Weight decay 0.1 adds 0.1·θ: d = 0.6, then 0.5 + 0.094 = 0.594.
    check_values(one_element_run({.lr = 0.1, .weight_decay = 0.1}, {0.5f, 0.5f}), {0.94, 0.8806});
}

TEST_CASE("sgd follows the reference on std::vector for every option", "[optim][sgd]") {
    for (const auto& options : option_sets()) {
        INFO(describe(options));
        vector_parameters tensors;
        auto optimizer = ho::sgd(options);
        reference_sgd reference(options);
        check_against_reference(optimizer, reference, tensors.params, 3);
    }
}

TEST_CASE("sgd follows the reference on std::span", "[optim][sgd]") {
    const ho::sgd_options options{
        .lr = 0.05, .momentum = 0.9, .dampening = 0.2, .weight_decay = 0.1};
    hivemesh::test::span_parameters tensors;
    auto optimizer = ho::sgd(options);
    reference_sgd reference(options);
    check_against_reference(optimizer, reference, tensors.params, 3);
}

TEST_CASE("sgd uses a changed learning rate from the next step", "[optim][sgd]") {
    std::vector<float> value{1.0f}, grad{0.5f};
    const std::vector<ho::parameter> params{{value, grad}};
    auto optimizer = ho::sgd({.lr = 0.1, .momentum = 0.9});
    CHECK(optimizer.learning_rate() == 0.1);
    optimizer.step(params);
    optimizer.set_learning_rate(0.01);
    CHECK(optimizer.learning_rate() == 0.01);
    optimizer.step(params);
    // 1 − 0.1·0.5 − 0.01·0.95
    CHECK(value[0] == Approx(0.9405).epsilon(1e-6));
    CHECK_THROWS_AS(optimizer.set_learning_rate(-0.1), std::invalid_argument);
    CHECK(optimizer.learning_rate() == 0.01);
}

TEST_CASE("sgd state tensors are the momentum buffers", "[optim][sgd][state]") {
    const ho::sgd_options options{.lr = 0.1, .momentum = 0.9, .dampening = 0.3};
    vector_parameters tensors;
    auto optimizer = ho::sgd(options);

    // Before the first step: one zero buffer per parameter, of its size.
    const auto state = optimizer.state_tensors(tensors.params);
    REQUIRE(state.size() == 3);
    CHECK(optimizer.state_names(tensors.params) == std::vector<std::string>(3, "momentum_buffer"));
    for (std::size_t k = 0; k < state.size(); ++k) {
        CHECK(state[k].size() == tensors.values[k].size());
        CHECK(read(state[k]) == std::vector<float>(tensors.values[k].size(), 0.0f));
    }

    // After steps the same references hold the reference's buffers.
    reference_sgd reference(options);
    check_against_reference(optimizer, reference, tensors.params, 3);
    for (std::size_t k = 0; k < state.size(); ++k)
        hivemesh::test::check_close(read(state[k]), reference.momentum_buffers[k],
                                    hivemesh::test::state_margin);
}

TEST_CASE("sgd without momentum has no state tensors", "[optim][sgd][state]") {
    vector_parameters tensors;
    auto optimizer = ho::sgd({.lr = 0.1});
    CHECK(optimizer.state_tensors(tensors.params).empty());
    CHECK(optimizer.state_names(tensors.params).empty());
    optimizer.step(tensors.params);
    CHECK(optimizer.state_tensors(tensors.params).empty());
    CHECK(optimizer.name() == "sgd");
}

TEST_CASE("sgd rejects invalid options and names them", "[optim][sgd][errors]") {
    using Catch::Matchers::Contains;
    CHECK_THROWS_WITH(ho::sgd({.lr = -0.1}), Contains("sgd: invalid lr -0.1"));
    CHECK_THROWS_AS(ho::sgd({.lr = std::nan("")}), std::invalid_argument);
    CHECK_THROWS_WITH(ho::sgd({.lr = 0.1, .momentum = -0.5}), Contains("momentum"));
    CHECK_THROWS_WITH(ho::sgd({.lr = 0.1, .weight_decay = -1}), Contains("weight_decay"));
    CHECK_THROWS_WITH(ho::sgd({.lr = 0.1, .nesterov = true}), Contains("nesterov"));
    CHECK_THROWS_WITH(ho::sgd({.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .nesterov = true}),
                      Contains("nesterov"));
    CHECK_THROWS_AS(ho::sgd({.lr = -0.1}), std::invalid_argument);
    CHECK_NOTHROW(ho::sgd({.lr = 0, .momentum = 0.9, .nesterov = true}));
}
