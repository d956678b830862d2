// Integer tensors: model state that counts rather than measures (BatchNorm's
// num_batches_tracked), read and written as int64 so that no count is rounded through float32.
// They travel with a model's state but are never averaged. Backends specialise
// `integer_adaptor<T>`: this header covers std::vector<std::int64_t> and
// std::span<std::int64_t>; <hivemesh/tensor/torch.hpp> covers integer at::Tensors.
#pragma once

#include "hivemesh/tensor/tensor.hpp"

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <type_traits>
#include <vector>

namespace hivemesh::tensor {

/// Specialised for each integer tensor type. A specialisation provides:
///
///     static std::size_t size(const T&);
///     static void copy_to(const T&, std::span<std::int64_t> out);  // elements, in order
///     static void copy_from(T&, std::span<const std::int64_t> in); // converts to T's type
///
/// copy_to and copy_from throw std::system_error(errc::size_mismatch) when the span's size
/// differs from size(); copy_from throws std::system_error(errc::invalid_argument) for a value
/// the tensor's type cannot hold, before writing anything.
template <class T>
struct integer_adaptor;

namespace detail {

template <class T>
using integer_adaptor_for = integer_adaptor<std::remove_cvref_t<T>>;

} // namespace detail

/// A tensor of integers that can be read and written as int64.
template <class T>
concept integer_tensor = requires(T& t, std::span<std::int64_t> out,
                                  std::span<const std::int64_t> in) {
    { detail::integer_adaptor_for<T>::size(t) } -> std::convertible_to<std::size_t>;
    detail::integer_adaptor_for<T>::copy_to(t, out);
    detail::integer_adaptor_for<T>::copy_from(t, in);
};

namespace detail {

/// std::vector<std::int64_t> and std::span<std::int64_t>: their memory is their elements.
template <class Range>
struct contiguous_integer_adaptor {
    static std::size_t size(const Range& r) noexcept { return r.size(); }
    static void copy_to(const Range& r, std::span<std::int64_t> out) {
        check_size(r.size(), out.size(), "hivemesh::tensor::integer_ref::copy_to");
        if (!out.empty()) std::memmove(out.data(), r.data(), out.size_bytes());
    }
    static void copy_from(Range& r, std::span<const std::int64_t> in) {
        check_size(r.size(), in.size(), "hivemesh::tensor::integer_ref::copy_from");
        if (!in.empty()) std::memmove(r.data(), in.data(), in.size_bytes());
    }
};

} // namespace detail

template <class Allocator>
struct integer_adaptor<std::vector<std::int64_t, Allocator>>
    : detail::contiguous_integer_adaptor<std::vector<std::int64_t, Allocator>> {};

template <std::size_t Extent>
struct integer_adaptor<std::span<std::int64_t, Extent>>
    : detail::contiguous_integer_adaptor<std::span<std::int64_t, Extent>> {};

/// A non-owning, type-erased reference to an integer tensor, as tensor_ref is to a float one:
/// it must not outlive the object (for a handle type, the handle variable) it was made from.
class integer_ref {
public:
    template <integer_tensor T>
    requires(!std::same_as<std::remove_cvref_t<T>, integer_ref>) integer_ref(T& t)
    noexcept
        : object_(const_cast<void*>(static_cast<const void*>(std::addressof(t))))
        , ops_(&ops_for<T>) {}

    /// Number of elements.
    std::size_t size() const { return ops_->size(object_); }
    /// The elements as int64; throws errc::size_mismatch unless out.size() == size().
    void copy_to(std::span<std::int64_t> out) const { ops_->copy_to(object_, out); }
    /// Overwrites the elements; throws errc::size_mismatch, or errc::invalid_argument for a
    /// value the tensor's type cannot hold (then nothing was written).
    void copy_from(std::span<const std::int64_t> in) const { ops_->copy_from(object_, in); }

    /// The elements, copied out.
    std::vector<std::int64_t> values() const {
        std::vector<std::int64_t> out(size());
        copy_to(out);
        return out;
    }

private:
    struct operations {
        std::size_t (*size)(const void*);
        void (*copy_to)(const void*, std::span<std::int64_t>);
        void (*copy_from)(void*, std::span<const std::int64_t>);
    };

    template <class T>
    static constexpr operations ops_for{
        [](const void* p) -> std::size_t {
            return detail::integer_adaptor_for<T>::size(*static_cast<const T*>(p));
        },
        [](const void* p, std::span<std::int64_t> out) {
            detail::integer_adaptor_for<T>::copy_to(*static_cast<const T*>(p), out);
        },
        [](void* p, std::span<const std::int64_t> in) {
            detail::integer_adaptor_for<T>::copy_from(*static_cast<T*>(p), in);
        },
    };

    void* object_;
    const operations* ops_;
};

} // namespace hivemesh::tensor
