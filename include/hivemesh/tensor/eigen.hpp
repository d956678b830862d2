// Eigen backend: dense float and double Eigen objects with direct memory access —
// Eigen::Matrix and Eigen::Array (fixed or dynamic size, row- or column-major, vectors), and
// Eigen::Map, Eigen::Ref and Eigen::Block of those, with or without strides.
//
// Element order is the STORAGE order: a column-major matrix reads column after column, a
// row-major one row after row (so a column-major matrix and its row-major copy do not give the
// same sequence). Zero-copy views exist only for float objects whose memory is contiguous
// (inner stride 1 and outer stride equal to the inner size); strided maps and blocks, and every
// double object, go through a host copy (double is rounded to float32 on the way out).
// Const objects, Map<const ...> and other non-lvalue objects are read-only.
#pragma once

#include "hivemesh/tensor/tensor.hpp"

#include <Eigen/Core>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <optional>
#include <span>

namespace hivemesh::tensor {
namespace detail {

// Checked first, so that non-Eigen types never instantiate Eigen templates.
template <class T>
concept has_eigen_members = requires {
    typename T::Scalar;
    T::Flags;
};

template <class T>
concept eigen_direct_access = (static_cast<unsigned>(T::Flags) & Eigen::DirectAccessBit) != 0;

template <class T>
concept eigen_lvalue = (static_cast<unsigned>(T::Flags) & Eigen::LvalueBit) != 0;

template <class T>
concept float_or_double = std::same_as<T, float> || std::same_as<T, double>;

template <class T>
concept eigen_readable = has_eigen_members<T> && std::derived_from<T, Eigen::DenseBase<T>> &&
    eigen_direct_access<T> && float_or_double<typename T::Scalar>;

// Subsumes eigen_readable, so the writable adaptor wins where both match.
template <class T>
concept eigen_writable = eigen_readable<T> && eigen_lvalue<T>;

template <class T>
bool eigen_contiguous(const T& t) noexcept {
    return t.innerStride() == 1 && (t.outerSize() <= 1 || t.outerStride() == t.innerSize());
}

/// Copies `in` to `out` (the same size), converting between float and double.
template <class From, class To>
void copy_converted(std::span<const From> in, std::span<To> out) {
    if constexpr (std::same_as<From, To>)
        copy_floats(in, out);
    else
        std::transform(in.begin(), in.end(), out.begin(),
                       [](From x) { return static_cast<To>(x); });
}

/// Calls f(element, k) for every element of `t` (whose memory starts at `data`), k counting
/// them in storage order; for strided objects.
template <class T, class Scalar, class F>
void for_each_strided(const T& t, Scalar* data, F f) {
    const Eigen::Index inner = t.innerSize(), outer = t.outerSize();
    const Eigen::Index inner_stride = t.innerStride(), outer_stride = t.outerStride();
    std::size_t k = 0;
    for (Eigen::Index j = 0; j < outer; ++j)
        for (Eigen::Index i = 0; i < inner; ++i)
            f(data[j * outer_stride + i * inner_stride], k++);
}

/// The read operations, shared by the read-only and the writable adaptor.
template <class T>
struct eigen_reader {
    using scalar = typename T::Scalar;

    static std::size_t size(const T& t) noexcept { return static_cast<std::size_t>(t.size()); }

    static void copy_to(const T& t, std::span<float> out) {
        check_size(size(t), out.size(), "hivemesh::tensor::copy_to");
        const scalar* data = t.data();
        if (eigen_contiguous(t))
            copy_converted(std::span<const scalar>(data, out.size()), out);
        else
            for_each_strided(t, data,
                             [&](scalar x, std::size_t k) { out[k] = static_cast<float>(x); });
    }

    static std::optional<std::span<const float>> try_view(const T& t) noexcept {
        if constexpr (std::same_as<scalar, float>) {
            if (eigen_contiguous(t)) return std::span<const float>(t.data(), size(t));
        }
        return std::nullopt;
    }
};

} // namespace detail

/// Read-only Eigen objects (const-mapped, non-lvalue); see the file comment.
template <detail::eigen_readable T>
struct adaptor<T> : detail::eigen_reader<T> {};

/// Writable Eigen objects; see the file comment for element order and zero-copy rules.
template <detail::eigen_writable T>
struct adaptor<T> : detail::eigen_reader<T> {
    using scalar = typename T::Scalar;

    static void copy_from(T& t, std::span<const float> in) {
        detail::check_size(adaptor::size(t), in.size(), "hivemesh::tensor::copy_from");
        scalar* data = t.data();
        if (detail::eigen_contiguous(t))
            detail::copy_converted(in, std::span<scalar>(data, in.size()));
        else
            detail::for_each_strided(
                t, data, [&](scalar& x, std::size_t k) { x = static_cast<scalar>(in[k]); });
    }

    static std::optional<std::span<float>> try_mutable_view(T& t) noexcept {
        if constexpr (std::same_as<scalar, float>) {
            if (detail::eigen_contiguous(t)) return std::span<float>(t.data(), adaptor::size(t));
        }
        return std::nullopt;
    }
};

} // namespace hivemesh::tensor
