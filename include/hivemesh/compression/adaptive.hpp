// Choosing a codec per tensor: by size, by role, per tensor, or any composition of these.
#pragma once

#include "hivemesh/compression/kind.hpp"
#include "hivemesh/core/config.hpp"

#include <cstddef>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

namespace hivemesh::compression {

/// What a tensor is for; optimizers tag the tensors they hand to averaging.
enum class tensor_role : std::uint8_t { gradient, parameter, optimizer_state, other };

/// What a policy may look at when it picks a codec.
struct tensor_info {
    std::size_t index = 0; ///< position in the list of tensors being sent
    std::size_t size = 0;  ///< element count
    tensor_role role = tensor_role::other;
};

/// Picks a codec for each tensor. Policies nest: each branch of by_size, by_role and
/// per_tensor is itself a policy. Copies share the immutable decision tree.
class policy {
public:
    /// Always `k`.
    HIVEMESH_DECL policy(kind k = kind::none);

    /// `below` for tensors with fewer than `threshold` elements, `at_or_above` otherwise
    /// (small tensors cost more in codec headers and codebooks than they save).
    HIVEMESH_DECL static policy by_size(std::size_t threshold, policy below, policy at_or_above);

    /// One policy per role.
    HIVEMESH_DECL static policy by_role(policy gradient, policy parameter, policy optimizer_state,
                                        policy other);

    /// `per_index[i]` for tensor i, `fallback` past the end of the list.
    HIVEMESH_DECL static policy per_tensor(std::vector<policy> per_index, policy fallback);

    kind choose(const tensor_info& t) const { return (*choose_)(t); }

private:
    using chooser = std::function<kind(const tensor_info&)>;
    HIVEMESH_DECL explicit policy(chooser c);
    std::shared_ptr<const chooser> choose_;
};

} // namespace hivemesh::compression

#if !defined(HIVEMESH_SEPARATE_COMPILATION)
#include "hivemesh/compression/impl/adaptive.ipp"
#endif
