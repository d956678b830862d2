// Choosing a codec per tensor: by size, by role, per tensor, or any composition of these.
#pragma once

#include "hivemesh/compression/kind.hpp"

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
    policy(kind k = kind::none)
        : choose_(std::make_shared<const chooser>([k](const tensor_info&) { return k; })) {}

    /// `below` for tensors with fewer than `threshold` elements, `at_or_above` otherwise
    /// (small tensors cost more in codec headers and codebooks than they save).
    static policy by_size(std::size_t threshold, policy below, policy at_or_above) {
        return policy([=](const tensor_info& t) {
            return t.size < threshold ? below.choose(t) : at_or_above.choose(t);
        });
    }

    /// One policy per role.
    static policy by_role(policy gradient, policy parameter, policy optimizer_state, policy other) {
        return policy([=](const tensor_info& t) {
            switch (t.role) {
            case tensor_role::gradient:
                return gradient.choose(t);
            case tensor_role::parameter:
                return parameter.choose(t);
            case tensor_role::optimizer_state:
                return optimizer_state.choose(t);
            case tensor_role::other:
                break;
            }
            return other.choose(t);
        });
    }

    /// `per_index[i]` for tensor i, `fallback` past the end of the list.
    static policy per_tensor(std::vector<policy> per_index, policy fallback) {
        return policy([list = std::move(per_index), fallback](const tensor_info& t) {
            return t.index < list.size() ? list[t.index].choose(t) : fallback.choose(t);
        });
    }

    kind choose(const tensor_info& t) const { return (*choose_)(t); }

private:
    using chooser = std::function<kind(const tensor_info&)>;
    explicit policy(chooser c)
        : choose_(std::make_shared<const chooser>(std::move(c))) {}
    std::shared_ptr<const chooser> choose_;
};

} // namespace hivemesh::compression
