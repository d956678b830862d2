// LAMB: hand-computed steps (bias correction, zero-norm layers, weight decay, the clamp of the
// weight norm), AdamW's steps at clamp_value 0, a double-precision reference on raw tensors for
// several option sets, the state tensors (exp_avg, exp_avg_sq) and a newcomer continuing from them,
// and option validation.
#include "support/errors.hpp"
#include "support/optimizers.hpp"

#include <hivemesh/optim.hpp>
#include <hivemesh/tensor.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace ho = hivemesh::optim;
using hivemesh::test::check_against_reference;
using hivemesh::test::check_close;
using hivemesh::test::check_values;
using hivemesh::test::newcomer_continues_donor;
using hivemesh::test::parameter_values;
using hivemesh::test::read;
using hivemesh::test::vector_parameters;

namespace {

constexpr double infinity = std::numeric_limits<double>::infinity();

/// LAMB written out plainly in double precision from the formulas in lamb.hpp.
class reference_lamb {
public:
    explicit reference_lamb(const ho::lamb_options& options)
        : options(options) {}

    void step(parameter_values& values, const parameter_values& grads) {
        if (exp_avg.empty()) {
            for (const auto& v : values) {
                exp_avg.emplace_back(v.size(), 0.0);
                exp_avg_sq.emplace_back(v.size(), 0.0);
            }
        }
        ++steps;
        const double t = static_cast<double>(steps);
        const bool correct = options.bias_correction;
        const double bias_correction1 = correct ? 1 - std::pow(options.beta1, t) : 1;
        const double bias_correction2 = correct ? 1 - std::pow(options.beta2, t) : 1;
        for (std::size_t k = 0; k < values.size(); ++k) {
            std::vector<double> r(values[k].size());
            double value_norm = 0, r_norm = 0;
            for (std::size_t i = 0; i < r.size(); ++i) {
                const double g = grads[k][i], p = values[k][i];
                double& m = exp_avg[k][i];
                double& v = exp_avg_sq[k][i];
                m = options.beta1 * m + (1 - options.beta1) * g;
                v = options.beta2 * v + (1 - options.beta2) * g * g;
                r[i] = (m / bias_correction1) / (std::sqrt(v / bias_correction2) + options.eps) +
                       options.weight_decay * p;
                value_norm += p * p;
                r_norm += r[i] * r[i];
            }
            const double weight_norm = std::min(std::sqrt(value_norm), options.clamp_value);
            r_norm = std::sqrt(r_norm);
            const double ratio = weight_norm > 0 && r_norm > 0 ? weight_norm / r_norm : 1.0;
            for (std::size_t i = 0; i < r.size(); ++i)
                values[k][i] -= options.lr * ratio * r[i];
        }
    }

    ho::lamb_options options;
    parameter_values exp_avg;
    parameter_values exp_avg_sq;
    std::uint64_t steps = 0;
};

/// The values of a two-element parameter starting at (3, 4), norm 5, after one step with each
/// of `grads`, flattened step after step.
std::vector<float> three_four_run(const ho::lamb_options& options,
                                  const std::vector<std::vector<float>>& grads) {
    std::vector<float> value{3.0f, 4.0f}, grad(2);
    const std::vector<ho::parameter> params{{value, grad}};
    auto optimizer = ho::lamb(options);
    std::vector<float> after;
    for (const auto& g : grads) {
        grad = g;
        optimizer.step(params);
        after.insert(after.end(), value.begin(), value.end());
    }
    return after;
}

/// The same run with reference_lamb.
std::vector<double> three_four_reference(const ho::lamb_options& options,
                                         const std::vector<std::vector<float>>& grads) {
    parameter_values values{{3, 4}};
    reference_lamb reference(options);
    std::vector<double> after;
    for (const auto& g : grads) {
        reference.step(values, {{g.begin(), g.end()}});
        after.insert(after.end(), values[0].begin(), values[0].end());
    }
    return after;
}

std::vector<ho::lamb_options> option_sets() {
    return {
        // The layers' norms start at √7.625 = 2.76, 1.5 and √2424.75 = 49.24 and stay near them.
        // The default clamp (10) cuts the third's to 10 on every step and keeps the other two,
        // whose ratios reach 28.8 and, in the second set, 12.4 (both on step 2): above 10.
        {.lr = 0.01},
        {.lr = 0.05, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-3, .weight_decay = 0.01},
        // Ratios below 1.
        {.lr = 0.02, .weight_decay = 0.1, .bias_correction = false},
        // Every weight norm clamped to 1.25 on every step (they are 1.5 to 49.24).
        {.lr = 0.05, .eps = 0.1, .clamp_value = 1.25},
        // No clamp: the third layer's ratio is 49.24 / 20.14 = 2.44 on step 1; one of 23.1 too.
        {.lr = 0.03,
         .beta1 = 0,
         .beta2 = 0.5,
         .eps = 0.05,
         .weight_decay = 0.05,
         .clamp_value = infinity},
        // Every weight norm 0, so every ratio 1.
        {.lr = 0.01, .eps = 1e-3, .weight_decay = 0.1, .clamp_value = 0},
    };
}

std::string describe(const ho::lamb_options& o) {
    return "lr " + std::to_string(o.lr) + ", betas " + std::to_string(o.beta1) + " " +
           std::to_string(o.beta2) + ", eps " + std::to_string(o.eps) + ", weight_decay " +
           std::to_string(o.weight_decay) + ", bias_correction " +
           std::to_string(o.bias_correction) + ", clamp_value " + std::to_string(o.clamp_value);
}

} // namespace

TEST_CASE("lamb matches a hand-computed step", "[optim][lamb]") {
    // θ = (3, 4), g = (0.5, −0.25). On the first step the bias-corrected moments are g and g²,
    // so with eps 0.25: r = (0.5 / 0.75, −0.25 / 0.5) = (2/3, −1/2), ‖r‖ = 5/6, and the trust
    // ratio is 5 / (5/6) = 6. With lr 0.1: θ = (3 − 0.1·6·2/3, 4 + 0.1·6·1/2) = (2.6, 4.3).
    const double r0 = 0.5 / (0.5 + 0.25), r1 = -0.25 / (0.25 + 0.25);
    const double ratio = 5 / std::sqrt(r0 * r0 + r1 * r1);
    const std::vector<double> expected{3 - 0.1 * ratio * r0, 4 - 0.1 * ratio * r1};
    CHECK(expected[0] == Approx(2.6).epsilon(1e-12));
    CHECK(expected[1] == Approx(4.3).epsilon(1e-12));
    check_values(three_four_run({.lr = 0.1, .eps = 0.25}, {{0.5f, -0.25f}}), expected);

    // The step's length is lr·ratio·‖r‖ = lr·‖θ‖ (5, below the clamp) whatever the gradient's
    // scale: a gradient 1000 times larger (so that eps no longer matters) moves θ by 0.1·5 along r
    // = (1, −1).
    const double shift = 0.1 * 5 / std::sqrt(2.0);
    check_values(three_four_run({.lr = 0.1}, {{500.0f, -250.0f}}), {3 - shift, 4 + shift});
}

TEST_CASE("lamb corrects the bias of both moments over two steps", "[optim][lamb]") {
    // β1 = β2 = 0.5: the corrections are 1 − 0.5^t, 0.5 and then 0.75. The first step is the
    // hand-computed one above (m = (0.25, −0.125), v = (0.125, 0.03125)); the second, with
    // g = (0.25, 0.5), makes m = (0.25, 0.1875) and v = (0.09375, 0.140625), so with eps 0.25
    // r = (0.552285, 0.366025), the ratio is 7.584062 and θ = (2.181144, 4.022404).
    const std::vector<std::vector<float>> grads{{0.5f, -0.25f}, {0.25f, 0.5f}};
    const ho::lamb_options options{.lr = 0.1, .beta1 = 0.5, .beta2 = 0.5, .eps = 0.25};
    const double r0 = (0.25 / 0.75) / (std::sqrt(0.09375 / 0.75) + 0.25);
    const double r1 = (0.1875 / 0.75) / (std::sqrt(0.140625 / 0.75) + 0.25);
    const double ratio = std::sqrt(2.6 * 2.6 + 4.3 * 4.3) / std::sqrt(r0 * r0 + r1 * r1);
    const std::vector<double> expected{2.6, 4.3, 2.6 - 0.1 * ratio * r0, 4.3 - 0.1 * ratio * r1};
    CHECK(expected[2] == Approx(2.181144).epsilon(1e-6));
    CHECK(expected[3] == Approx(4.022404).epsilon(1e-6));
    check_values(three_four_run(options, grads), expected);

    // Without the correction m = (0.25, −0.125) and √v = (0.353553, 0.176777) on the first
    // step: θ = (2.591752, 4.288675), then (2.174959, 4.010498).
    auto uncorrected = options;
    uncorrected.bias_correction = false;
    const auto reference = three_four_reference(uncorrected, grads);
    check_values(three_four_run(uncorrected, grads), reference);
    CHECK(reference[0] == Approx(2.591752).epsilon(1e-6));
    CHECK(reference[3] == Approx(4.010498).epsilon(1e-6));
}

TEST_CASE("lamb takes a trust ratio of 1 for a zero-norm layer or a zero update", "[optim][lamb]") {
    // Three layers in one step, each with its own ratio: θ = 0 (ratio 1, θ = −lr·r), a zero
    // gradient (r = 0: ratio 1 and no change), and (3, 4) with ratio 6 as in the hand-computed
    // step.
    std::vector<float> zero_value{0.0f, 0.0f}, zero_value_grad{0.5f, -0.25f};
    std::vector<float> still_value{3.0f, 4.0f}, still_grad{0.0f, 0.0f};
    std::vector<float> value{3.0f, 4.0f}, grad{0.5f, -0.25f};
    const std::vector<ho::parameter> params{
        {zero_value, zero_value_grad}, {still_value, still_grad}, {value, grad}};
    auto optimizer = ho::lamb({.lr = 0.1, .eps = 0.25});
    optimizer.step(params);
    // −0.1·(2/3, −1/2)
    check_values(zero_value, {-0.1 * 2 / 3, 0.05});
    CHECK(still_value == std::vector<float>{3.0f, 4.0f});
    check_values(value, {2.6, 4.3});

    // The zero-norm layer now has a norm, so its next ratio is ‖θ‖/‖r‖; the zero-gradient
    // layer still does not move.
    parameter_values expected{{0, 0}, {3, 4}, {3, 4}};
    reference_lamb reference({.lr = 0.1, .eps = 0.25});
    const parameter_values grads{{0.5, -0.25}, {0, 0}, {0.5, -0.25}};
    reference.step(expected, grads);
    reference.step(expected, grads);
    optimizer.step(params);
    check_close(zero_value, expected[0]);
    CHECK(still_value == std::vector<float>{3.0f, 4.0f});
    check_close(value, expected[2]);
}

TEST_CASE("lamb adds weight decay to the update before the trust ratio", "[optim][lamb]") {
    // r = (2/3 + 0.1·3, −1/2 + 0.1·4) = (0.966667, −0.1), ratio 5/‖r‖ = 5.144958, so
    // θ = (2.502654, 4.051450).
    const double r0 = 2.0 / 3 + 0.1 * 3, r1 = -0.5 + 0.1 * 4;
    const double ratio = 5 / std::sqrt(r0 * r0 + r1 * r1);
    const std::vector<double> expected{3 - 0.1 * ratio * r0, 4 - 0.1 * ratio * r1};
    CHECK(expected[0] == Approx(2.502654).epsilon(1e-6));
    CHECK(expected[1] == Approx(4.051450).epsilon(1e-6));
    check_values(three_four_run({.lr = 0.1, .eps = 0.25, .weight_decay = 0.1}, {{0.5f, -0.25f}}),
                 expected);

    // With a zero gradient r = weight_decay·θ, the ratio 1/weight_decay, and the step shrinks θ
    // by lr: (3, 4)·(1 − 0.1) with weight decay 0.5 (ratio 2).
    check_values(three_four_run({.lr = 0.1, .eps = 0.25, .weight_decay = 0.5}, {{0.0f, 0.0f}}),
                 {2.7, 3.6});
}

TEST_CASE("lamb clamps the weight norm to clamp_value", "[optim][lamb]") {
    // φ(‖θ‖) = min(‖θ‖, clamp_value) replaces ‖θ‖ in the ratio, so a step moves θ by
    // lr·φ(‖θ‖). The hand-computed step has ‖θ‖ = 5, below the default clamp (10), and ratio 6.
    // At clamp_value 2 the ratio is 2 / (5/6) = 2.4 and θ moves by 0.1·2 = 0.2 along
    // r/‖r‖ = (0.8, −0.6): θ = (3 − 0.1·2.4·2/3, 4 + 0.1·2.4·1/2) = (2.84, 4.12).
    check_values(three_four_run({.lr = 0.1, .eps = 0.25, .clamp_value = 2}, {{0.5f, -0.25f}}),
                 {2.84, 4.12});
    // A ratio above the clamp is kept: with a zero gradient and weight decay 0.05, r = 0.05·θ,
    // ‖r‖ = 0.25, the ratio 5 / 0.25 = 20, and θ·(1 − 0.1·20·0.05) = (2.7, 3.6). At clamp_value
    // 2.5 the ratio is 10: θ·(1 − 0.1·10·0.05) = (2.85, 3.8).
    const ho::lamb_options decay{.lr = 0.1, .eps = 0.25, .weight_decay = 0.05};
    check_values(three_four_run(decay, {{0.0f, 0.0f}}), {2.7, 3.6});
    auto clamped = decay;
    clamped.clamp_value = 2.5;
    check_values(three_four_run(clamped, {{0.0f, 0.0f}}), {2.85, 3.8});

    // θ = (30, 40), ‖θ‖ = 50, and the hand-computed gradient, r = (2/3, −1/2), ‖r‖ = 5/6.
    const auto thirty_forty = [](const ho::lamb_options& options) {
        std::vector<float> value{30.0f, 40.0f}, grad{0.5f, -0.25f};
        auto optimizer = ho::lamb(options);
        optimizer.step(std::vector<ho::parameter>{{value, grad}});
        return value;
    };
    // The default clamp: ratio 10 / (5/6) = 12, θ = (30 − 0.1·12·2/3, 40 + 0.1·12·1/2)
    // = (29.2, 40.6), a step of 0.1·10 = 1.
    check_values(thirty_forty({.lr = 0.1, .eps = 0.25}), {29.2, 40.6});
    // Infinity and hivemind's ALBERT clamp (10000) do not cut 50: ratio 50 / (5/6) = 60,
    // θ = (30 − 0.1·60·2/3, 40 + 0.1·60·1/2) = (26, 43), a step of 0.1·50 = 5.
    check_values(thirty_forty({.lr = 0.1, .eps = 0.25, .clamp_value = infinity}), {26, 43});
    check_values(thirty_forty({.lr = 0.1, .eps = 0.25, .clamp_value = 10000}), {26, 43});

    // 0 makes every weight norm 0 and so every ratio 1 (the zero-norm rule): θ −= lr·r, a step
    // of 0.1·5/6 whatever ‖θ‖: (3 − 0.1·2/3, 4 + 0.1·1/2) = (2.933333, 4.05) and (29.933333,
    // 40.05). Nothing freezes, and a zero-norm layer moves as with any clamp: θ = −0.1·r.
    check_values(three_four_run({.lr = 0.1, .eps = 0.25, .clamp_value = 0}, {{0.5f, -0.25f}}),
                 {3 - 0.1 * 2 / 3, 4.05});
    check_values(thirty_forty({.lr = 0.1, .eps = 0.25, .clamp_value = 0}),
                 {30 - 0.1 * 2 / 3, 40.05});
    std::vector<float> zero_value{0.0f, 0.0f}, grad{0.5f, -0.25f};
    auto optimizer = ho::lamb({.lr = 0.1, .eps = 0.25, .clamp_value = 0});
    optimizer.step(std::vector<ho::parameter>{{zero_value, grad}});
    check_values(zero_value, {-0.1 * 2 / 3, 0.05});
    // 0 is not the limit of small clamps, which shrink the step to lr·clamp_value: at 1e-3 the
    // ratio is 1e-3 / (5/6) = 0.0012 and θ = (3 − 0.1·0.0012·2/3, 4 + 0.1·0.0012·1/2)
    // = (2.99992, 4.00006).
    check_values(three_four_run({.lr = 0.1, .eps = 0.25, .clamp_value = 1e-3}, {{0.5f, -0.25f}}),
                 {2.99992, 4.00006});
}

TEST_CASE("lamb with clamp_value 0 takes AdamW's steps", "[optim][lamb]") {
    // Ratio 1 leaves θ −= lr·(m̂/(√v̂ + eps) + wd·θ) = θ·(1 − lr·wd) − lr·m̂/(√v̂ + eps): AdamW
    // with the same lr and weight decay, checked against the double-precision Adam reference.
    vector_parameters tensors;
    auto optimizer = ho::lamb({.lr = 0.01,
                               .beta1 = 0.8,
                               .beta2 = 0.99,
                               .eps = 1e-3,
                               .weight_decay = 0.1,
                               .clamp_value = 0});
    hivemesh::test::reference_adam reference({.lr = 0.01,
                                              .beta1 = 0.8,
                                              .beta2 = 0.99,
                                              .eps = 1e-3,
                                              .weight_decay = 0.1,
                                              .decoupled_weight_decay = true});
    check_against_reference(optimizer, reference, tensors.params, 4);
}

TEST_CASE("lamb follows the reference on std::vector for several option sets", "[optim][lamb]") {
    for (const auto& options : option_sets()) {
        INFO(describe(options));
        vector_parameters tensors;
        auto optimizer = ho::lamb(options);
        reference_lamb reference(options);
        check_against_reference(optimizer, reference, tensors.params, 4);
    }
}

TEST_CASE("lamb follows the reference on std::span", "[optim][lamb]") {
    const ho::lamb_options options{.lr = 0.03, .eps = 1e-3, .weight_decay = 0.2};
    hivemesh::test::span_parameters tensors;
    auto optimizer = ho::lamb(options);
    reference_lamb reference(options);
    check_against_reference(optimizer, reference, tensors.params, 3);
}

TEST_CASE("lamb state tensors are exp_avg and exp_avg_sq of each parameter",
          "[optim][lamb][state]") {
    const ho::lamb_options options{.lr = 0.01, .beta1 = 0.8, .weight_decay = 0.1};
    hivemesh::test::check_moment_state_tensors(ho::lamb(options), reference_lamb(options));
}

TEST_CASE("lamb continues from state written into its state tensors", "[optim][lamb][state]") {
    const auto continues = [](const ho::lamb_options& options, bool copy_step_count) {
        return newcomer_continues_donor(ho::lamb(options), ho::lamb(options), copy_step_count);
    };
    // A newcomer given the donor's state and step count continues it bit for bit.
    CHECK(continues({.lr = 0.01, .eps = 0.1, .weight_decay = 0.1}, true));
    CHECK(continues({.lr = 0.01, .bias_correction = false}, true));
    // Without the count its bias correction differs (visible through eps).
    CHECK_FALSE(continues({.lr = 0.01, .eps = 0.1}, false));

    // State written by hand: m = 0.5 and v = 0.25 before a step with g = 0 and β1 = β2 = 0.5
    // without bias correction give m = 0.25, v = 0.125, r = 0.25 / (√0.125 + 0.25) = 0.414214
    // for both elements, and θ = (3, 4) − 0.1·(5/(0.414214·√2))·0.414214 = (3, 4) − 0.353553.
    std::vector<float> value{3.0f, 4.0f}, grad{0.0f, 0.0f};
    const std::vector<ho::parameter> params{{value, grad}};
    auto optimizer =
        ho::lamb({.lr = 0.1, .beta1 = 0.5, .beta2 = 0.5, .eps = 0.25, .bias_correction = false});
    const auto state = optimizer.state_tensors(params);
    REQUIRE(state.size() == 2);
    state[0].copy_from(std::vector<float>{0.5f, 0.5f});
    state[1].copy_from(std::vector<float>{0.25f, 0.25f});
    optimizer.step(params);
    CHECK(read(state[0]) == std::vector<float>{0.25f, 0.25f});
    CHECK(read(state[1]) == std::vector<float>{0.125f, 0.125f});
    const double shift = 0.1 * 5 / std::sqrt(2.0);
    check_values(value, {3 - shift, 4 - shift});
    CHECK(optimizer.step_count() == 1);
}

TEST_CASE("lamb uses a changed learning rate from the next step", "[optim][lamb]") {
    const ho::lamb_options options{.lr = 0.1, .eps = 0.25, .weight_decay = 0.01};
    std::vector<float> value{3.0f, 4.0f}, grad{0.5f, -0.25f};
    const std::vector<ho::parameter> params{{value, grad}};
    auto optimizer = ho::lamb(options);
    CHECK(optimizer.learning_rate() == 0.1);
    parameter_values expected{{3, 4}};
    reference_lamb reference(options);

    optimizer.step(params);
    reference.step(expected, {{0.5, -0.25}});
    optimizer.set_learning_rate(0.01);
    CHECK(optimizer.learning_rate() == 0.01);
    reference.options.lr = 0.01;
    optimizer.step(params);
    reference.step(expected, {{0.5, -0.25}});
    check_close(value, expected[0]);
    CHECK(optimizer.step_count() == 2);

    CHECK_THROWS_AS(optimizer.set_learning_rate(-0.1), std::invalid_argument);
    CHECK(optimizer.learning_rate() == 0.01);
    CHECK(optimizer.name() == "lamb");
}

TEST_CASE("lamb checks its parameters before changing anything", "[optim][lamb][errors]") {
    auto optimizer = ho::lamb({.lr = 0.1});
    std::vector<float> v0{1, 2, 3}, g0{1, 1, 1}, v1{4, 5}, g1{1, 1, 1};
    const std::vector<ho::parameter> params{{v0, g0}, {v1, g1}};
    CHECK(hivemesh::test::thrown_code([&] { optimizer.step(params); }) ==
          hivemesh::errc::size_mismatch);
    CHECK(v0 == std::vector<float>{1, 2, 3});
    CHECK(optimizer.step_count() == 0);
}

TEST_CASE("lamb rejects invalid options and names them", "[optim][lamb][errors]") {
    using Catch::Matchers::Contains;
    CHECK_THROWS_WITH(ho::lamb({.lr = -1e-3}), Contains("lamb: invalid lr -0.001"));
    CHECK_THROWS_AS(ho::lamb({.lr = std::nan("")}), std::invalid_argument);
    CHECK_THROWS_WITH(ho::lamb({.beta1 = 1.0}), Contains("beta1"));
    CHECK_THROWS_WITH(ho::lamb({.beta1 = -0.1}), Contains("beta1"));
    CHECK_THROWS_WITH(ho::lamb({.beta2 = 1.0}), Contains("invalid beta2 1 (must be in [0, 1))"));
    CHECK_THROWS_WITH(ho::lamb({.beta2 = std::nan("")}), Contains("beta2"));
    CHECK_THROWS_WITH(ho::lamb({.eps = -1e-6}), Contains("invalid eps -1e-06"));
    CHECK_THROWS_WITH(ho::lamb({.weight_decay = -0.1}), Contains("weight_decay"));
    CHECK_THROWS_WITH(ho::lamb({.clamp_value = -1}), Contains("invalid clamp_value -1"));
    CHECK_THROWS_WITH(ho::lamb({.clamp_value = std::nan("")}), Contains("invalid clamp_value nan"));
    CHECK_THROWS_AS(ho::lamb({.clamp_value = -infinity}), std::invalid_argument);
    CHECK_THROWS_AS(ho::lamb({.beta1 = 1.0}), std::invalid_argument);
    CHECK_NOTHROW(ho::lamb({.lr = 0,
                            .beta1 = 0,
                            .beta2 = 0,
                            .eps = 0,
                            .weight_decay = 0,
                            .bias_correction = false,
                            .clamp_value = infinity}));
    CHECK_NOTHROW(ho::lamb({.clamp_value = 0}));
    auto optimizer = ho::lamb({});
    CHECK_THROWS_WITH(optimizer.set_learning_rate(-1), Contains("lr"));
}
