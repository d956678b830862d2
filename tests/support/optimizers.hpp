// Oracles for the local optimizer tests: SGD and Adam/AdamW written out plainly in double
// precision from PyTorch's documented update rules, a fixed problem (initial values and the
// gradient of every step), and a runner that compares an optimizer with a reference after
// every step.
#pragma once

#include <hivemesh/optim.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace hivemesh::test {

/// One parameter's values after each step against the hand-computed ones, to 1e-6 relative.
inline void check_values(const std::vector<float>& actual, const std::vector<double>& expected) {
    REQUIRE(actual.size() == expected.size());
    for (std::size_t i = 0; i < actual.size(); ++i)
        CHECK(actual[i] == Approx(expected[i]).epsilon(1e-6));
}

/// Values of several parameters, in double precision.
using parameter_values = std::vector<std::vector<double>>;

/// SGD as torch.optim.SGD documents it, in double precision.
class reference_sgd {
public:
    explicit reference_sgd(const optim::sgd_options& options)
        : options(options) {}

    void step(parameter_values& values, const parameter_values& grads) {
        const bool first = momentum_buffers.empty();
        if (first) momentum_buffers = parameter_values(values.size());
        for (std::size_t k = 0; k < values.size(); ++k) {
            auto& buffer = momentum_buffers[k];
            if (first) buffer.assign(values[k].size(), 0.0);
            for (std::size_t i = 0; i < values[k].size(); ++i) {
                double& p = values[k][i];
                double d = grads[k][i] + options.weight_decay * p;
                if (options.momentum != 0) {
                    buffer[i] =
                        first ? d : options.momentum * buffer[i] + (1 - options.dampening) * d;
                    d = options.nesterov ? d + options.momentum * buffer[i] : buffer[i];
                }
                p -= options.lr * d;
            }
        }
    }

    optim::sgd_options options;
    parameter_values momentum_buffers;
};

/// Adam (or AdamW with decoupled_weight_decay) as torch.optim.Adam / AdamW document it, in
/// double precision.
class reference_adam {
public:
    explicit reference_adam(const optim::adam_options& options)
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
        const double bias_correction1 = 1 - std::pow(options.beta1, t);
        const double bias_correction2 = 1 - std::pow(options.beta2, t);
        for (std::size_t k = 0; k < values.size(); ++k) {
            for (std::size_t i = 0; i < values[k].size(); ++i) {
                double& p = values[k][i];
                double g = grads[k][i];
                if (options.decoupled_weight_decay)
                    p *= 1 - options.lr * options.weight_decay;
                else
                    g += options.weight_decay * p;
                double& m = exp_avg[k][i];
                double& v = exp_avg_sq[k][i];
                m = options.beta1 * m + (1 - options.beta1) * g;
                v = options.beta2 * v + (1 - options.beta2) * g * g;
                const double m_hat = m / bias_correction1;
                const double v_hat = v / bias_correction2;
                p -= options.lr * m_hat / (std::sqrt(v_hat) + options.eps);
            }
        }
    }

    optim::adam_options options;
    parameter_values exp_avg;
    parameter_values exp_avg_sq;
    std::uint64_t steps = 0;
};

/// The parameter sizes of the oracle problem: 549 = two full update blocks and a tail.
inline std::vector<std::size_t> oracle_sizes() {
    return {3, 1, 549};
}

/// Initial value of element i of parameter k: quarters in [1, 3], exact in float.
inline double initial_value(std::size_t k, std::size_t i) {
    return 1.0 + static_cast<double>((5 * i + 2 * k) % 9) / 4;
}

/// The gradient of step `step` (0-based) for element i of parameter k: sixteenths in
/// [-0.6875, 0.8125], never 0, exact in float, varying from step to step.
inline double gradient(std::size_t step, std::size_t k, std::size_t i) {
    const auto eighths = static_cast<double>((7 * i + 3 * k + 5 * step) % 13) - 6;
    return eighths / 8 + 1.0 / 16;
}

inline parameter_values initial_values() {
    parameter_values values;
    for (std::size_t k = 0; const auto n : oracle_sizes()) {
        auto& v = values.emplace_back(n);
        for (std::size_t i = 0; i < n; ++i)
            v[i] = initial_value(k, i);
        ++k;
    }
    return values;
}

inline parameter_values gradients(std::size_t step) {
    parameter_values grads;
    for (std::size_t k = 0; const auto n : oracle_sizes()) {
        auto& g = grads.emplace_back(n);
        for (std::size_t i = 0; i < n; ++i)
            g[i] = gradient(step, k, i);
        ++k;
    }
    return grads;
}

/// `values` as float32.
inline std::vector<float> as_floats(const std::vector<double>& values) {
    return std::vector<float>(values.begin(), values.end());
}

/// The elements of `t` as float32.
inline std::vector<float> read(const tensor::tensor_ref& t) {
    std::vector<float> out(t.size());
    t.copy_to(out);
    return out;
}

/// Checks `actual` against `expected` element by element, to 1e-6 relative, or within
/// `margin`: a momentum is a sum of gradients of both signs, so its float rounding error
/// scales with the gradients (< 1), not with the sum, which may nearly cancel.
inline void check_close(const std::vector<float>& actual, const std::vector<double>& expected,
                        double margin = 0) {
    REQUIRE(actual.size() == expected.size());
    for (std::size_t i = 0; i < actual.size(); ++i) {
        INFO("element " << i);
        CHECK(static_cast<double>(actual[i]) == Approx(expected[i]).epsilon(1e-6).margin(margin));
    }
}

/// The margin for state tensors (see check_close).
inline constexpr double state_margin = 1e-7;

/// Writes the initial values into `params` (whatever their backend), then runs `steps` steps
/// of `optimizer` and `reference` with the oracle gradients, checking every value after each
/// step. Returns the reference's final values.
template <class Reference>
parameter_values check_against_reference(optim::local_optimizer& optimizer, Reference& reference,
                                         std::span<const optim::parameter> params,
                                         std::size_t steps) {
    REQUIRE(params.size() == oracle_sizes().size());
    auto expected = initial_values();
    for (std::size_t k = 0; k < params.size(); ++k)
        params[k].value.copy_from(as_floats(expected[k]));
    for (std::size_t step = 0; step < steps; ++step) {
        const auto grads = gradients(step);
        for (std::size_t k = 0; k < params.size(); ++k)
            params[k].grad.copy_from(as_floats(grads[k]));
        optimizer.step(params);
        reference.step(expected, grads);
        INFO("after step " << step + 1);
        for (std::size_t k = 0; k < params.size(); ++k) {
            INFO("parameter " << k);
            check_close(read(params[k].value), expected[k]);
        }
    }
    CHECK(optimizer.step_count() == steps);
    return expected;
}

/// Tensors for the oracle problem in std::vector<float>: values and grads, and the parameters
/// referring to them.
struct vector_parameters {
    vector_parameters() {
        for (const auto n : oracle_sizes()) {
            values.emplace_back(n);
            grads.emplace_back(n);
        }
        for (std::size_t k = 0; k < values.size(); ++k)
            params.push_back({values[k], grads[k]});
    }
    vector_parameters(const vector_parameters&) = delete;
    vector_parameters& operator=(const vector_parameters&) = delete;

    std::vector<std::vector<float>> values;
    std::vector<std::vector<float>> grads;
    std::vector<optim::parameter> params;
};

/// The same parameters as std::span views into one buffer for the values and one for the
/// grads (so they are contiguous neighbours, as in a flat model).
struct span_parameters {
    span_parameters() {
        std::size_t total = 0;
        for (const auto n : oracle_sizes())
            total += n;
        value_memory.resize(total);
        grad_memory.resize(total);
        for (std::size_t at = 0; const auto n : oracle_sizes()) {
            values.emplace_back(value_memory.data() + at, n);
            grads.emplace_back(grad_memory.data() + at, n);
            at += n;
        }
        for (std::size_t k = 0; k < values.size(); ++k)
            params.push_back({values[k], grads[k]});
    }
    span_parameters(const span_parameters&) = delete;
    span_parameters& operator=(const span_parameters&) = delete;

    std::vector<float> value_memory, grad_memory;
    std::vector<std::span<float>> values, grads;
    std::vector<optim::parameter> params;
};

/// Writes the oracle gradients of `step` into `tensors`' grads.
inline void set_gradients(vector_parameters& tensors, std::size_t step) {
    const auto grads = gradients(step);
    for (std::size_t k = 0; k < grads.size(); ++k)
        tensors.grads[k] = as_floats(grads[k]);
}

/// Writes the oracle's initial values into `tensors`' values.
inline void set_initial_values(vector_parameters& tensors) {
    const auto values = initial_values();
    for (std::size_t k = 0; k < values.size(); ++k)
        tensors.values[k] = as_floats(values[k]);
}

/// A donor steps three times; a newcomer that never stepped receives its parameters, state
/// tensors and (if `copy_step_count`) step count. Returns whether both give the same
/// parameters and state after one more step with the same gradients.
inline bool newcomer_continues_donor(optim::local_optimizer donor, optim::local_optimizer newcomer,
                                     bool copy_step_count) {
    vector_parameters donor_tensors, newcomer_tensors;
    set_initial_values(donor_tensors);
    for (std::size_t step = 0; step < 3; ++step) {
        set_gradients(donor_tensors, step);
        donor.step(donor_tensors.params);
    }

    newcomer_tensors.values = donor_tensors.values;
    const auto from = donor.state_tensors(donor_tensors.params);
    const auto to = newcomer.state_tensors(newcomer_tensors.params);
    REQUIRE(from.size() == to.size());
    for (std::size_t i = 0; i < from.size(); ++i)
        to[i].copy_from(read(from[i]));
    if (copy_step_count) newcomer.set_step_count(donor.step_count());

    set_gradients(donor_tensors, 3);
    set_gradients(newcomer_tensors, 3);
    donor.step(donor_tensors.params);
    newcomer.step(newcomer_tensors.params);
    bool same = donor_tensors.values == newcomer_tensors.values;
    for (std::size_t i = 0; i < from.size(); ++i)
        same = same && read(from[i]) == read(to[i]);
    return same;
}

/// What Adam and LAMB share: their state tensors are exp_avg and exp_avg_sq of each parameter
/// of the oracle problem, zeros before the first step and `reference`'s moments after three.
template <class Reference>
void check_moment_state_tensors(optim::local_optimizer optimizer, Reference reference) {
    vector_parameters tensors;
    // Before the first step: zeros, two per parameter, parameter after parameter.
    const auto state = optimizer.state_tensors(tensors.params);
    REQUIRE(state.size() == 6);
    CHECK(optimizer.state_names(tensors.params) ==
          std::vector<std::string>{"exp_avg", "exp_avg_sq", "exp_avg", "exp_avg_sq", "exp_avg",
                                   "exp_avg_sq"});
    for (std::size_t k = 0; k < 3; ++k) {
        const auto n = tensors.values[k].size();
        CHECK(read(state[2 * k]) == std::vector<float>(n, 0.0f));
        CHECK(read(state[2 * k + 1]) == std::vector<float>(n, 0.0f));
    }
    CHECK(optimizer.step_count() == 0);

    // After steps the same references hold the moments.
    check_against_reference(optimizer, reference, tensors.params, 3);
    CHECK(optimizer.step_count() == 3);
    for (std::size_t k = 0; k < 3; ++k) {
        INFO("parameter " << k);
        check_close(read(state[2 * k]), reference.exp_avg[k], state_margin);
        check_close(read(state[2 * k + 1]), reference.exp_avg_sq[k]);
    }
}

} // namespace hivemesh::test
