// LAMB, layer-wise adaptive moments (You et al., "Large Batch Optimization for Deep Learning",
// Algorithm 2). Each parameter is a layer; with t the step count after the increment:
//
//     m = β1·m + (1 − β1)·g
//     v = β2·v + (1 − β2)·g²
//     r = m̂ / (√v̂ + eps) + weight_decay·θ      m̂ = m / (1 − β1^t), v̂ = v / (1 − β2^t)
//     ratio = φ(‖θ‖) / ‖r‖, or 1 if either is 0      φ(‖θ‖) = min(‖θ‖, clamp_value)
//     θ = θ − lr·ratio·r
//
// Unless the ratio falls back to 1, a step moves a parameter by lr·φ(‖θ‖) ≤ lr·clamp_value. Without
// bias correction m̂ = m and v̂ = v. The bias correction is the paper's, inside r, so the ratio's
// division by ‖r‖ cancels its common factor √(1 − β2^t)/(1 − β1^t) (exactly when eps and
// weight_decay are 0 and the ratio does not fall back to 1), whereas torch_optimizer.Lamb's
// `debias` multiplies the step size by that factor outside the ratio, where it is not cancelled and
// scales the early steps (by 0.32 at t = 1 with the default betas). The norms are L2 over the whole
// parameter, summed in double; element arithmetic is float32 as in adam.hpp, scalars double first.
// The state is m (exp_avg) and v (exp_avg_sq) per parameter, and the step count.
#pragma once

#include "hivemesh/optim/adam.hpp" // detail::sqrt_in_place
#include "hivemesh/optim/local_optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace hivemesh::optim {

/// Options of lamb().
struct lamb_options {
    double lr = 1e-3;
    double beta1 = 0.9;
    double beta2 = 0.999;
    double eps = 1e-6;
    double weight_decay = 0;
    bool bias_correction = true; ///< divide m by 1 − β1^t and v by 1 − β2^t
    /// φ(‖θ‖) = min(‖θ‖, clamp_value) replaces the weight norm in the trust ratio (the paper's
    /// φ; torch_optimizer.Lamb's clamp_value, whose default is this 10; hivemind's ALBERT
    /// example passes 10000). Infinity means no clamp. 0 makes every weight norm 0 and so every
    /// ratio 1: no trust ratio at all, each step is AdamW's with the same lr and weight_decay
    /// (θ −= lr·r). That is not the limit of small values, which shrink every step to at most
    /// lr·clamp_value.
    double clamp_value = 10;
};

namespace detail {

/// One step's scalars, in float32 as the update computes with them.
struct lamb_coefficients {
    float beta1;
    float one_minus_beta1;
    float beta2;
    float one_minus_beta2;
    float bias_correction1;      ///< 1 − β1^t, 1 without bias correction
    float bias_correction2_sqrt; ///< √(1 − β2^t), 1 without bias correction
    float eps;
    float weight_decay;
};

/// Sums of squares over one parameter, for its trust ratio.
struct lamb_squared_norms {
    double value = 0;
    double direction = 0;
};

/// direction = r for `n` elements, from the moments already updated this step.
template <class Count>
void lamb_direction(const lamb_coefficients& c, const float* __restrict value,
                    const float* __restrict exp_avg, const float* __restrict exp_avg_sq,
                    float* __restrict direction, Count n) {
    for (std::size_t i = 0; i < n; ++i)
        direction[i] = exp_avg_sq[i];
    sqrt_in_place(direction, n);
    // m̂ / (√v̂ + eps) = m / ((√v / √(1 − β2^t) + eps)·(1 − β1^t))
    for (std::size_t i = 0; i < n; ++i)
        direction[i] =
            exp_avg[i] / ((direction[i] / c.bias_correction2_sqrt + c.eps) * c.bias_correction1);
    if (c.weight_decay != 0) {
        for (std::size_t i = 0; i < n; ++i)
            direction[i] = direction[i] + c.weight_decay * value[i];
    }
}

/// First pass over `n` elements: updates the moments and adds the squares of θ and r to `norms`.
template <class Count>
void lamb_moments_block(const lamb_coefficients& c, const float* __restrict value,
                        const float* __restrict grad, float* __restrict exp_avg,
                        float* __restrict exp_avg_sq, lamb_squared_norms& norms, Count n) {
    for (std::size_t i = 0; i < n; ++i) {
        exp_avg[i] = exp_avg[i] * c.beta1 + c.one_minus_beta1 * grad[i];
        exp_avg_sq[i] = exp_avg_sq[i] * c.beta2 + c.one_minus_beta2 * grad[i] * grad[i];
    }
    float direction[block_elements];
    lamb_direction(c, value, exp_avg, exp_avg_sq, direction, n);
    double value_squares = 0, direction_squares = 0;
    for (std::size_t i = 0; i < n; ++i) {
        value_squares += static_cast<double>(value[i]) * static_cast<double>(value[i]);
        direction_squares += static_cast<double>(direction[i]) * static_cast<double>(direction[i]);
    }
    norms.value += value_squares;
    norms.direction += direction_squares;
}

/// Second pass over `n` elements: θ = θ + negative_step·r, r computed again.
template <class Count>
void lamb_update_block(const lamb_coefficients& c, float negative_step, float* __restrict value,
                       const float* __restrict exp_avg, const float* __restrict exp_avg_sq,
                       Count n) {
    float direction[block_elements];
    lamb_direction(c, value, exp_avg, exp_avg_sq, direction, n);
    for (std::size_t i = 0; i < n; ++i)
        value[i] = value[i] + negative_step * direction[i];
}

/// Returns `o`; throws std::invalid_argument naming the first invalid option.
inline const lamb_options& validated(const lamb_options& o) {
    const std::string who = "hivemesh::optim::lamb";
    require_non_negative(who, "lr", o.lr);
    require_beta(who, "beta1", o.beta1);
    require_beta(who, "beta2", o.beta2);
    require_non_negative(who, "eps", o.eps);
    require_non_negative(who, "weight_decay", o.weight_decay);
    require_non_negative(who, "clamp_value", o.clamp_value);
    return o;
}

class lamb_algorithm final : public builtin_algorithm<lamb_options> {
public:
    explicit lamb_algorithm(const lamb_options& options)
        : builtin_algorithm(validated(options), "hivemesh::optim::lamb",
                            {"exp_avg", "exp_avg_sq"}) {}

    void step(std::span<const parameter> params) override {
        check_parameters(params, who_);
        state_.fit(params, who_);
        const std::uint64_t t = step_count_ + 1;
        double bias_correction1 = 1, bias_correction2 = 1;
        if (options_.bias_correction) {
            bias_correction1 = 1 - std::pow(options_.beta1, static_cast<double>(t));
            bias_correction2 = 1 - std::pow(options_.beta2, static_cast<double>(t));
        }
        const lamb_coefficients c{
            .beta1 = static_cast<float>(options_.beta1),
            .one_minus_beta1 = static_cast<float>(1 - options_.beta1),
            .beta2 = static_cast<float>(options_.beta2),
            .one_minus_beta2 = static_cast<float>(1 - options_.beta2),
            .bias_correction1 = static_cast<float>(bias_correction1),
            .bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2)),
            .eps = static_cast<float>(options_.eps),
            .weight_decay = static_cast<float>(options_.weight_decay),
        };
        // The ratio needs ‖r‖ before any element moves. The second pass computes r again from
        // the updated moments rather than keeping it from the first: no buffer of a
        // parameter's size (the largest layer's, for the optimizer's lifetime), for one more
        // square root and division per element, and the same code gives the same r both times.
        const auto update = [&](std::size_t i, std::span<float> value,
                                std::span<const float> grad) {
            float* exp_avg = state_.buffer(i, 0).data();
            float* exp_avg_sq = state_.buffer(i, 1).data();
            lamb_squared_norms norms;
            for_each_block(value.size(), [&](std::size_t at, auto n) {
                lamb_moments_block(c, value.data() + at, grad.data() + at, exp_avg + at,
                                   exp_avg_sq + at, norms, n);
            });
            // std::min returns a NaN first argument, so a NaN norm still gives ratio 1 below.
            const double weight_norm = std::min(std::sqrt(norms.value), options_.clamp_value);
            double ratio = 1;
            if (weight_norm > 0 && norms.direction > 0)
                ratio = weight_norm / std::sqrt(norms.direction);
            const auto negative_step = static_cast<float>(-options_.lr * ratio);
            for_each_block(value.size(), [&](std::size_t at, auto n) {
                lamb_update_block(c, negative_step, value.data() + at, exp_avg + at,
                                  exp_avg_sq + at, n);
            });
        };
        for_each_parameter(params, update);
        step_count_ = t;
    }

    std::string name() const override { return "lamb"; }
};

} // namespace detail

/// LAMB (see the file comment): Adam's moments with a per-parameter trust ratio
/// min(‖θ‖, clamp_value)/‖r‖ that scales each parameter's step to its own norm, clamped. Its state
/// tensors are exp_avg and exp_avg_sq of each parameter, in that order, parameter after parameter;
/// the step count sets the bias correction. Throws std::invalid_argument naming the option if lr,
/// eps, weight_decay or clamp_value is negative (or NaN), or beta1 or beta2 is outside [0, 1).
inline local_optimizer lamb(const lamb_options& options = {}) {
    return local_optimizer(std::make_unique<detail::lamb_algorithm>(options));
}

} // namespace hivemesh::optim
