// Local optimizers over Eigen tensors: float vectors (viewed in place), double vectors and
// strided maps (updated through a host copy that must be written back), and a parameter list
// mixing backends, all against the double-precision references.
#include "support/optimizers.hpp"

#include <hivemesh/optim.hpp>
#include <hivemesh/tensor.hpp>
#include <hivemesh/tensor/eigen.hpp>

#include <catch2/catch.hpp>

#include <Eigen/Core>

#include <cstddef>
#include <vector>

namespace ho = hivemesh::optim;
using hivemesh::test::check_against_reference;
using hivemesh::test::oracle_sizes;
using hivemesh::test::reference_adam;
using hivemesh::test::reference_sgd;

namespace {

const ho::sgd_options sgd_options{
    .lr = 0.05, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.1};
const ho::adam_options adamw_options{
    .lr = 0.01, .weight_decay = 0.1, .decoupled_weight_decay = true};

/// Values and grads of the oracle problem as Eigen vectors of `Vector`.
template <class Vector>
struct eigen_parameters {
    eigen_parameters() {
        for (const auto n : oracle_sizes()) {
            values.emplace_back(static_cast<Eigen::Index>(n));
            grads.emplace_back(static_cast<Eigen::Index>(n));
        }
        for (std::size_t k = 0; k < values.size(); ++k)
            params.push_back({values[k], grads[k]});
    }
    eigen_parameters(const eigen_parameters&) = delete;
    eigen_parameters& operator=(const eigen_parameters&) = delete;

    std::vector<Vector> values;
    std::vector<Vector> grads;
    std::vector<ho::parameter> params;
};

/// Values and grads as maps with inner stride 2 over float buffers whose odd elements hold a
/// sentinel the optimizer must not touch.
struct strided_parameters {
    using map = Eigen::Map<Eigen::VectorXf, 0, Eigen::InnerStride<2>>;
    static constexpr float sentinel = 42.0f;

    strided_parameters() {
        for (const auto n : oracle_sizes()) {
            value_memory.emplace_back(2 * n, sentinel);
            grad_memory.emplace_back(2 * n, sentinel);
        }
        for (std::size_t k = 0; k < value_memory.size(); ++k) {
            const auto n = static_cast<Eigen::Index>(value_memory[k].size() / 2);
            values.emplace_back(value_memory[k].data(), n);
            grads.emplace_back(grad_memory[k].data(), n);
        }
        for (std::size_t k = 0; k < values.size(); ++k)
            params.push_back({values[k], grads[k]});
    }
    strided_parameters(const strided_parameters&) = delete;
    strided_parameters& operator=(const strided_parameters&) = delete;

    /// Whether every odd element still holds the sentinel.
    bool padding_intact() const {
        for (const auto& memory : value_memory)
            for (std::size_t i = 1; i < memory.size(); i += 2)
                if (memory[i] != sentinel) return false;
        return true;
    }

    std::vector<std::vector<float>> value_memory;
    std::vector<std::vector<float>> grad_memory;
    std::vector<map> values;
    std::vector<map> grads;
    std::vector<ho::parameter> params;
};

} // namespace

TEST_CASE("optimizers over Eigen float vectors follow the references", "[optim][eigen]") {
    {
        eigen_parameters<Eigen::VectorXf> tensors;
        REQUIRE(hivemesh::tensor::try_mutable_view(tensors.values[0])); // the zero-copy path
        auto optimizer = ho::sgd(sgd_options);
        reference_sgd reference(sgd_options);
        check_against_reference(optimizer, reference, tensors.params, 3);
    }
    {
        eigen_parameters<Eigen::VectorXf> tensors;
        auto optimizer = ho::adam(adamw_options);
        reference_adam reference(adamw_options);
        check_against_reference(optimizer, reference, tensors.params, 3);
    }
}

TEST_CASE("optimizers over Eigen double vectors write the copies back", "[optim][eigen]") {
    {
        eigen_parameters<Eigen::VectorXd> tensors;
        REQUIRE_FALSE(hivemesh::tensor::try_mutable_view(tensors.values[0])); // the copy path
        auto optimizer = ho::sgd(sgd_options);
        reference_sgd reference(sgd_options);
        const auto expected = check_against_reference(optimizer, reference, tensors.params, 3);
        // The double objects themselves hold the results.
        for (std::size_t k = 0; k < expected.size(); ++k)
            for (std::size_t i = 0; i < expected[k].size(); ++i)
                CHECK(tensors.values[k](static_cast<Eigen::Index>(i)) ==
                      Approx(expected[k][i]).epsilon(1e-6));
    }
    {
        eigen_parameters<Eigen::VectorXd> tensors;
        auto optimizer = ho::adam(adamw_options);
        reference_adam reference(adamw_options);
        check_against_reference(optimizer, reference, tensors.params, 3);
    }
}

TEST_CASE("optimizers over strided Eigen maps write back and keep the padding", "[optim][eigen]") {
    {
        strided_parameters tensors;
        REQUIRE_FALSE(hivemesh::tensor::try_mutable_view(tensors.values[0]));
        auto optimizer = ho::sgd(sgd_options);
        reference_sgd reference(sgd_options);
        check_against_reference(optimizer, reference, tensors.params, 3);
        CHECK(tensors.padding_intact());
    }
    {
        strided_parameters tensors;
        auto optimizer = ho::adam(adamw_options);
        reference_adam reference(adamw_options);
        check_against_reference(optimizer, reference, tensors.params, 3);
        CHECK(tensors.padding_intact());
    }
}

TEST_CASE("one parameter list may mix backends", "[optim][eigen]") {
    // Parameter 0 in Eigen float, 1 in std::vector, 2 in Eigen double with float grads.
    const auto sizes = oracle_sizes();
    Eigen::VectorXf v0(static_cast<Eigen::Index>(sizes[0])), g0(v0.size());
    std::vector<float> v1(sizes[1]), g1(sizes[1]);
    Eigen::VectorXd v2(static_cast<Eigen::Index>(sizes[2]));
    std::vector<float> g2(sizes[2]);
    const std::vector<ho::parameter> params{{v0, g0}, {v1, g1}, {v2, g2}};
    auto optimizer = ho::adam(adamw_options);
    reference_adam reference(adamw_options);
    check_against_reference(optimizer, reference, params, 3);
}
