// libtorch: a module's parameters and buffers as hivemesh parameters and model_buffers, and a
// torch::optim optimizer as a local_optimizer, with its state exposed as tensors for the known
// optimizer classes.
#pragma once

// First: in libtorch 1.13, clang 14 in C++20 mode rejects <torch/nn/module.h> and
// <torch/optim/...> (std::vector<IValue> of an incomplete IValue in <ATen/core/List.h>) unless
// IValue is complete before they are read.
#include <ATen/core/ivalue.h>

#include "hivemesh/optim/local_optimizer.hpp"
#include "hivemesh/tensor/torch.hpp"

// The optimizer headers include <torch/nn/module.h>, most of their cost; <torch/torch.h> would
// add ~50% to a translation unit.
#include <ATen/core/Tensor.h>
#include <ATen/ops/full_like.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/GradMode.h>
#include <c10/util/Type.h>
#include <torch/nn/module.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <typeinfo>
#include <unordered_set>
#include <utility>
#include <vector>

namespace hivemesh::optim {

/// The parameters of a torch::nn::Module (recursively, in module.parameters() order) that
/// require grad, as hivemesh parameters, and its buffers (in module.named_buffers() order) as
/// model_buffers: floating-point buffers (BatchNorm's running_mean and running_var) averaged,
/// integer ones (num_batches_tracked) carried. It owns the at::Tensor handles its tensor_refs
/// refer to, so it must outlive every copy of them; moving it keeps them valid, copying is not
/// allowed. A parameter without a gradient gets a zero one, so that the grad refers to the
/// tensor backward() accumulates into from then on (as long as nobody sets the module's
/// gradients to none). Undefined buffers are left out; a buffer of another type (bool,
/// float64, complex) throws std::invalid_argument naming it.
class module_parameters {
public:
    explicit module_parameters(torch::nn::Module& module) {
        const c10::NoGradGuard no_grad;
        for (const auto& p : module.parameters()) {
            if (!p.requires_grad()) continue;
            if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
            values_.push_back(p);
            grads_.push_back(p.grad());
        }
        for (const auto& item : module.named_buffers()) {
            const at::Tensor& b = item.value();
            if (!b.defined()) continue;
            const auto type = b.scalar_type();
            if (type == at::kFloat || type == at::kHalf || type == at::kBFloat16)
                averaged_.push_back(b);
            else if (at::isIntegralType(type, /*includeBool=*/false))
                carried_.push_back(b);
            else
                detail::throw_invalid("hivemesh::optim::parameters_of",
                                      "buffer " + item.key() + " has dtype " + c10::toString(type) +
                                          ", neither float32/float16/bfloat16 nor an integer type");
        }
        // Only now that the handles are complete: they never reallocate afterwards.
        params_.reserve(values_.size());
        for (std::size_t i = 0; i < values_.size(); ++i)
            params_.push_back({values_[i], grads_[i]});
        buffers_.averaged.assign(averaged_.begin(), averaged_.end());
        buffers_.carried.assign(carried_.begin(), carried_.end());
    }

    module_parameters(module_parameters&&) noexcept = default;
    module_parameters& operator=(module_parameters&&) noexcept = default;
    module_parameters(const module_parameters&) = delete;
    module_parameters& operator=(const module_parameters&) = delete;

    /// The parameters, in module order; copies refer to this object's handles.
    const std::vector<parameter>& list() const noexcept { return params_; }
    operator std::span<const parameter>() const noexcept { return params_; }

    std::size_t size() const noexcept { return params_.size(); }
    auto begin() const noexcept { return params_.begin(); }
    auto end() const noexcept { return params_.end(); }

    /// The module's buffers, for the collaborative optimizer; copies refer to this object's
    /// handles.
    const model_buffers& buffers() const noexcept { return buffers_; }

    /// The handles: the module's parameter tensors and their gradients, and its buffers.
    const std::vector<at::Tensor>& values() const noexcept { return values_; }
    const std::vector<at::Tensor>& grads() const noexcept { return grads_; }
    const std::vector<at::Tensor>& averaged_buffers() const noexcept { return averaged_; }
    const std::vector<at::Tensor>& integer_buffers() const noexcept { return carried_; }

private:
    std::vector<at::Tensor> values_;
    std::vector<at::Tensor> grads_;
    std::vector<at::Tensor> averaged_;
    std::vector<at::Tensor> carried_;
    std::vector<parameter> params_;
    model_buffers buffers_;
};

/// The trainable parameters and the buffers of `module`; see module_parameters.
inline module_parameters parameters_of(torch::nn::Module& module) {
    return module_parameters(module);
}

namespace detail {

/// The optimizer classes whose state torch_algorithm knows.
enum class torch_kind { adam, adamw, sgd, rmsprop, adagrad, other };

inline torch_kind kind_of(torch::optim::Optimizer& o) {
    if (dynamic_cast<torch::optim::Adam*>(&o)) return torch_kind::adam;
    if (dynamic_cast<torch::optim::AdamW*>(&o)) return torch_kind::adamw;
    if (dynamic_cast<torch::optim::SGD*>(&o)) return torch_kind::sgd;
    if (dynamic_cast<torch::optim::RMSprop*>(&o)) return torch_kind::rmsprop;
    if (dynamic_cast<torch::optim::Adagrad*>(&o)) return torch_kind::adagrad;
    return torch_kind::other;
}

/// "torch:" and the optimizer's class, without the torch::optim:: prefix.
inline std::string torch_name(const torch::optim::Optimizer& o) {
    std::string name = c10::demangle(typeid(o).name());
    constexpr std::string_view prefix = "torch::optim::";
    if (name.starts_with(prefix)) name.erase(0, prefix.size());
    return "torch:" + name;
}

/// The key libtorch's optimizers file a parameter's state under.
inline std::string state_key(const at::Tensor& p) {
    return c10::guts::to_string(p.unsafeGetTensorImpl());
}

/// Zeros of the size, dtype and memory format of `p`, as libtorch's optimizers make state.
inline at::Tensor zero_state_like(const at::Tensor& p) {
    return at::zeros_like(p, at::MemoryFormat::Preserve);
}

class torch_algorithm final : public local_algorithm {
public:
    explicit torch_algorithm(std::shared_ptr<torch::optim::Optimizer> optimizer)
        : optimizer_(std::move(optimizer)) {
        if (!optimizer_) throw_invalid(who, "null optimizer");
        kind_ = kind_of(*optimizer_);
    }

    void step(std::span<const parameter> params) override {
        check_parameters(params, who);
        const auto tensors = torch_parameters();
        check_matches(params, tensors);
        copy_grads(params, tensors);
        if (kind_ == torch_kind::sgd && own_step_count_ == 0) {
            // torch::optim::SGD sets a buffer it has not made yet to the gradient; the zeros
            // that state_tensors() made in its place must not be decayed instead.
            for (const auto& key : made_here_)
                optimizer_->state().erase(key);
        }
        made_here_.clear();
        optimizer_->step();
        ++own_step_count_;
        if (!handles_.empty()) refresh_handles();
    }

    std::vector<tensor::tensor_ref> state_tensors(std::span<const parameter> params) override {
        if (kind_ == torch_kind::other)
            throw_invalid(who, "state_tensors supports torch::optim::Adam, AdamW, SGD, RMSprop "
                               "and Adagrad, not " +
                                   torch_name(*optimizer_));
        check_matches(params, torch_parameters());
        const std::size_t n = refresh_handles();
        std::vector<tensor::tensor_ref> refs;
        refs.reserve(n);
        for (std::size_t i = 0; i < n; ++i)
            refs.emplace_back(handles_[i]);
        return refs;
    }

    std::vector<std::string> state_names(std::span<const parameter> params) override {
        state_tensors(params);
        return names_;
    }

    std::uint64_t step_count() const override {
        if (!counts_per_parameter()) return own_step_count_;
        const auto tensors = torch_parameters();
        if (tensors.empty()) return 0;
        const auto& state = optimizer_->state();
        const auto it = state.find(state_key(tensors.front()));
        return it == state.end() ? 0 : static_cast<std::uint64_t>(state_step(*it->second));
    }

    void set_step_count(std::uint64_t count) override {
        own_step_count_ = count;
        if (count != 0) made_here_.clear(); // the buffers now hold a state to continue from
        if (!counts_per_parameter()) return;
        make_state();
        for (const auto& group : optimizer_->param_groups())
            for (const auto& p : group.params())
                set_state_step(*optimizer_->state().at(state_key(p)),
                               static_cast<std::int64_t>(count));
    }

    double learning_rate() const override {
        const auto& groups = optimizer_->param_groups();
        return groups.empty() ? optimizer_->defaults().get_lr() : groups.front().options().get_lr();
    }

    void set_learning_rate(double lr) override {
        require_non_negative(who, "lr", lr);
        optimizer_->defaults().set_lr(lr);
        for (auto& group : optimizer_->param_groups())
            group.options().set_lr(lr);
    }

    std::string name() const override { return torch_name(*optimizer_); }

private:
    static constexpr const char* who = "hivemesh::optim::torch_optimizer";

    /// Whether the optimizer keeps a step count in each parameter's state.
    bool counts_per_parameter() const noexcept {
        return kind_ == torch_kind::adam || kind_ == torch_kind::adamw ||
               kind_ == torch_kind::rmsprop || kind_ == torch_kind::adagrad;
    }

    std::vector<at::Tensor> torch_parameters() const {
        std::vector<at::Tensor> tensors;
        for (const auto& group : optimizer_->param_groups())
            for (const auto& p : group.params())
                tensors.push_back(p);
        return tensors;
    }

    /// Throws std::invalid_argument unless `params` are the optimizer's parameters, in order
    /// (checked by size, and by address where both can be viewed in place).
    static void check_matches(std::span<const parameter> params,
                              const std::vector<at::Tensor>& tensors) {
        if (params.size() != tensors.size())
            throw_invalid(who, "the optimizer has " + std::to_string(tensors.size()) +
                                   " parameters, not " + std::to_string(params.size()));
        for (std::size_t i = 0; i < params.size(); ++i) {
            const std::size_t n = params[i].value.size();
            if (n != tensor::size(tensors[i]))
                throw_invalid(who, "parameter " + std::to_string(i) + " has " + std::to_string(n) +
                                       " elements, the optimizer's " +
                                       std::to_string(tensor::size(tensors[i])));
            const auto ours = params[i].value.try_view();
            const auto theirs = tensor::try_view(tensors[i]);
            if (ours && theirs && ours->data() != theirs->data())
                throw_invalid(who, "parameter " + std::to_string(i) +
                                       " is not the optimizer's parameter " + std::to_string(i));
        }
    }

    /// Makes each parameter's .grad() hold the values of params[i].grad (nothing to do when
    /// it is that tensor); a missing .grad() becomes one.
    static void copy_grads(std::span<const parameter> params,
                           const std::vector<at::Tensor>& tensors) {
        const c10::NoGradGuard no_grad;
        std::vector<float> buffer;
        for (std::size_t i = 0; i < params.size(); ++i) {
            at::Tensor& grad = tensors[i].mutable_grad();
            if (!grad.defined()) grad = zero_state_like(tensors[i]);
            const auto ours = params[i].grad.try_view();
            const auto theirs = tensor::try_view(grad);
            if (ours && theirs && ours->data() == theirs->data()) continue;
            buffer.resize(params[i].grad.size());
            params[i].grad.copy_to(buffer);
            tensor::copy_from(grad, std::span<const float>(buffer));
        }
    }

    static std::int64_t state_step(const torch::optim::OptimizerParamState& s) {
        if (const auto* adam = dynamic_cast<const torch::optim::AdamParamState*>(&s))
            return adam->step();
        if (const auto* adamw = dynamic_cast<const torch::optim::AdamWParamState*>(&s))
            return adamw->step();
        if (const auto* rmsprop = dynamic_cast<const torch::optim::RMSpropParamState*>(&s))
            return rmsprop->step();
        if (const auto* adagrad = dynamic_cast<const torch::optim::AdagradParamState*>(&s))
            return adagrad->step();
        return 0;
    }

    static void set_state_step(torch::optim::OptimizerParamState& s, std::int64_t step) {
        if (auto* adam = dynamic_cast<torch::optim::AdamParamState*>(&s)) adam->step(step);
        if (auto* adamw = dynamic_cast<torch::optim::AdamWParamState*>(&s)) adamw->step(step);
        if (auto* rmsprop = dynamic_cast<torch::optim::RMSpropParamState*>(&s)) rmsprop->step(step);
        if (auto* adagrad = dynamic_cast<torch::optim::AdagradParamState*>(&s)) adagrad->step(step);
    }

    /// Creates the state the optimizer would create on its first step (zeros, step 0) for
    /// every parameter that has none.
    void make_state() {
        const c10::NoGradGuard no_grad;
        auto& state = optimizer_->state();
        for (auto& group : optimizer_->param_groups())
            for (const auto& p : group.params()) {
                auto key = state_key(p);
                if (state.find(key) != state.end()) continue;
                auto fresh = new_state(group.options(), p);
                if (!fresh) continue;
                if (kind_ == torch_kind::sgd) made_here_.insert(key);
                state[std::move(key)] = std::move(fresh);
            }
    }

    /// A parameter's first-step state, or null where the optimizer keeps none (SGD without
    /// momentum).
    std::unique_ptr<torch::optim::OptimizerParamState>
    new_state(torch::optim::OptimizerOptions& options, const at::Tensor& p) const {
        switch (kind_) {
        case torch_kind::adam: {
            auto s = std::make_unique<torch::optim::AdamParamState>();
            s->exp_avg(zero_state_like(p)).exp_avg_sq(zero_state_like(p));
            if (static_cast<torch::optim::AdamOptions&>(options).amsgrad())
                s->max_exp_avg_sq(zero_state_like(p));
            return s;
        }
        case torch_kind::adamw: {
            auto s = std::make_unique<torch::optim::AdamWParamState>();
            s->exp_avg(zero_state_like(p)).exp_avg_sq(zero_state_like(p));
            if (static_cast<torch::optim::AdamWOptions&>(options).amsgrad())
                s->max_exp_avg_sq(zero_state_like(p));
            return s;
        }
        case torch_kind::sgd: {
            if (static_cast<torch::optim::SGDOptions&>(options).momentum() == 0) return nullptr;
            auto s = std::make_unique<torch::optim::SGDParamState>();
            s->momentum_buffer(zero_state_like(p));
            return s;
        }
        case torch_kind::rmsprop: {
            const auto& o = static_cast<torch::optim::RMSpropOptions&>(options);
            auto s = std::make_unique<torch::optim::RMSpropParamState>();
            s->square_avg(zero_state_like(p));
            if (o.momentum() > 0) s->momentum_buffer(zero_state_like(p));
            if (o.centered()) s->grad_avg(zero_state_like(p));
            return s;
        }
        case torch_kind::adagrad: {
            // Adagrad makes its state in its constructor; this covers parameters added later.
            const auto& o = static_cast<torch::optim::AdagradOptions&>(options);
            auto s = std::make_unique<torch::optim::AdagradParamState>();
            s->sum(at::full_like(p, o.initial_accumulator_value(), at::MemoryFormat::Preserve));
            return s;
        }
        case torch_kind::other:
            break;
        }
        return nullptr;
    }

    /// Appends a parameter's state tensors to `out`, in the documented order.
    static void append_state(const torch::optim::OptimizerParamState& s,
                             std::vector<at::Tensor>& out, std::vector<std::string>& names) {
        const auto add = [&](const char* name, const at::Tensor& t) {
            if (!t.defined()) return;
            out.push_back(t);
            names.emplace_back(name);
        };
        if (const auto* adam = dynamic_cast<const torch::optim::AdamParamState*>(&s)) {
            add("exp_avg", adam->exp_avg());
            add("exp_avg_sq", adam->exp_avg_sq());
            add("max_exp_avg_sq", adam->max_exp_avg_sq());
        } else if (const auto* adamw = dynamic_cast<const torch::optim::AdamWParamState*>(&s)) {
            add("exp_avg", adamw->exp_avg());
            add("exp_avg_sq", adamw->exp_avg_sq());
            add("max_exp_avg_sq", adamw->max_exp_avg_sq());
        } else if (const auto* sgd = dynamic_cast<const torch::optim::SGDParamState*>(&s)) {
            add("momentum_buffer", sgd->momentum_buffer());
        } else if (const auto* rms = dynamic_cast<const torch::optim::RMSpropParamState*>(&s)) {
            add("square_avg", rms->square_avg());
            add("momentum_buffer", rms->momentum_buffer());
            add("grad_avg", rms->grad_avg());
        } else if (const auto* adagrad = dynamic_cast<const torch::optim::AdagradParamState*>(&s)) {
            add("sum", adagrad->sum());
        }
    }

    /// Makes the state if needed and points the handles at its tensors; returns their number.
    /// The handles live in a deque, which never moves them, so earlier refs stay valid.
    std::size_t refresh_handles() {
        make_state();
        std::vector<at::Tensor> current;
        std::vector<std::string> names;
        for (const auto& group : optimizer_->param_groups())
            for (const auto& p : group.params()) {
                const auto it = optimizer_->state().find(state_key(p));
                if (it != optimizer_->state().end()) append_state(*it->second, current, names);
            }
        if (handles_.size() < current.size()) handles_.resize(current.size());
        for (std::size_t i = 0; i < current.size(); ++i)
            handles_[i] = std::move(current[i]);
        names_ = std::move(names);
        return current.size();
    }

    std::shared_ptr<torch::optim::Optimizer> optimizer_;
    torch_kind kind_ = torch_kind::other;
    /// Steps taken through this wrapper (or set): the step count of SGD and unknown classes.
    std::uint64_t own_step_count_ = 0;
    /// SGD states that make_state() filled with zeros and no step has used yet.
    std::unordered_set<std::string> made_here_;
    std::deque<at::Tensor> handles_;
    std::vector<std::string> names_; ///< of the handles in use, as refresh_handles found them
};

} // namespace detail

/// A libtorch optimizer as a local optimizer, sharing ownership of it.
///
/// step(params) copies each params[i].grad into the matching parameter's .grad() (nothing to
/// copy when it is that tensor, as with parameters_of()) and calls the optimizer's step().
/// `params` must be the optimizer's parameters, all param groups in order, as parameters_of()
/// gives them for a module whose parameters() the optimizer was built from; otherwise step()
/// and state_tensors() throw std::invalid_argument (checked by size, and by memory where both
/// are contiguous float32). parameters_of() leaves out parameters that do not require grad,
/// so build the optimizer from those that do. Parameters without a .grad() get one, so every
/// parameter steps. Errors of the optimizer's own step() (c10::Error) propagate; classes
/// whose step() needs a closure (LBFGS) cannot step through this wrapper.
///
/// state_tensors() exposes the optimizer's own state tensors, parameter after parameter, making
/// the first-step state (zeros, step 0) where it is missing: Adam and AdamW: exp_avg,
/// exp_avg_sq (+ max_exp_avg_sq with amsgrad); SGD: momentum_buffer (with momentum); RMSprop:
/// square_avg (+ momentum_buffer with momentum, + grad_avg when centered); Adagrad: sum. Other
/// classes throw std::invalid_argument naming these. The references follow the state as of the
/// last step() or state_tensors() and stay valid as long as the optimizer. As with sgd(), an
/// SGD step at step_count() 0 sets the buffers to the gradient.
///
/// step_count() is the per-parameter step of Adam, AdamW, RMSprop and Adagrad (the first
/// parameter's), and set_step_count() sets it on every parameter; for other classes it counts
/// the steps taken through this object. learning_rate() is the first param group's lr,
/// set_learning_rate() sets every group's and the defaults'. name() is "torch:" and the class
/// ("torch:Adam"). Throws std::invalid_argument if `optimizer` is null.
inline local_optimizer torch_optimizer(std::shared_ptr<torch::optim::Optimizer> optimizer) {
    return local_optimizer(std::make_unique<detail::torch_algorithm>(std::move(optimizer)));
}

} // namespace hivemesh::optim
