// The non-template functions of compression/adaptive.hpp: building the policies' decision
// trees.
#pragma once

#include "hivemesh/compression/adaptive.hpp"

namespace hivemesh::compression {

HIVEMESH_DECL policy::policy(kind k)
    : choose_(std::make_shared<const chooser>([k](const tensor_info&) { return k; })) {}

HIVEMESH_DECL policy policy::by_size(std::size_t threshold, policy below, policy at_or_above) {
    return policy([=](const tensor_info& t) {
        return t.size < threshold ? below.choose(t) : at_or_above.choose(t);
    });
}

HIVEMESH_DECL policy policy::by_role(policy gradient, policy parameter, policy optimizer_state,
                                     policy other) {
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

HIVEMESH_DECL policy policy::per_tensor(std::vector<policy> per_index, policy fallback) {
    return policy([list = std::move(per_index), fallback](const tensor_info& t) {
        return t.index < list.size() ? list[t.index].choose(t) : fallback.choose(t);
    });
}

HIVEMESH_DECL policy::policy(chooser c)
    : choose_(std::make_shared<const chooser>(std::move(c))) {}

} // namespace hivemesh::compression
