// The non-template functions of tensor/tensor.hpp: size checks and flattening lists of
// tensors.
#pragma once

#include "hivemesh/tensor/tensor.hpp"

namespace hivemesh::tensor {

namespace detail {

HIVEMESH_DECL void check_size(std::size_t expected, std::size_t given, const char* operation) {
    if (expected == given) return;
    throw std::system_error(make_error_code(errc::size_mismatch),
                            std::string(operation) + ": the tensor has " +
                                std::to_string(expected) + " elements, the span " +
                                std::to_string(given));
}

} // namespace detail

HIVEMESH_DECL std::size_t total_size(std::span<const tensor_ref> tensors) {
    std::size_t total = 0;
    for (const auto& t : tensors)
        total += t.size();
    return total;
}

HIVEMESH_DECL void flatten_to(std::span<const tensor_ref> tensors, std::span<float> out) {
    detail::check_size(total_size(tensors), out.size(), "hivemesh::tensor::flatten_to");
    std::size_t offset = 0;
    for (const auto& t : tensors) {
        const std::size_t n = t.size();
        t.copy_to(out.subspan(offset, n));
        offset += n;
    }
}

HIVEMESH_DECL void unflatten_from(std::span<const tensor_ref> tensors, std::span<const float> in) {
    detail::check_size(total_size(tensors), in.size(), "hivemesh::tensor::unflatten_from");
    std::size_t offset = 0;
    for (const auto& t : tensors) {
        const std::size_t n = t.size();
        t.copy_from(in.subspan(offset, n));
        offset += n;
    }
}

} // namespace hivemesh::tensor
