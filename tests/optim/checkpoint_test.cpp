// Checkpoints: the file format refuses whatever is not a whole checkpoint, and an optimizer
// restored from one continues bit for bit as if it had never stopped.
#include "support/sim_peers.hpp"

#include <hivemesh/net/sim.hpp>
#include <hivemesh/optim/adam.hpp>
#include <hivemesh/optim/checkpoint.hpp>
#include <hivemesh/optim/collaborative.hpp>
#include <hivemesh/tensor/eigen.hpp>

#include <catch2/catch.hpp>

#include <Eigen/Core>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <unistd.h>
#include <vector>

using namespace hivemesh;
using namespace std::chrono_literals;

namespace {

using sim_optimizer = optim::collaborative_optimizer<net::sim::transport>;

optim::checkpoint sample_checkpoint() {
    optim::checkpoint c;
    c.run_id = "resnet";
    c.epoch = 12;
    c.optimizer = "adam";
    c.step_count = 12;
    c.parameters = {{1.5f, -2.0f, 0.25f}, {}, {7.0f}};
    c.buffers = {{0.5f, 0.75f}};
    c.integer_buffers = {{42}, {-1, 1LL << 40}};
    c.optimizer_state = {{0.1f, 0.2f, 0.3f}, {0.4f, 0.5f, 0.6f}, {}, {}, {1.0f}, {2.0f}};
    c.outer_start = {{3.0f}};
    c.outer_state = {{4.0f}};
    c.outer_step_count = 3;
    return c;
}

/// A scratch directory, removed with what it holds.
struct scratch_directory {
    scratch_directory()
        : path(std::filesystem::temp_directory_path() /
               ("hivemesh-checkpoint-test-" + std::to_string(::getpid()))) {
        std::filesystem::remove_all(path);
        std::filesystem::create_directories(path);
    }
    ~scratch_directory() { std::filesystem::remove_all(path); }
    std::filesystem::path path;
};

} // namespace

TEST_CASE("a checkpoint round-trips through its bytes and its file", "[optim][checkpoint]") {
    const optim::checkpoint c = sample_checkpoint();
    const byte_buffer bytes = optim::encode(c);
    optim::checkpoint back;
    REQUIRE_FALSE(optim::decode(bytes, back));
    CHECK(back == c);
    CHECK(optim::encode(back) == bytes);

    scratch_directory dir;
    const auto file = dir.path / "state.ckpt";
    optim::save_checkpoint(file, c);
    CHECK(optim::load_checkpoint(file) == c);
    // Saving again replaces it whole, and leaves no temporary file beside it.
    auto changed = c;
    changed.epoch = 13;
    optim::save_checkpoint(file, changed);
    CHECK(optim::load_checkpoint(file) == changed);
    CHECK(std::distance(std::filesystem::directory_iterator(dir.path),
                        std::filesystem::directory_iterator{}) == 1);
}

TEST_CASE("a truncated, corrupt or foreign checkpoint is refused with its reason",
          "[optim][checkpoint][errors]") {
    const byte_buffer bytes = optim::encode(sample_checkpoint());
    optim::checkpoint out;
    // Every proper prefix.
    for (std::size_t n = 0; n < bytes.size(); ++n) {
        INFO("the first " << n << " bytes");
        const auto ec = optim::decode(byte_view(bytes).first(n), out);
        CHECK((ec == errc::truncated_input || ec == errc::corrupt_data));
    }
    // Any flipped bit fails the magic, the version or the checksum.
    for (std::size_t i = 0; i < bytes.size(); ++i) {
        byte_buffer flipped = bytes;
        flipped[i] ^= std::byte{0x10};
        INFO("byte " << i);
        CHECK(optim::decode(flipped, out));
    }
    byte_buffer longer = bytes;
    longer.push_back(std::byte{0});
    CHECK(optim::decode(longer, out) == errc::corrupt_data);
    byte_buffer foreign = bytes;
    foreign[0] = std::byte{'P'};
    CHECK(optim::decode(foreign, out) == errc::bad_magic);
    byte_buffer newer = bytes;
    newer[8] = std::byte{2};
    CHECK(optim::decode(newer, out) == errc::unsupported_version);

    scratch_directory dir;
    CHECK_THROWS_WITH(optim::load_checkpoint(dir.path / "missing"),
                      Catch::Contains("missing") && Catch::Contains("cannot read"));
    const auto file = dir.path / "cut.ckpt";
    REQUIRE_FALSE(replace_file(file, byte_view(bytes).first(bytes.size() / 2)));
    CHECK_THROWS_WITH(optim::load_checkpoint(file),
                      Catch::Contains("cut.ckpt") && Catch::Contains("not a valid checkpoint"));
    CHECK_THROWS_WITH(optim::save_checkpoint(dir.path / "no" / "such" / "dir", sample_checkpoint()),
                      Catch::Contains("cannot write checkpoint"));
}

namespace {

/// How the optimizer under test trains.
enum class training_mode { gradients, local_updates, diloco };

constexpr std::size_t model_size = 300;

/// A model of two parameters, raw or Eigen, with a float and an integer buffer.
template <class Vector>
struct model {
    model() {
        for (auto* v : {&first, &first_grad})
            v->resize(model_size / 3);
        for (auto* v : {&second, &second_grad})
            v->resize(model_size - model_size / 3);
        for (std::size_t j = 0; j < model_size / 3; ++j)
            first[static_cast<long>(j)] = 0.0f;
        for (std::size_t j = 0; j < model_size - model_size / 3; ++j)
            second[static_cast<long>(j)] = 0.0f;
    }

    /// A deterministic gradient of the step: (w − c)·(1 + step mod 3), and buffers that
    /// change as a BatchNorm layer's would.
    void compute(std::uint64_t step) {
        const float scale = 1.0f + static_cast<float>(step % 3);
        for (long j = 0; j < static_cast<long>(first.size()); ++j)
            first_grad[j] = scale * (first[j] - std::sin(0.1f * static_cast<float>(j)));
        for (long j = 0; j < static_cast<long>(second.size()); ++j)
            second_grad[j] = scale * (second[j] - 0.5f);
        for (std::size_t j = 0; j < running.size(); ++j)
            running[j] = 0.9f * running[j] + 0.1f * static_cast<float>(step + j);
        ++tracked[0];
    }

    std::vector<optim::parameter> parameters() {
        return {{first, first_grad}, {second, second_grad}};
    }
    optim::model_buffers buffers() { return {{running}, {tracked}}; }

    std::vector<float> values() const {
        std::vector<float> out(first.begin(), first.end());
        out.insert(out.end(), second.begin(), second.end());
        out.insert(out.end(), running.begin(), running.end());
        return out;
    }

    Vector first, first_grad, second, second_grad;
    std::vector<float> running = std::vector<float>(8, 0.0f);
    std::vector<std::int64_t> tracked = {0};
};

optim::collaborative_options single_options(training_mode mode) {
    optim::collaborative_options o;
    o.run_id = "resume";
    o.target_batch_size = 128;
    o.batch_size_per_step = 32;
    o.matchmaking_time = 2s;
    o.averaging_timeout = 5s;
    o.use_local_updates = mode == training_mode::local_updates;
    if (mode == training_mode::diloco) {
        optim::sgd_options outer;
        outer.lr = 0.7;
        outer.momentum = 0.9;
        outer.nesterov = true;
        o.outer_optimizer = outer;
    }
    o.learning_rate_schedule = [](std::uint64_t epoch) { return 0.05 / (1.0 + 0.1 * epoch); };
    return o;
}

optim::local_optimizer local_adam() {
    optim::adam_options a;
    a.lr = 0.05;
    a.weight_decay = 0.01;
    return optim::adam(a);
}

/// One peer alone and its optimizer over `m`.
template <class Vector>
struct single_peer {
    single_peer(test::sim_peers& peers, model<Vector>& m, training_mode mode)
        : peers(peers)
        , peer(peers.add_peer())
        , optimizer(std::make_unique<sim_optimizer>(peer, m.parameters(), local_adam(),
                                                    single_options(mode), m.buffers())) {}

    /// Steps until the local epoch is `epochs`; returns the steps taken.
    std::uint64_t train_to(model<Vector>& m, std::uint64_t epochs, std::uint64_t step) {
        while (optimizer->local_epoch() < epochs) {
            m.compute(step++);
            std::optional<std::error_code> done;
            optimizer->async_step(0, [&](std::error_code ec, optim::step_report) { done = ec; });
            REQUIRE(peers.run_until([&] { return done.has_value(); }, 60s));
            REQUIRE_FALSE(*done);
        }
        return step;
    }

    optim::checkpoint state_dict() {
        std::optional<optim::checkpoint> got;
        optimizer->async_state_dict([&](std::error_code ec, optim::checkpoint c) {
            REQUIRE_FALSE(ec);
            got = std::move(c);
        });
        REQUIRE(peers.run_until([&] { return got.has_value(); }, 60s));
        return std::move(*got);
    }

    std::error_code load(optim::checkpoint c) {
        std::optional<std::error_code> done;
        optimizer->async_load_state_dict(std::move(c), [&](std::error_code ec) { done = ec; });
        REQUIRE(peers.run_until([&] { return done.has_value(); }, 60s));
        return *done;
    }

    /// Closes the optimizer and lets its withdrawals go out while the peer runs.
    ~single_peer() {
        optimizer->close();
        peers.run_for(1s);
    }

    test::sim_peers& peers;
    test::sim_peer& peer;
    std::unique_ptr<sim_optimizer> optimizer;
};

template <class Vector>
void check_resume_is_exact(training_mode mode) {
    constexpr std::uint64_t stop_at = 3, last = 7;
    // Uninterrupted.
    test::sim_peers straight(40);
    model<Vector> a;
    single_peer<Vector> first(straight, a, mode);
    const std::uint64_t steps = first.train_to(a, last, 0);

    // Stopped at epoch 3, saved, and restored into a new peer, optimizer and model.
    test::sim_peers interrupted(41);
    byte_buffer file;
    std::uint64_t step = 0;
    {
        model<Vector> b;
        single_peer<Vector> before(interrupted, b, mode);
        step = before.train_to(b, stop_at, 0);
        file = optim::encode(before.state_dict());
    }
    optim::checkpoint saved;
    REQUIRE_FALSE(optim::decode(file, saved));
    CHECK(saved.epoch == stop_at);
    CHECK(saved.integer_buffers == std::vector<std::vector<std::int64_t>>{{std::int64_t(step)}});
    model<Vector> c;
    single_peer<Vector> after(interrupted, c, mode);
    REQUIRE_FALSE(after.load(saved));
    CHECK(after.optimizer->local_epoch() == stop_at);
    CHECK(c.tracked[0] == static_cast<std::int64_t>(step));
    CHECK(after.train_to(c, last, step) == steps);

    CHECK(c.values() == a.values());
    CHECK(c.tracked == a.tracked);
    const auto resumed = after.state_dict(), reference = first.state_dict();
    CHECK(resumed == reference);
    CHECK(resumed.step_count > 0);
    if (mode == training_mode::diloco) CHECK(resumed.outer_step_count == last);
}

} // namespace

TEST_CASE("a single peer restored from its checkpoint continues bit for bit as one that never "
          "stopped",
          "[optim][checkpoint][sim]") {
    const auto mode =
        GENERATE(training_mode::gradients, training_mode::local_updates, training_mode::diloco);
    INFO("mode " << static_cast<int>(mode));
    SECTION("raw vectors") {
        check_resume_is_exact<std::vector<float>>(mode);
    }
    SECTION("Eigen vectors") {
        check_resume_is_exact<Eigen::VectorXf>(mode);
    }
}

TEST_CASE("a checkpoint of another run, optimizer or model changes nothing",
          "[optim][checkpoint][sim][errors]") {
    test::sim_peers peers(42);
    model<std::vector<float>> m;
    single_peer<std::vector<float>> p(peers, m, training_mode::gradients);
    p.train_to(m, 2, 0);
    const optim::checkpoint good = p.state_dict();
    const auto before = m.values();
    const auto tracked = m.tracked;

    const auto refused = [&](auto change, errc expected) {
        optim::checkpoint c = good;
        change(c);
        CHECK(p.load(std::move(c)) == expected);
        CHECK(m.values() == before);
        CHECK(m.tracked == tracked);
        CHECK(p.optimizer->local_epoch() == 2);
    };
    refused([](auto& c) { c.run_id = "other"; }, errc::invalid_argument);
    refused([](auto& c) { c.optimizer = "sgd"; }, errc::invalid_argument);
    refused([](auto& c) { c.parameters.pop_back(); }, errc::size_mismatch);
    refused([](auto& c) { c.parameters[1].push_back(0.0f); }, errc::size_mismatch);
    refused([](auto& c) { c.buffers.clear(); }, errc::size_mismatch);
    refused([](auto& c) { c.integer_buffers[0].push_back(1); }, errc::size_mismatch);
    refused([](auto& c) { c.optimizer_state.pop_back(); }, errc::size_mismatch);
    refused([](auto& c) { c.outer_start = {{1.0f}}; }, errc::size_mismatch);
    refused([](auto& c) { c.optimizer_state[0][0] = NAN; }, errc::corrupt_data);
    refused([](auto& c) { c.buffers[0][3] = INFINITY; }, errc::corrupt_data);

    // The good one restores, and the epoch goes back with it.
    p.train_to(m, 3, 100);
    REQUIRE_FALSE(p.load(good));
    CHECK(m.values() == before);
    CHECK(m.tracked == tracked);
    CHECK(p.optimizer->local_epoch() == 2);
}
