// The tensor adaptor concept: how hivemesh reads and writes the elements of a tensor it does not
// own, whatever library the tensor comes from. Backends specialise `adaptor<T>`:
// <hivemesh/tensor/raw.hpp> (std::span, std::vector), <hivemesh/tensor/eigen.hpp> and
// <hivemesh/tensor/torch.hpp>. Include a backend before the first use of its types with these
// concepts (a concept checked before the specialisation is visible keeps its first answer).
//
// Every tensor is seen as a flat sequence of float32 values in a fixed logical order chosen by
// its backend. Tensors stored as contiguous float32 can be viewed in place (zero-copy); all
// others (other dtypes, strided or transposed layouts) are converted through a host copy.
#pragma once

#include "hivemesh/core/config.hpp"
#include "hivemesh/core/error.hpp"

#include <concepts>
#include <cstddef>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

namespace hivemesh::tensor {

/// Specialised by each backend for the tensor types it supports. A specialisation provides:
///
///     static std::size_t size(const T&);                   // number of elements
///     static void copy_to(const T&, std::span<float> out); // elements as float32, in order
///     static std::optional<std::span<const float>> try_view(const T&);
///
/// and, for tensors that can be written:
///
///     static void copy_from(T&, std::span<const float> in);  // converts to the tensor's dtype
///     static std::optional<std::span<float>> try_mutable_view(T&);
///
/// copy_to and copy_from throw std::system_error(errc::size_mismatch) when the span's size
/// differs from size(). The views are zero-copy float32 views of the tensor's memory, in the
/// same order as copy_to, or std::nullopt when the memory is not contiguous float32.
template <class T>
struct adaptor;

namespace detail {

template <class T>
using adaptor_for = adaptor<std::remove_cvref_t<T>>;

/// Throws size_mismatch unless a span of `given` elements fits a tensor of `expected`.
HIVEMESH_DECL void check_size(std::size_t expected, std::size_t given, const char* operation);

/// memmove that accepts empty (possibly null) ranges and identical source and destination.
inline void copy_floats(std::span<const float> from, std::span<float> to) noexcept {
    if (!from.empty() && from.data() != to.data())
        std::memmove(to.data(), from.data(), from.size() * sizeof(float));
}

template <class A, class T>
concept readable_adaptor = requires(const T& t, std::span<float> out) {
    { A::size(t) } -> std::convertible_to<std::size_t>;
    A::copy_to(t, out);
    { A::try_view(t) } -> std::same_as<std::optional<std::span<const float>>>;
};

template <class A, class T>
concept writable_adaptor = requires(T& t, std::span<const float> in) {
    A::copy_from(t, in);
    { A::try_mutable_view(t) } -> std::same_as<std::optional<std::span<float>>>;
};

} // namespace detail

/// A tensor whose elements can be read as float32: adaptor<T> provides size, copy_to and
/// try_view.
template <class T>
concept readable_tensor = detail::readable_adaptor<detail::adaptor_for<T>, T>;

/// A readable tensor that can also be written: adaptor<T> provides copy_from and
/// try_mutable_view. Handle types with shallow constness (std::span<float>, at::Tensor,
/// tensor_ref) stay writable when const; value types (std::vector, Eigen::Matrix) do not.
template <class T>
concept writable_tensor = readable_tensor<T> && detail::writable_adaptor<detail::adaptor_for<T>, T>;

/// Number of elements of `t`.
template <readable_tensor T>
std::size_t size(const T& t) {
    return detail::adaptor_for<T>::size(t);
}

/// Writes the elements of `t`, in its backend's logical order, as float32 into `out`.
/// Throws std::system_error(errc::size_mismatch) if out.size() != size(t).
template <readable_tensor T>
void copy_to(const T& t, std::span<float> out) {
    detail::adaptor_for<T>::copy_to(t, out);
}

/// Overwrites the elements of `t` with `in` (converted to the tensor's dtype).
/// Throws std::system_error(errc::size_mismatch) if in.size() != size(t).
template <writable_tensor T>
void copy_from(T& t, std::span<const float> in) {
    detail::adaptor_for<T>::copy_from(t, in);
}

/// The memory of `t` as float32 without copying, or std::nullopt if it is not contiguous
/// float32.
template <readable_tensor T>
std::optional<std::span<const float>> try_view(const T& t) {
    return detail::adaptor_for<T>::try_view(t);
}

/// Writable variant of try_view.
template <writable_tensor T>
std::optional<std::span<float>> try_mutable_view(T& t) {
    return detail::adaptor_for<T>::try_mutable_view(t);
}

namespace detail {

/// What host_view and const_host_view share: the float32 span, and the host copy behind it
/// when the tensor cannot be viewed in place.
template <class Float>
class host_span {
public:
    /// True when the span is the tensor's own memory.
    bool zero_copy() const noexcept { return zero_copy_; }

    std::span<Float> span() const noexcept { return view_; }
    Float* data() const noexcept { return view_.data(); }
    std::size_t size() const noexcept { return view_.size(); }
    auto begin() const noexcept { return view_.begin(); }
    auto end() const noexcept { return view_.end(); }
    Float& operator[](std::size_t i) const noexcept { return view_[i]; }

protected:
    /// Views `in_place` if the adaptor gave it, else a host copy of `t`.
    template <class T>
    host_span(std::optional<std::span<Float>> in_place, const T& t) {
        if (in_place) {
            view_ = *in_place;
            zero_copy_ = true;
        } else {
            copy_.resize(adaptor_for<T>::size(t));
            adaptor_for<T>::copy_to(t, copy_);
            view_ = copy_;
        }
    }
    host_span(const host_span&) = delete;
    host_span& operator=(const host_span&) = delete;

    std::vector<float> copy_;

private:
    std::span<Float> view_;
    bool zero_copy_ = false;
};

} // namespace detail

/// Writable float32 access to a tensor's elements for the lifetime of the view.
///
/// Contiguous float32 tensors are viewed in place (zero_copy() is true and writes land directly
/// in the tensor). Every other tensor (float16/bfloat16/double, strided, transposed) is copied
/// into a host buffer on construction; writes reach the tensor only when commit() is called.
/// The destructor never writes back: a view abandoned by an exception leaves the tensor as it
/// was. The tensor must outlive the view and must not be resized meanwhile.
template <writable_tensor T>
class host_view : public detail::host_span<float> {
public:
    /// Views `t`; throws what the adaptor throws (e.g. for an unsupported device or dtype).
    explicit host_view(T& t)
        : host_span(detail::adaptor_for<T>::try_mutable_view(t), t)
        , tensor_(std::addressof(t)) {}

    /// Writes the host copy back into the tensor; a no-op when the view is zero-copy.
    void commit() {
        if (!zero_copy())
            detail::adaptor_for<T>::copy_from(*tensor_, std::span<const float>(copy_));
    }

private:
    T* tensor_;
};

/// Read-only float32 access to a tensor's elements: zero-copy for contiguous float32 tensors,
/// otherwise a host copy made on construction. The tensor must outlive the view, and for a
/// zero-copy view later writes to the tensor show through it.
template <readable_tensor T>
class const_host_view : public detail::host_span<const float> {
public:
    /// Views `t`; throws what the adaptor throws (e.g. for an unsupported device or dtype).
    explicit const_host_view(const T& t)
        : host_span(detail::adaptor_for<T>::try_view(t), t) {}
};

class tensor_ref;

namespace detail {

template <class T>
concept not_tensor_ref = !std::same_as<std::remove_cvref_t<T>, tensor_ref>;

// not_tensor_ref first: checking writable_tensor<tensor_ref> inside tensor_ref would recurse.
template <class T>
concept referable_tensor = not_tensor_ref<T> && writable_tensor<T>;

/// Operations of one tensor type, called through a pointer to the (possibly const) object.
struct tensor_ops {
    std::size_t (*size)(const void*);
    void (*copy_to)(const void*, std::span<float>);
    void (*copy_from)(void*, std::span<const float>);
    std::optional<std::span<const float>> (*try_view)(const void*);
    std::optional<std::span<float>> (*try_mutable_view)(void*);
};

// T may be const (e.g. const at::Tensor); the casts restore exactly the constness it had.
template <class T>
inline constexpr tensor_ops tensor_ops_for{
    [](const void* p) -> std::size_t { return adaptor_for<T>::size(*static_cast<const T*>(p)); },
    [](const void* p, std::span<float> out) {
        adaptor_for<T>::copy_to(*static_cast<const T*>(p), out);
    },
    [](void* p, std::span<const float> in) { adaptor_for<T>::copy_from(*static_cast<T*>(p), in); },
    [](const void* p) { return adaptor_for<T>::try_view(*static_cast<const T*>(p)); },
    [](void* p) { return adaptor_for<T>::try_mutable_view(*static_cast<T*>(p)); },
};

} // namespace detail

/// A non-owning, type-erased reference to any writable tensor, so that one function can take a
/// list of tensors from different backends (`std::span<const tensor_ref>`). Two pointers, no
/// allocation; copies refer to the same tensor. Like a reference, it must not outlive the
/// object it was made from: for handle types (std::span, Eigen::Map, at::Tensor) that is the
/// handle variable itself, so keep the handle alive, not just the memory behind it.
/// Constness is shallow, as for std::span: a const tensor_ref still writes its tensor.
class tensor_ref {
public:
    /// Refers to `t`; implicit, so `std::vector<tensor_ref> refs{a, b, c}` works.
    template <detail::referable_tensor T>
    tensor_ref(T& t) noexcept
        : object_(const_cast<void*>(static_cast<const void*>(std::addressof(t))))
        , ops_(&detail::tensor_ops_for<T>) {}

    /// Temporaries would dangle.
    template <detail::not_tensor_ref T>
    tensor_ref(const T&&) = delete;

    /// Number of elements; see hivemesh::tensor::size.
    std::size_t size() const { return ops_->size(object_); }
    /// See hivemesh::tensor::copy_to; throws errc::size_mismatch.
    void copy_to(std::span<float> out) const { ops_->copy_to(object_, out); }
    /// See hivemesh::tensor::copy_from; throws errc::size_mismatch.
    void copy_from(std::span<const float> in) const { ops_->copy_from(object_, in); }
    /// See hivemesh::tensor::try_view.
    std::optional<std::span<const float>> try_view() const { return ops_->try_view(object_); }
    /// See hivemesh::tensor::try_mutable_view.
    std::optional<std::span<float>> try_mutable_view() const {
        return ops_->try_mutable_view(object_);
    }

    /// The address of the referenced object (the tensor or handle itself, not its data).
    const void* address() const noexcept { return object_; }

private:
    void* object_;
    const detail::tensor_ops* ops_;
};

/// tensor_ref is itself a writable tensor, so host_view<tensor_ref> and friends work.
template <>
struct adaptor<tensor_ref> {
    static std::size_t size(const tensor_ref& t) { return t.size(); }
    static void copy_to(const tensor_ref& t, std::span<float> out) { t.copy_to(out); }
    static void copy_from(const tensor_ref& t, std::span<const float> in) { t.copy_from(in); }
    static std::optional<std::span<const float>> try_view(const tensor_ref& t) {
        return t.try_view();
    }
    static std::optional<std::span<float>> try_mutable_view(const tensor_ref& t) {
        return t.try_mutable_view();
    }
};

/// Sum of the sizes of `tensors`: the length of their concatenation.
HIVEMESH_DECL std::size_t total_size(std::span<const tensor_ref> tensors);

/// Writes the elements of all `tensors`, one tensor after another, into `out`.
/// Throws std::system_error(errc::size_mismatch) if out.size() != total_size(tensors).
HIVEMESH_DECL void flatten_to(std::span<const tensor_ref> tensors, std::span<float> out);

/// The reverse of flatten_to: fills each tensor from consecutive slices of `in`. On a size
/// mismatch it throws std::system_error(errc::size_mismatch) before writing anything.
HIVEMESH_DECL void unflatten_from(std::span<const tensor_ref> tensors, std::span<const float> in);

} // namespace hivemesh::tensor

#if !defined(HIVEMESH_SEPARATE_COMPILATION)
#include "hivemesh/tensor/impl/tensor.ipp"
#endif
