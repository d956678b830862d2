// The trainer's models and data in libtorch: a small CNN (also with BatchNorm), an MLP and
// ResNet-18 for 28 x 28 grey images, Fashion-MNIST as uint8 tensors with batches drawn from
// them, and evaluation on the test set.
// Include <hivemesh/optim/torch.hpp> before this header (see there).
#pragma once

#include "../idx.hpp"

#include <ATen/core/Tensor.h>
#include <c10/core/GradMode.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/functional/pooling.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace hivemesh::examples {

/// A classifier of 1 x 28 x 28 images into 10 classes.
struct classifier : torch::nn::Module {
    virtual at::Tensor forward(const at::Tensor& images) = 0;
};

/// Two 3 x 3 convolutions (8 and 16 channels), each with ReLU and 2 x 2 max-pooling, then
/// 784 -> 64 -> 10: 52k parameters, 0.7 MFLOP per image forward.
class cnn final : public classifier {
public:
    cnn()
        : conv1_(register_module("conv1",
                                 torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 8, 3).padding(1))))
        , conv2_(register_module("conv2",
                                 torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 16, 3).padding(1))))
        , fc1_(register_module("fc1", torch::nn::Linear(16 * 7 * 7, 64)))
        , fc2_(register_module("fc2", torch::nn::Linear(64, 10))) {}

    at::Tensor forward(const at::Tensor& images) override {
        namespace F = torch::nn::functional;
        auto x = F::max_pool2d(F::relu(conv1_->forward(images)), F::MaxPool2dFuncOptions(2));
        x = F::max_pool2d(F::relu(conv2_->forward(x)), F::MaxPool2dFuncOptions(2));
        return fc2_->forward(F::relu(fc1_->forward(x.flatten(1))));
    }

private:
    torch::nn::Conv2d conv1_, conv2_;
    torch::nn::Linear fc1_, fc2_;
};

/// The CNN with BatchNorm after each convolution: 52k parameters, and 48 running statistics and
/// two batch counts, the buffers a swarm must keep in agreement. Small enough for CI.
class cnn_bn final : public classifier {
public:
    cnn_bn()
        : conv1_(register_module(
              "conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 8, 3).padding(1).bias(false))))
        , bn1_(register_module("bn1", torch::nn::BatchNorm2d(8)))
        , conv2_(register_module(
              "conv2",
              torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 16, 3).padding(1).bias(false))))
        , bn2_(register_module("bn2", torch::nn::BatchNorm2d(16)))
        , fc1_(register_module("fc1", torch::nn::Linear(16 * 7 * 7, 64)))
        , fc2_(register_module("fc2", torch::nn::Linear(64, 10))) {}

    at::Tensor forward(const at::Tensor& images) override {
        namespace F = torch::nn::functional;
        auto x = F::max_pool2d(F::relu(bn1_->forward(conv1_->forward(images))),
                               F::MaxPool2dFuncOptions(2));
        x = F::max_pool2d(F::relu(bn2_->forward(conv2_->forward(x))), F::MaxPool2dFuncOptions(2));
        return fc2_->forward(F::relu(fc1_->forward(x.flatten(1))));
    }

private:
    torch::nn::Conv2d conv1_;
    torch::nn::BatchNorm2d bn1_;
    torch::nn::Conv2d conv2_;
    torch::nn::BatchNorm2d bn2_;
    torch::nn::Linear fc1_, fc2_;
};

/// ResNet's basic block: two 3 x 3 convolutions with BatchNorm, and a shortcut that is the
/// identity, or a strided 1 x 1 convolution with BatchNorm where the shape changes.
class basic_block : public torch::nn::Module {
public:
    basic_block(std::int64_t in, std::int64_t out, std::int64_t stride)
        : conv1_(register_module(
              "conv1",
              torch::nn::Conv2d(
                  torch::nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false))))
        , bn1_(register_module("bn1", torch::nn::BatchNorm2d(out)))
        , conv2_(register_module(
              "conv2",
              torch::nn::Conv2d(torch::nn::Conv2dOptions(out, out, 3).padding(1).bias(false))))
        , bn2_(register_module("bn2", torch::nn::BatchNorm2d(out))) {
        if (stride != 1 || in != out) {
            shortcut_conv_ = register_module(
                "downsample_conv",
                torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 1).stride(stride).bias(false)));
            shortcut_bn_ = register_module("downsample_bn", torch::nn::BatchNorm2d(out));
        }
    }

    at::Tensor forward(const at::Tensor& x) {
        namespace F = torch::nn::functional;
        auto y = F::relu(bn1_->forward(conv1_->forward(x)));
        y = bn2_->forward(conv2_->forward(y));
        const auto shortcut =
            shortcut_conv_ ? shortcut_bn_->forward(shortcut_conv_->forward(x)) : x;
        return F::relu(y + shortcut);
    }

private:
    torch::nn::Conv2d conv1_;
    torch::nn::BatchNorm2d bn1_;
    torch::nn::Conv2d conv2_;
    torch::nn::BatchNorm2d bn2_;
    torch::nn::Conv2d shortcut_conv_{nullptr};
    torch::nn::BatchNorm2d shortcut_bn_{nullptr};
};

/// ResNet-18 as torchvision builds it (BasicBlock, [2, 2, 2, 2] blocks of 64, 128, 256 and 512
/// channels, BatchNorm, global average pooling, one linear layer), with a stem for 1 x 28 x 28
/// images: one 3 x 3 convolution of stride 1 from 1 channel, and no max-pooling, instead of
/// torchvision's 7 x 7 convolution of stride 2 from 3 channels and 3 x 3 max-pooling, which
/// would shrink a 28 x 28 image to 7 x 7 before the first block. The stages then run at 28,
/// 14, 7 and 4 pixels. 11.17M parameters (torchvision's with 10 classes: 11.18M).
class resnet18 final : public classifier {
public:
    resnet18()
        : stem_(register_module(
              "conv1",
              torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 64, 3).padding(1).bias(false))))
        , stem_bn_(register_module("bn1", torch::nn::BatchNorm2d(64)))
        , fc_(register_module("fc", torch::nn::Linear(512, 10))) {
        std::int64_t in = 64;
        for (const std::int64_t out : {64, 128, 256, 512}) {
            for (int b = 0; b < 2; ++b) {
                const std::int64_t stride = b == 0 && out != 64 ? 2 : 1;
                blocks_.push_back(register_module("layer" + std::to_string(blocks_.size() / 2 + 1) +
                                                      "_" + std::to_string(b),
                                                  std::make_shared<basic_block>(in, out, stride)));
                in = out;
            }
        }
    }

    at::Tensor forward(const at::Tensor& images) override {
        namespace F = torch::nn::functional;
        auto x = F::relu(stem_bn_->forward(stem_->forward(images)));
        for (const auto& block : blocks_)
            x = block->forward(x);
        x = F::adaptive_avg_pool2d(x, F::AdaptiveAvgPool2dFuncOptions(1));
        return fc_->forward(x.flatten(1));
    }

private:
    torch::nn::Conv2d stem_;
    torch::nn::BatchNorm2d stem_bn_;
    std::vector<std::shared_ptr<basic_block>> blocks_;
    torch::nn::Linear fc_;
};

/// 784 -> 256 -> 128 -> 10 with ReLU: 235k parameters.
class mlp final : public classifier {
public:
    mlp()
        : fc1_(register_module("fc1", torch::nn::Linear(28 * 28, 256)))
        , fc2_(register_module("fc2", torch::nn::Linear(256, 128)))
        , fc3_(register_module("fc3", torch::nn::Linear(128, 10))) {}

    at::Tensor forward(const at::Tensor& images) override {
        namespace F = torch::nn::functional;
        auto x = F::relu(fc1_->forward(images.flatten(1)));
        return fc3_->forward(F::relu(fc2_->forward(x)));
    }

private:
    torch::nn::Linear fc1_, fc2_, fc3_;
};

/// A model of trainer_options' model_names, its parameters drawn from libtorch's generator seeded
/// with `seed`, so that every peer of a run starts from the same ones.
inline std::shared_ptr<classifier> make_model(const std::string& name, std::uint64_t seed) {
    at::manual_seed(seed);
    if (name == "cnn") return std::make_shared<cnn>();
    if (name == "cnn-bn") return std::make_shared<cnn_bn>();
    if (name == "mlp") return std::make_shared<mlp>();
    if (name == "resnet18") return std::make_shared<resnet18>();
    throw std::invalid_argument("unknown model \"" + name + "\"");
}

/// One split of Fashion-MNIST as tensors: images N x 1 x 28 x 28 (uint8), labels N (int64).
struct image_set {
    at::Tensor images;
    at::Tensor labels;

    std::int64_t size() const { return labels.size(0); }
};

/// Loads split `prefix` ("train" or "t10k") from `directory`; idx_error when a file is
/// missing or malformed.
inline image_set load_split(const std::string& directory, const std::string& prefix) {
    labelled_images data = load_mnist_style(directory, prefix);
    const auto n = static_cast<std::int64_t>(data.count);
    image_set set;
    set.images = at::empty({n, 1, 28, 28}, at::kByte);
    std::memcpy(set.images.data_ptr<std::uint8_t>(), data.pixels.data(), data.pixels.size());
    set.labels = at::empty({n}, at::kLong);
    auto* labels = set.labels.data_ptr<std::int64_t>();
    for (std::int64_t i = 0; i < n; ++i)
        labels[i] = data.labels[static_cast<std::size_t>(i)];
    return set;
}

/// Images as the models take them: float, normalised with Fashion-MNIST's mean and deviation.
inline at::Tensor normalised(const at::Tensor& images) {
    return (images.to(at::kFloat).div_(255.0f).sub_(0.2860f)).div_(0.3530f);
}

/// Draws batches from a set in a random order of its own, reshuffled after every pass.
class batch_sampler {
public:
    batch_sampler(const image_set& set, std::uint64_t seed)
        : set_(&set)
        , random_(seed) {
        order_.resize(static_cast<std::size_t>(set.size()));
        std::iota(order_.begin(), order_.end(), std::int64_t{0});
        std::shuffle(order_.begin(), order_.end(), random_);
    }

    /// The next `size` images (normalised) and labels.
    std::pair<at::Tensor, at::Tensor> next(std::size_t size) {
        at::Tensor index = at::empty({static_cast<std::int64_t>(size)}, at::kLong);
        auto* out = index.data_ptr<std::int64_t>();
        for (std::size_t i = 0; i < size; ++i) {
            if (position_ == order_.size()) {
                std::shuffle(order_.begin(), order_.end(), random_);
                position_ = 0;
            }
            out[i] = order_[position_++];
        }
        return {normalised(set_->images.index_select(0, index)),
                set_->labels.index_select(0, index)};
    }

private:
    const image_set* set_;
    std::mt19937_64 random_;
    std::vector<std::int64_t> order_;
    std::size_t position_ = 0;
};

struct evaluation {
    double accuracy = 0;
    double loss = 0;
};

/// Accuracy and mean cross-entropy of `model` on the first `count` images of `set` (all of
/// them if it holds fewer), in evaluation mode (BatchNorm uses its running statistics).
inline evaluation evaluate(classifier& model, const image_set& set,
                           std::int64_t count = std::numeric_limits<std::int64_t>::max()) {
    const c10::NoGradGuard no_grad;
    struct training_mode_restored {
        classifier& model;
        bool was_training;
        ~training_mode_restored() { model.train(was_training); }
    } restore{model, model.is_training()};
    model.eval();
    constexpr std::int64_t chunk = 1000;
    double correct = 0, loss = 0;
    const std::int64_t n = std::min(set.size(), count);
    for (std::int64_t begin = 0; begin < n; begin += chunk) {
        const std::int64_t end = std::min(n, begin + chunk);
        const auto logits = model.forward(normalised(set.images.slice(0, begin, end)));
        const auto labels = set.labels.slice(0, begin, end);
        loss += torch::nn::functional::cross_entropy(
                    logits, labels,
                    torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                    .item<double>();
        correct += logits.argmax(1).eq(labels).sum().item<double>();
    }
    return {correct / static_cast<double>(n), loss / static_cast<double>(n)};
}

/// What a snapshot holds: the parameters, then the float buffers (BatchNorm's running
/// statistics), in module order; all float32.
inline std::vector<at::Tensor> snapshot_tensors(classifier& model) {
    std::vector<at::Tensor> out = model.parameters();
    for (const auto& b : model.buffers())
        if (b.scalar_type() == at::kFloat) out.push_back(b);
    return out;
}

/// The snapshot_tensors as one float32 vector (the snapshots' format).
inline std::vector<float> flat_parameters(classifier& model) {
    std::vector<float> out;
    for (const auto& t : snapshot_tensors(model)) {
        const auto c = t.detach().contiguous();
        out.insert(out.end(), c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
    }
    return out;
}

/// Sets the snapshot_tensors from flat_parameters' form; std::invalid_argument when the sizes
/// differ.
inline void set_flat_parameters(classifier& model, std::span<const float> values) {
    const c10::NoGradGuard no_grad;
    const auto tensors = snapshot_tensors(model);
    std::size_t total = 0;
    for (const auto& t : tensors)
        total += static_cast<std::size_t>(t.numel());
    if (total != values.size())
        throw std::invalid_argument("a snapshot of " + std::to_string(values.size()) +
                                    " floats does not fit this model of " + std::to_string(total) +
                                    " parameters and buffers");
    std::size_t offset = 0;
    for (const auto& t : tensors) {
        const auto n = static_cast<std::size_t>(t.numel());
        std::memcpy(t.data_ptr<float>(), values.data() + offset, n * sizeof(float));
        offset += n;
    }
}

} // namespace hivemesh::examples
