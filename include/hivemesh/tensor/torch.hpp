// libtorch backend: at::Tensor (the same type as torch::Tensor) on the CPU, with dtype float32,
// float16 or bfloat16, contiguous or not (transposed, sliced, strided, expanded for reading).
//
// Element order is the logical row-major (C) order of the tensor's sizes, whatever its strides.
// Zero-copy views exist only for contiguous float32 tensors; every other tensor goes through a
// host copy, converted by libtorch (float16/bfloat16 round to nearest even on the way in).
// Writes run under c10::NoGradGuard, so parameters that require grad can be overwritten.
// Undefined tensors, non-CPU tensors, non-strided layouts and other dtypes throw
// std::system_error(errc::invalid_argument).
#pragma once

#include "hivemesh/tensor/tensor.hpp"

// The narrow ATen headers instead of <ATen/ATen.h>: they compile several times faster, and
// unlike <ATen/ATen.h> in libtorch 1.13 they also compile with clang in C++20 mode.
#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/GradMode.h>

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <system_error>

namespace hivemesh::tensor {
namespace detail {

/// Throws invalid_argument unless `t` is a defined, strided CPU tensor of a supported dtype.
inline void check_torch_tensor(const at::Tensor& t, const char* operation) {
    const auto fail = [operation](const std::string& why) {
        throw std::system_error(make_error_code(errc::invalid_argument),
                                std::string(operation) + ": " + why);
    };
    if (!t.defined()) fail("the tensor is undefined");
    if (!t.device().is_cpu())
        fail("the tensor is on " + t.device().str() + "; only CPU tensors are supported");
    if (t.layout() != at::kStrided) fail("only strided (dense) tensors are supported");
    const auto type = t.scalar_type();
    if (type != at::kFloat && type != at::kHalf && type != at::kBFloat16)
        fail(std::string("dtype ") + c10::toString(type) +
             " is not supported; use float32, float16 or bfloat16");
}

/// True when the tensor's memory is exactly its elements as float32 in row-major order.
inline bool torch_viewable(const at::Tensor& t) {
    return t.scalar_type() == at::kFloat && t.is_contiguous() && !t.is_neg();
}

} // namespace detail

/// Adaptor for CPU libtorch tensors; see the file comment for dtypes, order and errors.
/// at::Tensor is a handle, so a const at::Tensor is still writable (as in libtorch itself).
template <>
struct adaptor<at::Tensor> {
    static std::size_t size(const at::Tensor& t) {
        detail::check_torch_tensor(t, "hivemesh::tensor::size");
        return static_cast<std::size_t>(t.numel());
    }

    static void copy_to(const at::Tensor& t, std::span<float> out) {
        detail::check_size(size(t), out.size(), "hivemesh::tensor::copy_to");
        if (out.empty()) return;
        if (detail::torch_viewable(t)) {
            detail::copy_floats(std::span<const float>(t.data_ptr<float>(), out.size()), out);
            return;
        }
        // libtorch converts the dtype and walks the strides, writing straight into `out`.
        const c10::NoGradGuard no_grad;
        at::from_blob(out.data(), t.sizes(), at::kFloat).copy_(t);
    }

    static void copy_from(const at::Tensor& t, std::span<const float> in) {
        detail::check_size(size(t), in.size(), "hivemesh::tensor::copy_from");
        if (in.empty()) return;
        if (detail::torch_viewable(t)) {
            detail::copy_floats(in, std::span<float>(t.data_ptr<float>(), in.size()));
            return;
        }
        if (at::has_internal_overlap(t) == at::MemOverlap::Yes)
            throw std::system_error(make_error_code(errc::invalid_argument),
                                    "hivemesh::tensor::copy_from: several elements of the tensor "
                                    "share memory (an expanded view?); it cannot be written");
        const c10::NoGradGuard no_grad;
        // copy_ only reads its source, so the const_cast never leads to a write through `in`.
        t.copy_(at::from_blob(const_cast<float*>(in.data()), t.sizes(), at::kFloat));
    }

    static std::optional<std::span<const float>> try_view(const at::Tensor& t) {
        detail::check_torch_tensor(t, "hivemesh::tensor::try_view");
        if (!detail::torch_viewable(t)) return std::nullopt;
        return std::span<const float>(t.data_ptr<float>(), static_cast<std::size_t>(t.numel()));
    }

    static std::optional<std::span<float>> try_mutable_view(const at::Tensor& t) {
        detail::check_torch_tensor(t, "hivemesh::tensor::try_mutable_view");
        if (!detail::torch_viewable(t)) return std::nullopt;
        return std::span<float>(t.data_ptr<float>(), static_cast<std::size_t>(t.numel()));
    }
};

} // namespace hivemesh::tensor
