// libtorch backend: at::Tensor (the same type as torch::Tensor) on any device that holds data
// (CPU, CUDA, MPS, XPU, ...), with dtype float32, float16 or bfloat16, contiguous or not
// (transposed, sliced, strided, expanded for reading).
//
// Element order is the logical row-major (C) order of the tensor's sizes, whatever its strides.
// Zero-copy views exist only for contiguous float32 CPU tensors. Other CPU tensors are converted
// by libtorch straight from or into the caller's span. Tensors on other devices are staged
// through host memory: copy_to copies the tensor into a new float32 host tensor (libtorch
// converts the dtype and gathers the strides) and from there into the span; copy_from fills
// such a host tensor from the span and copies it into the tensor in place, so a parameter keeps
// its device and its storage. The staging tensor is pinned (page-locked) when the tensor is on
// CUDA and libtorch has CUDA, ordinary memory otherwise; every copy has finished on return.
// float16/bfloat16 round to nearest even on the way in.
//
// Host staging of CPU tensors: set_torch_host_staging(true) (torch_host_staging_scope for a
// scope), or the environment variable HIVEMESH_TORCH_STAGING=1 (read once, at the first use of
// the switch; any other value leaves it off), makes CPU tensors take exactly the path device
// tensors take: no zero-copy view, a separate host tensor and Tensor::copy_. It lets a machine
// without a GPU run that path: the tests run every case both ways, and a whole program (the
// example trainer) can run with it. The switch is process-wide and off by default.
//
// Writes run under c10::NoGradGuard, so parameters that require grad can be overwritten.
// Undefined tensors, meta tensors (they hold no data), non-strided layouts and other dtypes throw
// std::system_error(errc::invalid_argument); a device that fails to copy throws what libtorch
// throws (c10::Error).
#pragma once

#include "hivemesh/tensor/integer.hpp"
#include "hivemesh/tensor/tensor.hpp"

// The narrow ATen headers instead of <ATen/ATen.h>: they compile several times faster, and
// unlike <ATen/ATen.h> in libtorch 1.13 they also compile with clang in C++20 mode.
#include <ATen/Context.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/GradMode.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

namespace hivemesh::tensor {
namespace detail {

/// True when the environment variable HIVEMESH_TORCH_STAGING is exactly "1".
inline bool environment_requests_torch_host_staging() noexcept {
    const char* value = std::getenv("HIVEMESH_TORCH_STAGING");
    return value != nullptr && std::string_view(value) == "1";
}

/// The process-wide host staging switch, initialised from the environment on first use.
inline std::atomic<bool>& torch_host_staging_switch() noexcept {
    // A function-local static: one per process even in a header, initialised exactly once.
    static std::atomic<bool> staging{environment_requests_torch_host_staging()};
    return staging;
}

} // namespace detail

/// Whether CPU tensors are staged through a host tensor as device tensors are (see the file
/// comment). Never throws.
inline bool torch_host_staging() noexcept {
    return detail::torch_host_staging_switch().load();
}

/// Turns host staging of CPU tensors on or off for the whole process, overriding
/// HIVEMESH_TORCH_STAGING. Views taken earlier stay views of the tensors' memory. Never throws.
inline void set_torch_host_staging(bool on) noexcept {
    detail::torch_host_staging_switch().store(on);
}

/// Sets the host staging switch for its lifetime and restores the previous setting after, as in
/// a test that runs the same code both ways. Scopes must nest; the switch stays process-wide, so
/// threads that need different settings at the same time cannot have them.
class torch_host_staging_scope {
public:
    /// Sets the switch to `on`. Never throws.
    explicit torch_host_staging_scope(bool on) noexcept
        : previous_(torch_host_staging()) {
        set_torch_host_staging(on);
    }

    /// Restores the setting found on construction.
    ~torch_host_staging_scope() { set_torch_host_staging(previous_); }

    torch_host_staging_scope(const torch_host_staging_scope&) = delete;
    torch_host_staging_scope& operator=(const torch_host_staging_scope&) = delete;

private:
    bool previous_;
};

namespace detail {

/// Throws invalid_argument unless `t` is a defined, strided tensor of a supported dtype on a
/// device that holds data.
inline void check_torch_tensor(const at::Tensor& t, const char* operation) {
    const auto fail = [operation](const std::string& why) {
        throw std::system_error(make_error_code(errc::invalid_argument),
                                std::string(operation) + ": " + why);
    };
    if (!t.defined()) fail("the tensor is undefined");
    if (t.device().is_meta())
        fail("the tensor is on " + t.device().str() + ", a device that holds no data");
    if (t.layout() != at::kStrided) fail("only strided (dense) tensors are supported");
    const auto type = t.scalar_type();
    if (type != at::kFloat && type != at::kHalf && type != at::kBFloat16)
        fail(std::string("dtype ") + c10::toString(type) +
             " is not supported; use float32, float16 or bfloat16");
}

/// True when `t` is read and written through a host staging tensor: it is not on the CPU, or
/// host staging is on.
inline bool staged_through_host(const at::Tensor& t) {
    return !t.device().is_cpu() || torch_host_staging();
}

/// True when the tensor's memory is exactly its elements as float32 in row-major order, on the
/// CPU.
inline bool torch_viewable(const at::Tensor& t) {
    return t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous() && !t.is_neg();
}

/// A new contiguous float32 host tensor of the sizes of `t`, to stage its values in.
inline at::Tensor host_staging_tensor(const at::Tensor& t) {
    // CUDA copies pinned memory by DMA, pageable memory through a bounce buffer; a libtorch
    // without CUDA cannot allocate pinned memory at all.
    const bool pinned = t.device().is_cuda() && at::globalContext().hasCUDA();
    // new_empty rather than at::empty: <ATen/ops/empty.h> does not compile with clang 14 in
    // C++20 mode.
    return t.new_empty(
        t.sizes(), at::TensorOptions().dtype(at::kFloat).device(at::kCPU).pinned_memory(pinned));
}

/// Copies the elements of `t` into `out` (of t.numel() elements) through a host staging tensor.
inline void copy_to_through_host(const at::Tensor& t, std::span<float> out) {
    const c10::NoGradGuard no_grad;
    at::Tensor host = host_staging_tensor(t);
    host.copy_(t); // blocking: the values are on the host when it returns
    copy_floats(std::span<const float>(host.data_ptr<float>(), out.size()), out);
}

/// Overwrites the elements of `t` with `in` (of t.numel() elements) through a host staging
/// tensor; `t` keeps its device and storage.
inline void copy_from_through_host(const at::Tensor& t, std::span<const float> in) {
    const c10::NoGradGuard no_grad;
    at::Tensor host = host_staging_tensor(t);
    copy_floats(in, std::span<float>(host.data_ptr<float>(), in.size()));
    t.copy_(host); // blocking, so the staging tensor can go when it returns
}

} // namespace detail

/// Adaptor for libtorch tensors; see the file comment for devices, dtypes, order and errors.
/// at::Tensor is a handle, so a const at::Tensor is still writable (as in libtorch itself).
template <>
struct adaptor<at::Tensor> {
    /// Number of elements. Throws invalid_argument for a tensor it does not support.
    static std::size_t size(const at::Tensor& t) {
        detail::check_torch_tensor(t, "hivemesh::tensor::size");
        return static_cast<std::size_t>(t.numel());
    }

    /// Writes the elements of `t` as float32, in row-major order, into `out`. Throws
    /// invalid_argument for a tensor it does not support, size_mismatch if out.size() != size(t).
    static void copy_to(const at::Tensor& t, std::span<float> out) {
        detail::check_size(size(t), out.size(), "hivemesh::tensor::copy_to");
        if (out.empty()) return;
        if (detail::staged_through_host(t)) {
            detail::copy_to_through_host(t, out);
            return;
        }
        if (detail::torch_viewable(t)) {
            detail::copy_floats(std::span<const float>(t.data_ptr<float>(), out.size()), out);
            return;
        }
        // libtorch converts the dtype and walks the strides, writing straight into `out`.
        const c10::NoGradGuard no_grad;
        at::from_blob(out.data(), t.sizes(), at::kFloat).copy_(t);
    }

    /// Overwrites the elements of `t`, in row-major order, with `in` converted to its dtype.
    /// Throws invalid_argument for a tensor it does not support or whose elements share memory
    /// (an expanded view), size_mismatch if in.size() != size(t).
    static void copy_from(const at::Tensor& t, std::span<const float> in) {
        detail::check_size(size(t), in.size(), "hivemesh::tensor::copy_from");
        if (in.empty()) return;
        const bool staged = detail::staged_through_host(t);
        if (!staged && detail::torch_viewable(t)) {
            detail::copy_floats(in, std::span<float>(t.data_ptr<float>(), in.size()));
            return;
        }
        if (at::has_internal_overlap(t) == at::MemOverlap::Yes)
            throw std::system_error(make_error_code(errc::invalid_argument),
                                    "hivemesh::tensor::copy_from: several elements of the tensor "
                                    "share memory (an expanded view?); it cannot be written");
        if (staged) {
            detail::copy_from_through_host(t, in);
            return;
        }
        const c10::NoGradGuard no_grad;
        // copy_ only reads its source, so the const_cast never leads to a write through `in`.
        t.copy_(at::from_blob(const_cast<float*>(in.data()), t.sizes(), at::kFloat));
    }

    /// The memory of a contiguous float32 CPU tensor as float32, or std::nullopt for any other
    /// tensor and whenever host staging is on. Throws invalid_argument for a tensor it does not
    /// support.
    static std::optional<std::span<const float>> try_view(const at::Tensor& t) {
        detail::check_torch_tensor(t, "hivemesh::tensor::try_view");
        if (detail::staged_through_host(t) || !detail::torch_viewable(t)) return std::nullopt;
        return std::span<const float>(t.data_ptr<float>(), static_cast<std::size_t>(t.numel()));
    }

    /// Writable variant of try_view, with the same conditions and errors.
    static std::optional<std::span<float>> try_mutable_view(const at::Tensor& t) {
        detail::check_torch_tensor(t, "hivemesh::tensor::try_mutable_view");
        if (detail::staged_through_host(t) || !detail::torch_viewable(t)) return std::nullopt;
        return std::span<float>(t.data_ptr<float>(), static_cast<std::size_t>(t.numel()));
    }
};

/// Integer libtorch tensors (int64, int32, int16, int8, uint8) on any device that holds data,
/// such as BatchNorm's num_batches_tracked: read and written as int64 through a host tensor
/// and Tensor::copy_, which converts the type and moves the values between devices. Writes run
/// under c10::NoGradGuard. Errors: invalid_argument for an undefined, meta, non-strided or
/// non-integer tensor, for an expanded view on write, and for a value the tensor's type cannot
/// hold (checked before anything is written); size_mismatch.
template <>
struct integer_adaptor<at::Tensor> {
    static std::size_t size(const at::Tensor& t) {
        check(t, "hivemesh::tensor::integer_ref::size");
        return static_cast<std::size_t>(t.numel());
    }

    static void copy_to(const at::Tensor& t, std::span<std::int64_t> out) {
        detail::check_size(size(t), out.size(), "hivemesh::tensor::integer_ref::copy_to");
        if (out.empty()) return;
        const c10::NoGradGuard no_grad;
        at::from_blob(out.data(), t.sizes(), at::kLong).copy_(t);
    }

    static void copy_from(const at::Tensor& t, std::span<const std::int64_t> in) {
        detail::check_size(size(t), in.size(), "hivemesh::tensor::integer_ref::copy_from");
        if (in.empty()) return;
        const auto [lowest, highest] = range_of(t.scalar_type());
        for (const std::int64_t x : in)
            if (x < lowest || x > highest)
                fail("hivemesh::tensor::integer_ref::copy_from",
                     std::to_string(x) + " does not fit the tensor's " +
                         c10::toString(t.scalar_type()));
        if (at::has_internal_overlap(t) == at::MemOverlap::Yes)
            fail("hivemesh::tensor::integer_ref::copy_from",
                 "several elements of the tensor share memory (an expanded view?)");
        const c10::NoGradGuard no_grad;
        // copy_ only reads its source, so the const_cast never leads to a write through `in`.
        t.copy_(at::from_blob(const_cast<std::int64_t*>(in.data()), t.sizes(), at::kLong));
    }

private:
    [[noreturn]] static void fail(const char* operation, const std::string& why) {
        throw std::system_error(make_error_code(errc::invalid_argument),
                                std::string(operation) + ": " + why);
    }

    static void check(const at::Tensor& t, const char* operation) {
        if (!t.defined()) fail(operation, "the tensor is undefined");
        if (t.device().is_meta()) fail(operation, "the tensor is on meta, which holds no data");
        if (t.layout() != at::kStrided)
            fail(operation, "only strided (dense) tensors are supported");
        range_of(t.scalar_type(), operation);
    }

    /// The values `type` holds; throws invalid_argument for a type that is not an integer.
    static std::pair<std::int64_t, std::int64_t>
    range_of(at::ScalarType type, const char* operation = "hivemesh::tensor::integer_ref") {
        const auto limits = [](auto v) {
            using T = decltype(v);
            return std::pair<std::int64_t, std::int64_t>(std::numeric_limits<T>::lowest(),
                                                         std::numeric_limits<T>::max());
        };
        switch (type) {
        case at::kLong:
            return limits(std::int64_t{});
        case at::kInt:
            return limits(std::int32_t{});
        case at::kShort:
            return limits(std::int16_t{});
        case at::kChar:
            return limits(std::int8_t{});
        case at::kByte:
            return limits(std::uint8_t{});
        default:
            fail(operation, std::string("dtype ") + c10::toString(type) +
                                " is not an integer type; use int64, int32, int16, int8 or uint8");
        }
    }
};

} // namespace hivemesh::tensor
