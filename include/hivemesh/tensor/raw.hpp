// Raw-buffer tensors: std::vector<float> and std::span<float> (writable), std::span<const float>
// (read-only). Their element order is their memory order, and every view is zero-copy.
#pragma once

#include "hivemesh/tensor/tensor.hpp"

#include <cstddef>
#include <optional>
#include <span>
#include <vector>

namespace hivemesh::tensor {

/// std::vector<float> (any allocator). copy_from never resizes: the sizes must already match.
template <class Allocator>
struct adaptor<std::vector<float, Allocator>> {
    using vector_type = std::vector<float, Allocator>;

    static std::size_t size(const vector_type& v) noexcept { return v.size(); }
    static void copy_to(const vector_type& v, std::span<float> out) {
        detail::check_size(v.size(), out.size(), "hivemesh::tensor::copy_to");
        detail::copy_floats(v, out);
    }
    static void copy_from(vector_type& v, std::span<const float> in) {
        detail::check_size(v.size(), in.size(), "hivemesh::tensor::copy_from");
        detail::copy_floats(in, v);
    }
    static std::optional<std::span<const float>> try_view(const vector_type& v) noexcept {
        return std::span<const float>(v);
    }
    static std::optional<std::span<float>> try_mutable_view(vector_type& v) noexcept {
        return std::span<float>(v);
    }
};

/// std::span<float> (any extent): a handle, so a const span still writes its elements.
template <std::size_t Extent>
struct adaptor<std::span<float, Extent>> {
    using span_type = std::span<float, Extent>;

    static std::size_t size(const span_type& s) noexcept { return s.size(); }
    static void copy_to(const span_type& s, std::span<float> out) {
        detail::check_size(s.size(), out.size(), "hivemesh::tensor::copy_to");
        detail::copy_floats(s, out);
    }
    static void copy_from(const span_type& s, std::span<const float> in) {
        detail::check_size(s.size(), in.size(), "hivemesh::tensor::copy_from");
        detail::copy_floats(in, s);
    }
    static std::optional<std::span<const float>> try_view(const span_type& s) noexcept {
        return std::span<const float>(s);
    }
    static std::optional<std::span<float>> try_mutable_view(const span_type& s) noexcept {
        return std::span<float>(s);
    }
};

/// std::span<const float> (any extent): read-only, so neither copy_from nor try_mutable_view.
template <std::size_t Extent>
struct adaptor<std::span<const float, Extent>> {
    using span_type = std::span<const float, Extent>;

    static std::size_t size(const span_type& s) noexcept { return s.size(); }
    static void copy_to(const span_type& s, std::span<float> out) {
        detail::check_size(s.size(), out.size(), "hivemesh::tensor::copy_to");
        detail::copy_floats(s, out);
    }
    static std::optional<std::span<const float>> try_view(const span_type& s) noexcept {
        return std::span<const float>(s);
    }
};

} // namespace hivemesh::tensor
