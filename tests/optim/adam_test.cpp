// Adam and AdamW: hand-computed steps, the double-precision reference on raw tensors for
// several option sets, the state tensors (exp_avg, exp_avg_sq), and option validation.
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
using hivemesh::test::check_close;
using hivemesh::test::check_values;
using hivemesh::test::read;
using hivemesh::test::reference_adam;
using hivemesh::test::vector_parameters;

namespace {

/// The value of a one-element parameter starting at 1 after each step with gradient 0.5.
std::vector<float> constant_gradient_run(const ho::adam_options& options, std::size_t steps) {
    std::vector<float> value{1.0f}, grad{0.5f};
    const std::vector<ho::parameter> params{{value, grad}};
    auto optimizer = ho::adam(options);
    std::vector<float> after;
    for (std::size_t i = 0; i < steps; ++i) {
        optimizer.step(params);
        after.push_back(value[0]);
    }
    return after;
}

std::vector<ho::adam_options> option_sets() {
    return {
        {.lr = 0.01},
        {.lr = 0.05, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6},
        {.lr = 0.01, .weight_decay = 0.1},
        {.lr = 0.01, .weight_decay = 0.1, .decoupled_weight_decay = true},
        {.lr = 0.02,
         .beta1 = 0,
         .beta2 = 0.5,
         .eps = 1e-3,
         .weight_decay = 0.05,
         .decoupled_weight_decay = true},
    };
}

std::string describe(const ho::adam_options& o) {
    return "lr " + std::to_string(o.lr) + ", betas " + std::to_string(o.beta1) + " " +
           std::to_string(o.beta2) + ", eps " + std::to_string(o.eps) + ", weight_decay " +
           std::to_string(o.weight_decay) + (o.decoupled_weight_decay ? " (AdamW)" : "");
}

} // namespace

TEST_CASE("adam matches hand-computed steps", "[optim][adam]") {
    // With a constant gradient the bias-corrected moments are g and g², so every step moves
    // by lr·g / (|g| + eps): here 0.1 (eps is below float resolution).
    check_values(constant_gradient_run({.lr = 0.1}, 3), {0.9, 0.8, 0.7});
    // A large eps shows: 0.1·0.5 / (0.5 + 0.5) = 0.05 a step.
    check_values(constant_gradient_run({.lr = 0.1, .eps = 0.5}, 2), {0.95, 0.9});
    // AdamW first multiplies θ by 1 − 0.1·0.1 = 0.99, then moves by 0.1.
    check_values(
        constant_gradient_run({.lr = 0.1, .weight_decay = 0.1, .decoupled_weight_decay = true}, 3),
        {0.89, 0.7811, 0.673289});
    // Adam's L2 term changes the gradient (0.5 + 0.1·1 = 0.6), not the first step's size.
    check_values(constant_gradient_run({.lr = 0.1, .weight_decay = 0.1}, 1), {0.9});
}

TEST_CASE("adam follows the reference on std::vector for several option sets", "[optim][adam]") {
    for (const auto& options : option_sets()) {
        INFO(describe(options));
        vector_parameters tensors;
        auto optimizer = ho::adam(options);
        reference_adam reference(options);
        check_against_reference(optimizer, reference, tensors.params, 4);
    }
}

TEST_CASE("adamw follows the reference on std::span", "[optim][adam]") {
    const ho::adam_options options{.lr = 0.03, .weight_decay = 0.2, .decoupled_weight_decay = true};
    hivemesh::test::span_parameters tensors;
    auto optimizer = ho::adam(options);
    reference_adam reference(options);
    check_against_reference(optimizer, reference, tensors.params, 3);
}

TEST_CASE("adam state tensors are exp_avg and exp_avg_sq of each parameter",
          "[optim][adam][state]") {
    const ho::adam_options options{.lr = 0.01, .beta1 = 0.8, .weight_decay = 0.1};
    hivemesh::test::check_moment_state_tensors(ho::adam(options), reference_adam(options));
}

TEST_CASE("adam and adamw are named", "[optim][adam]") {
    CHECK(ho::adam({}).name() == "adam");
    CHECK(ho::adam({.decoupled_weight_decay = true}).name() == "adamw");
    CHECK(ho::adam({.lr = 0.5}).learning_rate() == 0.5);
}

TEST_CASE("adam rejects invalid options and names them", "[optim][adam][errors]") {
    using Catch::Matchers::Contains;
    CHECK_THROWS_WITH(ho::adam({.lr = -1e-3}), Contains("lr"));
    CHECK_THROWS_WITH(ho::adam({.beta1 = 1.0}), Contains("beta1"));
    CHECK_THROWS_WITH(ho::adam({.beta1 = -0.1}), Contains("beta1"));
    CHECK_THROWS_WITH(ho::adam({.beta2 = 1.0}), Contains("beta2"));
    CHECK_THROWS_WITH(ho::adam({.beta2 = std::nan("")}), Contains("beta2"));
    CHECK_THROWS_WITH(ho::adam({.eps = -1e-8}), Contains("invalid eps -1e-08"));
    CHECK_THROWS_WITH(ho::adam({.weight_decay = -0.1, .decoupled_weight_decay = true}),
                      Contains("weight_decay") && Contains("adamw"));
    CHECK_THROWS_AS(ho::adam({.beta1 = 1.0}), std::invalid_argument);
    CHECK_NOTHROW(ho::adam({.lr = 0, .beta1 = 0, .beta2 = 0, .eps = 0}));
    auto optimizer = ho::adam({});
    CHECK_THROWS_WITH(optimizer.set_learning_rate(-1), Contains("lr"));
}
