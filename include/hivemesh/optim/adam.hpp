// Adam and AdamW, following torch.optim.Adam and torch.optim.AdamW (without amsgrad). With
// t the step count after the increment:
//
//     θ = θ·(1 − lr·weight_decay)               (AdamW only)
//     g = g + weight_decay·θ                    (Adam only)
//     m = β1·m + (1 − β1)·g
//     v = β2·v + (1 − β2)·g²
//     θ = θ − lr / (1 − β1^t) · m / (√v / √(1 − β2^t) + eps)
//
// Arithmetic is float32 like PyTorch's, the bias corrections double; the state is m (exp_avg)
// and v (exp_avg_sq) per parameter, and the step count.
#pragma once

#include "hivemesh/optim/local_optimizer.hpp"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

namespace hivemesh::optim {

/// Options of adam(); decoupled_weight_decay selects AdamW.
struct adam_options {
    double lr = 1e-3;
    double beta1 = 0.9;
    double beta2 = 0.999;
    double eps = 1e-8;
    double weight_decay = 0;
    bool decoupled_weight_decay = false; ///< true: AdamW
};

namespace detail {

/// x = √x for `n` floats. Compilers do not vectorise std::sqrt without -fno-math-errno (it may
/// set errno), so x86 uses the SSE instruction; both round correctly, so the results agree.
inline void sqrt_in_place(float* x, std::size_t n) noexcept {
    std::size_t scalar_from = 0;
#if defined(__SSE__)
    scalar_from = n / 4 * 4;
    for (std::size_t i = 0; i < scalar_from; i += 4)
        _mm_storeu_ps(x + i, _mm_sqrt_ps(_mm_loadu_ps(x + i)));
#endif
    for (std::size_t i = scalar_from; i < n; ++i)
        x[i] = std::sqrt(x[i]);
}

/// One step's scalars, in float32 as the update computes with them.
struct adam_coefficients {
    float beta1;
    float one_minus_beta1;
    float beta2;
    float one_minus_beta2;
    float bias_correction2_sqrt; ///< √(1 − β2^t)
    float eps;
    float negative_step_size; ///< −lr / (1 − β1^t)
    float weight_decay;       ///< Adam's L2 term, 0 for AdamW
    float decay;              ///< AdamW's factor 1 − lr·weight_decay, 1 for Adam
};

/// Updates `n` elements.
template <class Count>
void adam_block(const adam_coefficients& c, float* __restrict value, const float* __restrict grad,
                float* __restrict exp_avg, float* __restrict exp_avg_sq, Count n) {
    float decayed_grad[block_elements];
    float denominator[block_elements];
    if (c.decay != 1) {
        for (std::size_t i = 0; i < n; ++i)
            value[i] = value[i] * c.decay;
    }
    const float* g = grad;
    if (c.weight_decay != 0) {
        for (std::size_t i = 0; i < n; ++i)
            decayed_grad[i] = grad[i] + c.weight_decay * value[i];
        g = decayed_grad;
    }
    for (std::size_t i = 0; i < n; ++i) {
        exp_avg[i] = exp_avg[i] * c.beta1 + c.one_minus_beta1 * g[i];
        exp_avg_sq[i] = exp_avg_sq[i] * c.beta2 + c.one_minus_beta2 * g[i] * g[i];
        denominator[i] = exp_avg_sq[i];
    }
    sqrt_in_place(denominator, n);
    for (std::size_t i = 0; i < n; ++i)
        value[i] = value[i] + c.negative_step_size *
                                  (exp_avg[i] / (denominator[i] / c.bias_correction2_sqrt + c.eps));
}

/// Returns `o`; throws std::invalid_argument naming the first invalid option (PyTorch's rules).
inline const adam_options& validated(const adam_options& o) {
    const std::string who =
        o.decoupled_weight_decay ? "hivemesh::optim::adamw" : "hivemesh::optim::adam";
    require_non_negative(who, "lr", o.lr);
    require_beta(who, "beta1", o.beta1);
    require_beta(who, "beta2", o.beta2);
    require_non_negative(who, "eps", o.eps);
    require_non_negative(who, "weight_decay", o.weight_decay);
    return o;
}

class adam_algorithm final : public builtin_algorithm<adam_options> {
public:
    explicit adam_algorithm(const adam_options& options)
        : builtin_algorithm(validated(options),
                            options.decoupled_weight_decay ? "hivemesh::optim::adamw"
                                                           : "hivemesh::optim::adam",
                            {"exp_avg", "exp_avg_sq"}) {}

    void step(std::span<const parameter> params) override {
        check_parameters(params, who_);
        state_.fit(params, who_);
        const std::uint64_t t = step_count_ + 1;
        const double bias_correction1 = 1 - std::pow(options_.beta1, static_cast<double>(t));
        const double bias_correction2 = 1 - std::pow(options_.beta2, static_cast<double>(t));
        const bool decoupled = options_.decoupled_weight_decay;
        const adam_coefficients c{
            .beta1 = static_cast<float>(options_.beta1),
            .one_minus_beta1 = static_cast<float>(1 - options_.beta1),
            .beta2 = static_cast<float>(options_.beta2),
            .one_minus_beta2 = static_cast<float>(1 - options_.beta2),
            .bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2)),
            .eps = static_cast<float>(options_.eps),
            .negative_step_size = static_cast<float>(-options_.lr / bias_correction1),
            .weight_decay = decoupled ? 0.0f : static_cast<float>(options_.weight_decay),
            .decay = decoupled ? static_cast<float>(1 - options_.lr * options_.weight_decay) : 1.0f,
        };
        const auto update = [&](std::size_t i, std::span<float> value,
                                std::span<const float> grad) {
            float* exp_avg = state_.buffer(i, 0).data();
            float* exp_avg_sq = state_.buffer(i, 1).data();
            for_each_block(value.size(), [&](std::size_t at, auto n) {
                adam_block(c, value.data() + at, grad.data() + at, exp_avg + at, exp_avg_sq + at,
                           n);
            });
        };
        for_each_parameter(params, update);
        step_count_ = t;
    }

    std::string name() const override { return options_.decoupled_weight_decay ? "adamw" : "adam"; }
};

} // namespace detail

/// Adam as torch.optim.Adam, or AdamW as torch.optim.AdamW when
/// options.decoupled_weight_decay is set (see the file comment). Its state tensors are
/// exp_avg and exp_avg_sq of each parameter, in that order, parameter after parameter; the
/// step count sets the bias correction. Throws std::invalid_argument naming the option if lr,
/// eps or weight_decay is negative (or NaN), or beta1 or beta2 is outside [0, 1).
inline local_optimizer adam(const adam_options& options = {}) {
    return local_optimizer(std::make_unique<detail::adam_algorithm>(options));
}

} // namespace hivemesh::optim
