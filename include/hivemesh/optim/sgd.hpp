// Stochastic gradient descent with momentum, dampening, Nesterov momentum and L2 weight decay,
// following torch.optim.SGD:
//
//     d = g + weight_decay·θ
//     b = d on the first step, else momentum·b + (1 − dampening)·d   (with momentum > 0)
//     d = d + momentum·b (Nesterov) or d = b
//     θ = θ − lr·d
//
// Arithmetic is float32 like PyTorch's; the state is one momentum buffer per parameter.
#pragma once

#include "hivemesh/optim/local_optimizer.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace hivemesh::optim {

/// Options of sgd(); the defaults are plain SGD with lr 0.01.
struct sgd_options {
    double lr = 0.01;
    double momentum = 0;
    double dampening = 0;
    bool nesterov = false;
    double weight_decay = 0;
};

namespace detail {

/// One step's scalars, in float32 as the update computes with them.
struct sgd_coefficients {
    float lr;
    float momentum;
    float one_minus_dampening;
    float weight_decay;
    bool nesterov;
    bool first_step; ///< the momentum buffer starts as the gradient
};

/// Updates `n` elements. `momentum_buffer` is null without momentum.
template <class Count>
void sgd_block(const sgd_coefficients& c, float* __restrict value, const float* __restrict grad,
               float* __restrict momentum_buffer, Count n) {
    float direction[block_elements];
    if (c.weight_decay != 0) {
        for (std::size_t i = 0; i < n; ++i)
            direction[i] = grad[i] + c.weight_decay * value[i];
    } else {
        for (std::size_t i = 0; i < n; ++i)
            direction[i] = grad[i];
    }
    if (momentum_buffer != nullptr) {
        if (c.first_step) {
            for (std::size_t i = 0; i < n; ++i)
                momentum_buffer[i] = direction[i];
        } else {
            for (std::size_t i = 0; i < n; ++i)
                momentum_buffer[i] =
                    momentum_buffer[i] * c.momentum + c.one_minus_dampening * direction[i];
        }
        if (c.nesterov) {
            for (std::size_t i = 0; i < n; ++i)
                direction[i] = direction[i] + c.momentum * momentum_buffer[i];
        } else {
            for (std::size_t i = 0; i < n; ++i)
                direction[i] = momentum_buffer[i];
        }
    }
    for (std::size_t i = 0; i < n; ++i)
        value[i] = value[i] - c.lr * direction[i];
}

/// Returns `o`; throws std::invalid_argument naming the first invalid option (PyTorch's rules).
inline const sgd_options& validated(const sgd_options& o) {
    const std::string who = "hivemesh::optim::sgd";
    require_non_negative(who, "lr", o.lr);
    require_non_negative(who, "momentum", o.momentum);
    require_non_negative(who, "weight_decay", o.weight_decay);
    if (o.nesterov && !(o.momentum > 0 && o.dampening == 0))
        throw_invalid(who, "nesterov requires momentum > 0 and dampening = 0 (momentum " +
                               number_text(o.momentum) + ", dampening " + number_text(o.dampening) +
                               ")");
    return o;
}

class sgd_algorithm final : public builtin_algorithm<sgd_options> {
public:
    explicit sgd_algorithm(const sgd_options& options)
        : builtin_algorithm(validated(options), "hivemesh::optim::sgd",
                            options.momentum != 0 ? std::vector<std::string>{"momentum_buffer"}
                                                  : std::vector<std::string>{}) {}

    void step(std::span<const parameter> params) override {
        check_parameters(params, who_);
        state_.fit(params, who_);
        const sgd_coefficients c{
            .lr = static_cast<float>(options_.lr),
            .momentum = static_cast<float>(options_.momentum),
            .one_minus_dampening = static_cast<float>(1 - options_.dampening),
            .weight_decay = static_cast<float>(options_.weight_decay),
            .nesterov = options_.nesterov,
            .first_step = step_count_ == 0,
        };
        const bool momentum = options_.momentum != 0;
        const auto update = [&](std::size_t i, std::span<float> value,
                                std::span<const float> grad) {
            float* buffer = momentum ? state_.buffer(i, 0).data() : nullptr;
            for_each_block(value.size(), [&](std::size_t at, auto n) {
                sgd_block(c, value.data() + at, grad.data() + at,
                          buffer != nullptr ? buffer + at : nullptr, n);
            });
        };
        for_each_parameter(params, update);
        ++step_count_;
    }

    std::string name() const override { return "sgd"; }
};

} // namespace detail

/// SGD as torch.optim.SGD (see the file comment). Its state tensors are one momentum buffer
/// per parameter, none without momentum; a step taken at step_count() 0 sets the buffers to
/// the gradient, later steps decay them. Throws std::invalid_argument naming the option if lr,
/// momentum or weight_decay is negative (or NaN), or nesterov is set without momentum > 0 and
/// dampening = 0.
inline local_optimizer sgd(const sgd_options& options = {}) {
    return local_optimizer(std::make_unique<detail::sgd_algorithm>(options));
}

} // namespace hivemesh::optim
