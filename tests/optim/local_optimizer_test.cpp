// What every local optimizer shares: state download (state written into a fresh optimizer's
// state tensors continues the donor's trajectory exactly), errors that leave everything as it
// was, and the type erasure itself.
#include "support/errors.hpp"
#include "support/optimizers.hpp"

#include <hivemesh/optim.hpp>
#include <hivemesh/tensor.hpp>

#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace ho = hivemesh::optim;
using hivemesh::errc;
using hivemesh::test::gradients;
using hivemesh::test::initial_values;
using hivemesh::test::newcomer_continues_donor;
using hivemesh::test::read;
using hivemesh::test::thrown_code;
using hivemesh::test::vector_parameters;

namespace {

/// The optimizers, in a vector (an initializer_list would need copies).
template <class... Optimizers>
std::vector<ho::local_optimizer> list_of(Optimizers... optimizers) {
    std::vector<ho::local_optimizer> list;
    (list.push_back(std::move(optimizers)), ...);
    return list;
}

/// A minimal algorithm that records what reaches it.
class recording_algorithm final : public ho::local_algorithm {
public:
    explicit recording_algorithm(std::vector<std::string>& log)
        : log_(log) {}

    void step(std::span<const ho::parameter> params) override {
        log_.push_back("step " + std::to_string(params.size()));
        ++count_;
    }
    std::vector<hivemesh::tensor::tensor_ref>
    state_tensors(std::span<const ho::parameter> params) override {
        log_.push_back("state_tensors " + std::to_string(params.size()));
        return {state_};
    }
    std::uint64_t step_count() const override { return count_; }
    void set_step_count(std::uint64_t count) override { count_ = count; }
    double learning_rate() const override { return lr_; }
    void set_learning_rate(double lr) override { lr_ = lr; }
    std::string name() const override { return "recording"; }

private:
    std::vector<std::string>& log_;
    std::vector<float> state_ = {1, 2};
    std::uint64_t count_ = 0;
    double lr_ = 0.5;
};

} // namespace

TEST_CASE("a newcomer given the state and step count continues the donor exactly",
          "[optim][state]") {
    CHECK(newcomer_continues_donor(ho::sgd({.lr = 0.1, .momentum = 0.9, .dampening = 0.3}),
                                   ho::sgd({.lr = 0.1, .momentum = 0.9, .dampening = 0.3}), true));
    CHECK(newcomer_continues_donor(ho::sgd({.lr = 0.1, .momentum = 0.9, .nesterov = true}),
                                   ho::sgd({.lr = 0.1, .momentum = 0.9, .nesterov = true}), true));
    CHECK(newcomer_continues_donor(ho::adam({.lr = 0.01, .weight_decay = 0.1}),
                                   ho::adam({.lr = 0.01, .weight_decay = 0.1}), true));
    CHECK(newcomer_continues_donor(
        ho::adam({.lr = 0.01, .weight_decay = 0.1, .decoupled_weight_decay = true}),
        ho::adam({.lr = 0.01, .weight_decay = 0.1, .decoupled_weight_decay = true}), true));
}

TEST_CASE("without the step count the newcomer diverges", "[optim][state]") {
    // Adam's bias correction depends on the count; SGD at count 0 replaces its buffers with
    // the gradient.
    CHECK_FALSE(newcomer_continues_donor(ho::adam({.lr = 0.01}), ho::adam({.lr = 0.01}), false));
    CHECK_FALSE(newcomer_continues_donor(ho::sgd({.lr = 0.1, .momentum = 0.9}),
                                         ho::sgd({.lr = 0.1, .momentum = 0.9}), false));
}

TEST_CASE("a value and grad of different sizes throw size_mismatch and change nothing",
          "[optim][errors]") {
    for (auto& optimizer : list_of(ho::sgd({.lr = 0.1, .momentum = 0.9}), ho::adam({.lr = 0.1}))) {
        INFO(optimizer.name());
        std::vector<float> v0{1, 2, 3}, g0{1, 1, 1}, v1{4, 5}, g1{1, 1, 1};
        const std::vector<ho::parameter> params{{v0, g0}, {v1, g1}};
        CHECK(thrown_code([&] { optimizer.step(params); }) == errc::size_mismatch);
        CHECK(v0 == std::vector<float>{1, 2, 3});
        CHECK(v1 == std::vector<float>{4, 5});
        CHECK(optimizer.step_count() == 0);

        // Nothing was fixed by the failed step: other sizes are still accepted.
        std::vector<float> g1_fixed{1, 1};
        const std::vector<ho::parameter> fixed{{v0, g0}, {v1, g1_fixed}};
        optimizer.step(fixed);
        CHECK(optimizer.step_count() == 1);
        CHECK(v1 != std::vector<float>{4, 5});
    }
}

TEST_CASE("a changed parameter list is invalid_argument and changes nothing", "[optim][errors]") {
    for (auto& optimizer : list_of(ho::sgd({.lr = 0.1}), ho::sgd({.lr = 0.1, .momentum = 0.9}),
                                   ho::adam({.lr = 0.1}))) {
        INFO(optimizer.name());
        std::vector<float> v0{1, 2, 3}, g0{1, 1, 1}, v1{4, 5}, g1{1, 1};
        std::vector<float> v2{4, 5, 6}, g2{1, 1, 1};
        optimizer.step(std::vector<ho::parameter>{{v0, g0}, {v1, g1}});
        const auto after_first = v0;

        // Fewer parameters, then one of another size.
        CHECK_THROWS_AS(optimizer.step(std::vector<ho::parameter>{{v0, g0}}),
                        std::invalid_argument);
        CHECK_THROWS_AS(optimizer.step(std::vector<ho::parameter>{{v0, g0}, {v2, g2}}),
                        std::invalid_argument);
        CHECK_THROWS_AS(optimizer.state_tensors(std::vector<ho::parameter>{{v1, g1}, {v2, g2}}),
                        std::invalid_argument);
        CHECK(v0 == after_first);
        CHECK(v2 == std::vector<float>{4, 5, 6});
        CHECK(optimizer.step_count() == 1);
    }
}

TEST_CASE("state_tensors fixes the parameter layout before the first step", "[optim][errors]") {
    auto optimizer = ho::adam({});
    std::vector<float> three(3), four(4), grad3(3), grad4(4);
    CHECK(optimizer.state_tensors(std::vector<ho::parameter>{{three, grad3}}).size() == 2);
    CHECK_THROWS_WITH(optimizer.step(std::vector<ho::parameter>{{four, grad4}}),
                      Catch::Matchers::Contains("parameter 0"));
}

TEST_CASE("a value sharing memory with its grad is rejected", "[optim][errors]") {
    std::vector<float> memory{1, 2, 3, 4};
    const std::span<float> value(memory.data(), 3), grad(memory.data() + 1, 3);
    auto optimizer = ho::sgd({});
    CHECK_THROWS_WITH(optimizer.step(std::vector<ho::parameter>{{value, grad}}),
                      Catch::Matchers::Contains("share memory"));
    CHECK(memory == std::vector<float>{1, 2, 3, 4});
}

TEST_CASE("state references survive steps and moves of the optimizer", "[optim][state]") {
    vector_parameters tensors;
    set_initial_values(tensors);
    auto optimizer = ho::adam({.lr = 0.01});
    const auto state = optimizer.state_tensors(tensors.params);
    set_gradients(tensors, 0);
    auto moved = std::move(optimizer);
    moved.step(tensors.params);
    // exp_avg after one step is (1 − β1)·g.
    const auto expected = gradients(0);
    for (std::size_t k = 0; k < expected.size(); ++k) {
        std::vector<double> scaled(expected[k]);
        for (auto& x : scaled)
            x *= 0.1;
        hivemesh::test::check_close(read(state[2 * k]), scaled);
    }
}

TEST_CASE("local_optimizer forwards to its algorithm", "[optim]") {
    std::vector<std::string> log;
    ho::local_optimizer optimizer(std::make_unique<recording_algorithm>(log));
    std::vector<float> v{1}, g{1};
    const std::vector<ho::parameter> params{{v, g}};
    optimizer.step(params);
    const auto state = optimizer.state_tensors(params);
    REQUIRE(state.size() == 1);
    CHECK(read(state[0]) == std::vector<float>{1, 2});
    CHECK(log == std::vector<std::string>{"step 1", "state_tensors 1"});
    CHECK(optimizer.step_count() == 1);
    optimizer.set_step_count(7);
    CHECK(optimizer.step_count() == 7);
    optimizer.set_learning_rate(0.25);
    CHECK(optimizer.learning_rate() == 0.25);
    CHECK(optimizer.name() == "recording");

    CHECK_THROWS_AS(ho::local_optimizer(nullptr), std::invalid_argument);
}
