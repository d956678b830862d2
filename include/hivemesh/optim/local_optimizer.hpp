// Local optimizers: the per-peer update rule (SGD, Adam, a wrapped libtorch optimizer) that the
// collaborative optimizer applies after averaging. `local_optimizer` is a value type that
// type-erases the algorithm; its state is exposed as tensors so that peers can average it and
// newcomers can download it.
#pragma once

#include "hivemesh/core/error.hpp"
#include "hivemesh/tensor/integer.hpp"
#include "hivemesh/tensor/raw.hpp"
#include "hivemesh/tensor/tensor.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

namespace hivemesh::optim {

/// A model parameter and its gradient: two tensors of the same size (any backend).
struct parameter {
    tensor::tensor_ref value;
    tensor::tensor_ref grad;
};

/// A model's tensors that are not trained but must agree across the swarm (hivemind's
/// extra_tensors), such as BatchNorm's running statistics and batch count.
struct model_buffers {
    /// Float buffers (running mean and variance): averaged in every state round with equal
    /// weights, as the parameters are; sent with a state download and saved in checkpoints.
    std::vector<tensor::tensor_ref> averaged;
    /// Integer buffers (num_batches_tracked): sent with a state download, where the donor's
    /// replace this peer's, and saved in checkpoints; never averaged, so a state round leaves
    /// each peer its own.
    std::vector<tensor::integer_ref> carried;
};

/// The algorithm behind a local_optimizer. hivemesh provides sgd(), adam() and, with libtorch,
/// torch_optimizer(); implement this interface to plug in another. See local_optimizer for the
/// contract of each function.
class local_algorithm {
public:
    virtual ~local_algorithm() = default;

    virtual void step(std::span<const parameter> params) = 0;
    virtual std::vector<tensor::tensor_ref> state_tensors(std::span<const parameter> params) = 0;
    /// The name of each state tensor; empty for an algorithm that does not name them.
    virtual std::vector<std::string> state_names(std::span<const parameter> params) {
        static_cast<void>(params);
        return {};
    }
    virtual std::uint64_t step_count() const = 0;
    virtual void set_step_count(std::uint64_t count) = 0;
    virtual double learning_rate() const = 0;
    virtual void set_learning_rate(double lr) = 0;
    virtual std::string name() const = 0;
};

/// A local optimizer: a value type (movable, not copyable) that type-erases the algorithm.
/// A moved-from optimizer may only be assigned to or destroyed.
class local_optimizer {
public:
    /// Takes ownership of `algorithm`; throws std::invalid_argument if it is null.
    explicit local_optimizer(std::unique_ptr<local_algorithm> algorithm)
        : algorithm_(std::move(algorithm)) {
        if (!algorithm_)
            throw std::invalid_argument("hivemesh::optim::local_optimizer: null algorithm");
    }

    /// Applies one update to every parameter from its current grad, in place. The first call
    /// (of step or state_tensors) fixes the number and sizes of the parameters.
    /// Throws std::system_error(errc::size_mismatch) if a parameter's value and grad sizes
    /// differ, and std::invalid_argument if the parameters differ in number or size from
    /// those the state was made for, or a value shares memory with its grad; in both cases
    /// before changing anything.
    void step(std::span<const parameter> params) { algorithm_->step(params); }

    /// The optimizer's state as tensors, in a fixed order for the given parameters (e.g. SGD:
    /// the momentum buffer of each parameter, none without momentum; Adam: exp_avg and
    /// exp_avg_sq of each), created (zeros) if the optimizer has not stepped yet, so that a
    /// newcomer can receive state before its first step. These are what state averaging and
    /// state download carry. Writing into them changes the optimizer's state. The references
    /// stay valid as long as the optimizer. Throws std::invalid_argument as step() does.
    std::vector<tensor::tensor_ref> state_tensors(std::span<const parameter> params) {
        return algorithm_->state_tensors(params);
    }

    /// The name of each of state_tensors(params), in the same order ("exp_avg", "exp_avg_sq",
    /// "momentum_buffer", ... as torch.optim names them), for choosing which a state round
    /// averages (collaborative_options::average_opt_statistics); empty when the algorithm does
    /// not name them. Throws as state_tensors() does.
    std::vector<std::string> state_names(std::span<const parameter> params) {
        return algorithm_->state_names(params);
    }

    /// Scalar state that travels with the tensors: the number of steps taken (Adam's bias
    /// correction uses it; SGD initialises its momentum buffers to the gradient on a step taken
    /// at count 0).
    std::uint64_t step_count() const { return algorithm_->step_count(); }
    /// Sets the step count, e.g. to the donor's after a state download.
    void set_step_count(std::uint64_t count) { algorithm_->set_step_count(count); }

    /// The learning rate of the next step.
    double learning_rate() const { return algorithm_->learning_rate(); }
    /// Sets the learning rate of the next steps (for schedules); throws std::invalid_argument
    /// if it is negative or NaN.
    void set_learning_rate(double lr) { algorithm_->set_learning_rate(lr); }

    /// The algorithm's name: "sgd", "adam", "adamw", "torch:Adam", ...
    std::string name() const { return algorithm_->name(); }

private:
    std::unique_ptr<local_algorithm> algorithm_;
};

namespace detail {

/// Throws std::invalid_argument("<who>: <what>").
[[noreturn]] inline void throw_invalid(std::string_view who, const std::string& what) {
    throw std::invalid_argument(std::string(who) + ": " + what);
}

/// `value` as a short decimal ("1e-08", "0.9"), for error messages.
inline std::string number_text(double value) {
    std::ostringstream out;
    out << value;
    return out.str();
}

/// Rejects a negative or NaN option value.
inline void require_non_negative(std::string_view who, const char* option, double value) {
    if (!(value >= 0))
        throw_invalid(who, std::string("invalid ") + option + " " + number_text(value) +
                               " (must be >= 0)");
}

/// Rejects a moment's decay rate outside [0, 1) or NaN.
inline void require_beta(std::string_view who, const char* option, double beta) {
    if (!(beta >= 0 && beta < 1))
        throw_invalid(who, std::string("invalid ") + option + " " + number_text(beta) +
                               " (must be in [0, 1))");
}

/// True when two spans share at least one element.
inline bool overlap(std::span<const float> a, std::span<const float> b) noexcept {
    if (a.empty() || b.empty()) return false;
    const std::less<const float*> before;
    return before(a.data(), b.data() + b.size()) && before(b.data(), a.data() + a.size());
}

/// What step() checks before changing anything: every value has as many elements as its
/// grad (size_mismatch) and shares no memory with it (invalid_argument; the update loops
/// assume they do not alias).
inline void check_parameters(std::span<const parameter> params, std::string_view who) {
    for (std::size_t i = 0; i < params.size(); ++i) {
        const auto& p = params[i];
        const std::size_t values = p.value.size(), grads = p.grad.size();
        if (values != grads)
            throw std::system_error(make_error_code(errc::size_mismatch),
                                    std::string(who) + ": parameter " + std::to_string(i) +
                                        " has " + std::to_string(values) + " values and " +
                                        std::to_string(grads) + " gradients");
        const auto value_view = p.value.try_view();
        const auto grad_view = p.grad.try_view();
        if (value_view && grad_view && overlap(*value_view, *grad_view))
            throw_invalid(who,
                          "the value and grad of parameter " + std::to_string(i) + " share memory");
    }
}

/// The element counts of the parameters an optimizer's state was made for, and that state:
/// `slots` float32 buffers per parameter, stored parameter after parameter.
class state_buffers {
public:
    explicit state_buffers(std::size_t slots) noexcept
        : slots_(slots) {}

    /// Fixes the layout on the first call (zero buffers); afterwards throws
    /// std::invalid_argument if `params` differ from it in number or sizes.
    void fit(std::span<const parameter> params, std::string_view who) {
        if (fitted_) {
            check_layout(params, who);
            return;
        }
        std::vector<std::size_t> sizes;
        sizes.reserve(params.size());
        for (const auto& p : params)
            sizes.push_back(p.value.size());
        std::vector<std::vector<float>> buffers;
        buffers.reserve(sizes.size() * slots_);
        for (const auto n : sizes)
            for (std::size_t s = 0; s < slots_; ++s)
                buffers.emplace_back(n, 0.0f);
        sizes_ = std::move(sizes);
        buffers_ = std::move(buffers);
        fitted_ = true;
    }

    /// Slot `slot` of parameter `param`; fit() must have been called.
    std::span<float> buffer(std::size_t param, std::size_t slot) noexcept {
        return buffers_[param * slots_ + slot];
    }

    /// Every buffer, parameter after parameter, slot after slot. The buffers are never
    /// reallocated after fit(), so the references last as long as this object.
    std::vector<tensor::tensor_ref> refs() {
        return std::vector<tensor::tensor_ref>(buffers_.begin(), buffers_.end());
    }

private:
    void check_layout(std::span<const parameter> params, std::string_view who) const {
        if (params.size() != sizes_.size())
            throw_invalid(who, "the optimizer's state is for " + std::to_string(sizes_.size()) +
                                   " parameters, not " + std::to_string(params.size()));
        for (std::size_t i = 0; i < params.size(); ++i) {
            const std::size_t n = params[i].value.size();
            if (n != sizes_[i])
                throw_invalid(who, "the optimizer's state is for " + std::to_string(sizes_[i]) +
                                       " elements in parameter " + std::to_string(i) + ", not " +
                                       std::to_string(n));
        }
    }

    std::size_t slots_;
    bool fitted_ = false;
    std::vector<std::size_t> sizes_;
    std::vector<std::vector<float>> buffers_;
};

/// Elements updated together. Loops over a full block have a constant trip count, which g++
/// -O2 needs to vectorise them, and a block's temporaries stay in the L1 cache.
inline constexpr std::size_t block_elements = 256;

/// Calls f(offset, count) for consecutive blocks covering [0, n). For full blocks count is a
/// std::integral_constant, so that f's loops see a compile-time trip count.
template <class F>
void for_each_block(std::size_t n, F&& f) {
    std::size_t offset = 0;
    for (; n - offset >= block_elements; offset += block_elements)
        f(offset, std::integral_constant<std::size_t, block_elements>{});
    if (offset < n) f(offset, n - offset);
}

/// Calls update(i, value, grad) with float32 spans of each parameter's value and grad, writing
/// the value back when it was copied (a non-contiguous or non-float32 tensor).
template <class Update>
void for_each_parameter(std::span<const parameter> params, Update&& update) {
    for (std::size_t i = 0; i < params.size(); ++i) {
        tensor::host_view<const tensor::tensor_ref> value(params[i].value);
        const tensor::const_host_view<tensor::tensor_ref> grad(params[i].grad);
        update(i, value.span(), grad.span());
        value.commit();
    }
}

/// What the built-in algorithms share: their options (which have an `lr`), their name for
/// error messages, their state buffers and their step count.
template <class Options>
class builtin_algorithm : public local_algorithm {
public:
    std::vector<tensor::tensor_ref> state_tensors(std::span<const parameter> params) override {
        state_.fit(params, who_);
        return state_.refs();
    }

    std::vector<std::string> state_names(std::span<const parameter> params) override {
        state_.fit(params, who_);
        std::vector<std::string> names;
        for (std::size_t i = 0; i < params.size(); ++i)
            names.insert(names.end(), slot_names_.begin(), slot_names_.end());
        return names;
    }

    std::uint64_t step_count() const override { return step_count_; }
    void set_step_count(std::uint64_t count) override { step_count_ = count; }

    double learning_rate() const override { return options_.lr; }
    void set_learning_rate(double lr) override {
        require_non_negative(who_, "lr", lr);
        options_.lr = lr;
    }

protected:
    /// `slot_names`: the state buffers of each parameter, by name.
    builtin_algorithm(const Options& options, std::string who, std::vector<std::string> slot_names)
        : options_(options)
        , who_(std::move(who))
        , slot_names_(std::move(slot_names))
        , state_(slot_names_.size()) {}

    Options options_;
    std::string who_;
    std::vector<std::string> slot_names_;
    state_buffers state_;
    std::uint64_t step_count_ = 0;
};

} // namespace detail
} // namespace hivemesh::optim
