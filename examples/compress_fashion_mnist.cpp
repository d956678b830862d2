// Every tensor codec on real Fashion-MNIST data, reporting size, error and throughput.
//
//   compress_fashion_mnist [--data DIR] [--images N] [--json FILE]
//
// Two tensors are compressed:
//   pixels     the training images as float32, normalized (p/255 - 0.2860)/0.3530;
//   gradients  the mini-batch gradients of a softmax-regression model trained on those
//              images for one SGD epoch: the kind of tensor the averaging layer sends.
// Plus zstd (the byte-payload compressor) on the raw label and pixel bytes.
#include "idx.hpp"
#include "program.hpp"

#include <hivemesh/compression.hpp>
#include <hivemesh/core.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <limits>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

namespace hc = hivemesh::compression;
namespace hx = hivemesh::examples;

constexpr const char* program = "compress_fashion_mnist";

// Fashion-MNIST's pixel mean and standard deviation on [0, 1].
constexpr float pixel_mean = 0.2860f;
constexpr float pixel_std = 0.3530f;

constexpr std::size_t batch_size = 100;
constexpr double learning_rate = 0.01;
constexpr int zstd_level = 3;

struct arguments {
    std::string data = "/usr/share/datasets/fashion-mnist";
    std::optional<std::size_t> images;
    std::string json;
};

arguments parse_arguments(int argc, char** argv) {
    CLI::App app{"Every tensor codec on real Fashion-MNIST data: size, error and throughput.",
                 program};
    app.option_defaults()->always_capture_default();
    arguments args;
    app.add_option("--data", args.data,
                   "directory with train-images-idx3-ubyte[.gz] and train-labels-idx1-ubyte[.gz]")
        ->type_name("DIR");
    app.add_option("--images", args.images, "use the first N training images (default: all)")
        ->check(hivemesh::program::positive);
    app.add_option("--json", args.json, "also write the results as JSON to FILE")
        ->type_name("FILE");
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        hivemesh::program::exit_after(app, e);
    }
    return args;
}

// ---------------------------------------------------------------- tensors

struct tensor {
    std::string name;
    std::string description;
    std::vector<float> values;
    std::size_t row_length; ///< meanstd_16bit normalizes each row of this many values
    std::string row_description;
};

std::vector<float> normalized_pixels(const hx::labelled_images& data) {
    std::vector<float> values(data.pixels.size());
    for (std::size_t i = 0; i < values.size(); ++i)
        values[i] = (static_cast<float>(data.pixels[i]) / 255.0f - pixel_mean) / pixel_std;
    return values;
}

/// Eight partial sums: a single float sum would serialize on the add latency.
float dot(const float* a, const float* b, std::size_t n) noexcept {
    std::array<float, 8> sums{};
    std::size_t k = 0;
    for (; k + 8 <= n; k += 8)
        for (std::size_t j = 0; j < 8; ++j)
            sums[j] += a[k + j] * b[k + j];
    for (; k < n; ++k)
        sums[0] += a[k] * b[k];
    float total = 0;
    for (float s : sums)
        total += s;
    return total;
}

struct training_summary {
    std::size_t batches = 0;
    double accuracy = 0;  ///< of the predictions made before each batch's update
    double mean_loss = 0; ///< cross-entropy, same predictions
};

/// One epoch of mini-batch SGD on softmax regression (per class: one weight per pixel and a
/// bias), starting from zero weights. Returns every batch's gradient, concatenated: class-major
/// weights (10 x pixels) then the 10 biases. Real gradients on real data, not synthetic noise.
std::vector<float> softmax_regression_gradients(const hx::labelled_images& data,
                                                std::span<const float> pixels,
                                                training_summary& summary) {
    constexpr std::size_t classes = hx::labelled_images::classes;
    const std::size_t d = data.pixels_per_image();
    const std::size_t per_batch = classes * (d + 1);
    std::vector<float> weights(classes * d, 0.0f), bias(classes, 0.0f), gradient(per_batch);
    std::vector<float> gradients;
    gradients.reserve((data.count + batch_size - 1) / batch_size * per_batch);
    std::size_t correct = 0;
    double loss = 0;
    for (std::size_t start = 0; start < data.count; start += batch_size) {
        const std::size_t size = std::min(batch_size, data.count - start);
        std::fill(gradient.begin(), gradient.end(), 0.0f);
        for (std::size_t i = start; i < start + size; ++i) {
            const float* x = pixels.data() + i * d;
            const std::size_t label = data.labels[i];
            std::array<double, classes> logits{};
            for (std::size_t c = 0; c < classes; ++c)
                logits[c] = bias[c] + dot(weights.data() + c * d, x, d);
            const auto best = std::max_element(logits.begin(), logits.end());
            if (static_cast<std::size_t>(best - logits.begin()) == label) ++correct;
            const double top = *best; // subtracted so that exp() cannot overflow
            const double label_logit = logits[label] - top;
            std::array<double, classes> exps{};
            double total = 0;
            for (std::size_t c = 0; c < classes; ++c)
                total += exps[c] = std::exp(logits[c] - top);
            loss += std::log(total) - label_logit;
            for (std::size_t c = 0; c < classes; ++c) {
                const auto delta = static_cast<float>(exps[c] / total - (c == label ? 1.0 : 0.0));
                float* g = gradient.data() + c * d;
                for (std::size_t k = 0; k < d; ++k)
                    g[k] += delta * x[k];
                gradient[classes * d + c] += delta;
            }
        }
        const float mean = 1.0f / static_cast<float>(size);
        for (float& g : gradient)
            g *= mean;
        gradients.insert(gradients.end(), gradient.begin(), gradient.end());
        const auto step = static_cast<float>(learning_rate);
        for (std::size_t k = 0; k < classes * d; ++k)
            weights[k] -= step * gradient[k];
        for (std::size_t c = 0; c < classes; ++c)
            bias[c] -= step * gradient[classes * d + c];
        ++summary.batches;
    }
    summary.accuracy = static_cast<double>(correct) / static_cast<double>(data.count);
    summary.mean_loss = loss / static_cast<double>(data.count);
    return gradients;
}

// ---------------------------------------------------------------- measuring

using steady = std::chrono::steady_clock;

/// Best wall-clock time of up to three runs (one when a run takes over a second): the best
/// run is the one least disturbed by the rest of the machine.
template <class Fn>
double best_seconds(Fn&& fn) {
    double best = std::numeric_limits<double>::infinity();
    double total = 0;
    for (int run = 0; run < 3 && total < 1.0; ++run) {
        const auto start = steady::now();
        fn();
        const double seconds = std::chrono::duration<double>(steady::now() - start).count();
        best = std::min(best, seconds);
        total += seconds;
    }
    return best;
}

double gb_per_second(std::size_t bytes, double seconds) {
    return static_cast<double>(bytes) / seconds / 1e9;
}

void check(std::error_code ec, const std::string& what) {
    if (ec) throw std::runtime_error(what + " failed: " + ec.message());
}

struct result {
    std::string codec;
    std::size_t input_bytes = 0;
    std::size_t compressed_bytes = 0;
    double ratio = 0;
    double relative_l2_error = 0;
    double max_abs_error = 0;
    double mse = 0;
    double compress_gbps = 0;
    double decompress_gbps = 0;
};

void set_errors(result& r, std::span<const float> original, std::span<const float> decoded) {
    double squared_error = 0, squared_norm = 0, max_abs = 0;
    for (std::size_t i = 0; i < original.size(); ++i) {
        const double x = original[i];
        const double difference = static_cast<double>(decoded[i]) - x;
        squared_error += difference * difference;
        squared_norm += x * x;
        if (!(std::fabs(difference) <= max_abs)) max_abs = std::fabs(difference); // keeps NaN
    }
    const auto n = static_cast<double>(std::max<std::size_t>(original.size(), 1));
    r.relative_l2_error = squared_norm > 0    ? std::sqrt(squared_error / squared_norm)
                          : squared_error > 0 ? std::numeric_limits<double>::infinity()
                                              : 0.0;
    r.max_abs_error = max_abs;
    r.mse = squared_error / n;
}

/// `buffer` and `decoded` are reused across codecs so the timings exclude allocation.
result measure_codec(hc::kind codec, const tensor& t, hivemesh::byte_buffer& buffer,
                     std::vector<float>& decoded) {
    const std::string name(hc::to_string(codec));
    hc::options opts;
    if (codec == hc::kind::meanstd_16bit) opts.row_length = t.row_length;
    result r;
    r.codec = name;
    r.input_bytes = t.values.size() * sizeof(float);
    const double compress_seconds = best_seconds([&] {
        buffer.clear();
        check(hc::compress_into(codec, t.values, buffer, opts), name + " compress");
    });
    decoded.assign(t.values.size(), 0.0f);
    const double decompress_seconds =
        best_seconds([&] { check(hc::decompress_into(buffer, decoded), name + " decompress"); });
    r.compressed_bytes = buffer.size();
    r.ratio = static_cast<double>(r.input_bytes) / static_cast<double>(r.compressed_bytes);
    r.compress_gbps = gb_per_second(r.input_bytes, compress_seconds);
    r.decompress_gbps = gb_per_second(r.input_bytes, decompress_seconds);
    set_errors(r, t.values, decoded);
    return r;
}

/// zstd through compress_bytes / decompress_bytes, checked to round-trip exactly.
result measure_zstd(const std::string& label, hivemesh::byte_view input,
                    hivemesh::byte_buffer& buffer) {
    const hc::byte_options opts{.threshold = 512, .level = zstd_level};
    result r;
    r.codec = label;
    r.input_bytes = input.size();
    const double compress_seconds = best_seconds([&] {
        buffer.clear();
        check(hc::compress_bytes_into(input, buffer, opts), "zstd compress of " + label);
    });
    hivemesh::byte_buffer decoded;
    const double decompress_seconds = best_seconds([&] {
        std::error_code ec;
        decoded = hc::decompress_bytes(buffer, input.size(), ec);
        check(ec, "zstd decompress of " + label);
    });
    if (decoded.size() != input.size() ||
        (!input.empty() && std::memcmp(decoded.data(), input.data(), input.size()) != 0))
        throw std::runtime_error("zstd round trip of " + label + " changed the data");
    r.compressed_bytes = buffer.size();
    r.ratio = static_cast<double>(r.input_bytes) / static_cast<double>(r.compressed_bytes);
    r.compress_gbps = gb_per_second(r.input_bytes, compress_seconds);
    r.decompress_gbps = gb_per_second(r.input_bytes, decompress_seconds);
    return r;
}

struct tensor_report {
    const tensor* source;
    std::vector<result> rows;
};

tensor_report measure_tensor(const tensor& t) {
    tensor_report report{&t, {}};
    hivemesh::byte_buffer buffer;
    buffer.reserve(hc::compressed_size(hc::kind::none, t.values.size()));
    std::vector<float> decoded;
    for (const hc::kind codec : hc::all_kinds)
        report.rows.push_back(measure_codec(codec, t, buffer, decoded));
    // Lossless reference: what the generic byte compressor makes of the same float32 bytes.
    report.rows.push_back(measure_zstd("zstd-" + std::to_string(zstd_level) + " (lossless)",
                                       std::as_bytes(std::span(t.values)), buffer));
    return report;
}

// ---------------------------------------------------------------- output

void print_tensor_table(const tensor_report& report) {
    const tensor& t = *report.source;
    std::printf("\n%s: %zu float32 values (%.2f MB), %s\n", t.name.c_str(), t.values.size(),
                static_cast<double>(t.values.size() * sizeof(float)) / 1e6, t.description.c_str());
    std::printf("  meanstd_16bit: %s; blockwise_8bit: blocks of %zu\n", t.row_description.c_str(),
                hc::options{}.block_size);
    std::printf("%-20s %12s %8s %11s %11s %11s %10s %10s\n", "codec", "bytes", "ratio",
                "rel L2 err", "max abs err", "MSE", "comp GB/s", "dec GB/s");
    for (const result& r : report.rows)
        std::printf("%-20s %12zu %8.3f %11.3e %11.3e %11.3e %10.3f %10.3f\n", r.codec.c_str(),
                    r.compressed_bytes, r.ratio, r.relative_l2_error, r.max_abs_error, r.mse,
                    r.compress_gbps, r.decompress_gbps);
}

void print_bytes_table(const std::vector<result>& rows) {
    std::printf("\nzstd level %d on the raw IDX payloads (uint8, lossless)\n", zstd_level);
    std::printf("%-20s %12s %12s %8s %10s %10s\n", "payload", "bytes", "compressed", "ratio",
                "comp GB/s", "dec GB/s");
    for (const result& r : rows)
        std::printf("%-20s %12zu %12zu %8.3f %10.3f %10.3f\n", r.codec.c_str(), r.input_bytes,
                    r.compressed_bytes, r.ratio, r.compress_gbps, r.decompress_gbps);
}

nlohmann::ordered_json result_json(const result& r, bool lossy_fields) {
    nlohmann::ordered_json out = {{"codec", r.codec},
                                  {"input_bytes", r.input_bytes},
                                  {"compressed_bytes", r.compressed_bytes},
                                  {"ratio", r.ratio}};
    if (lossy_fields) {
        out["relative_l2_error"] = r.relative_l2_error;
        out["max_abs_error"] = r.max_abs_error;
        out["mse"] = r.mse;
    }
    out["compress_gb_per_s"] = r.compress_gbps;
    out["decompress_gb_per_s"] = r.decompress_gbps;
    return out;
}

nlohmann::ordered_json json_report(const hx::labelled_images& data,
                                   const training_summary& training,
                                   const std::vector<tensor_report>& tensors,
                                   const std::vector<result>& byte_rows) {
    nlohmann::ordered_json out;
    out["dataset"] = {{"image_file", data.image_file.string()},
                      {"label_file", data.label_file.string()},
                      {"images", data.count},
                      {"rows", data.rows},
                      {"cols", data.cols}};
    out["throughput"] = {{"unit", "1e9 bytes of input per second, wall clock"}, {"threads", 1}};
    out["training"] = {{"model", "softmax regression"},  {"batch_size", batch_size},
                       {"learning_rate", learning_rate}, {"batches", training.batches},
                       {"accuracy", training.accuracy},  {"mean_loss", training.mean_loss}};
    auto& tensors_json = out["tensors"] = nlohmann::ordered_json::array();
    for (const tensor_report& report : tensors) {
        const tensor& t = *report.source;
        nlohmann::ordered_json codecs = nlohmann::ordered_json::array();
        for (const result& r : report.rows)
            codecs.push_back(result_json(r, true));
        tensors_json.push_back({{"name", t.name},
                                {"description", t.description},
                                {"elements", t.values.size()},
                                {"meanstd_row_length", t.row_length},
                                {"codecs", std::move(codecs)}});
    }
    nlohmann::ordered_json payloads = nlohmann::ordered_json::array();
    for (const result& r : byte_rows)
        payloads.push_back(result_json(r, false));
    out["zstd_raw_bytes"] = {{"level", zstd_level}, {"payloads", std::move(payloads)}};
    return out;
}

int run(const arguments& args) {
    const hx::labelled_images data = hx::load_mnist_style(args.data, "train", args.images);
    // Created before the long measurements so that a bad path fails fast.
    if (!args.json.empty() && !std::ofstream(args.json, std::ios::trunc))
        throw std::runtime_error("cannot open " + args.json + " for writing");
    std::printf("hivemesh compression on Fashion-MNIST: %zu training images of %zu x %zu\n",
                data.count, data.rows, data.cols);
    std::printf("  images: %s\n  labels: %s\n", data.image_file.c_str(), data.label_file.c_str());

    tensor pixels{"pixels", "normalized (p/255 - 0.2860)/0.3530", normalized_pixels(data),
                  data.pixels_per_image(), "one row per image"};
    training_summary training;
    tensor gradients{"gradients",
                     "softmax-regression mini-batch gradients (one SGD epoch, batch " +
                         std::to_string(batch_size) + ")",
                     softmax_regression_gradients(data, pixels.values, training),
                     hx::labelled_images::classes * (data.pixels_per_image() + 1),
                     "one row per batch gradient"};
    std::printf("  softmax regression, one SGD epoch (batch %zu, lr %g): %zu gradients, "
                "accuracy %.1f %%, mean loss %.3f\n",
                batch_size, learning_rate, training.batches, 100.0 * training.accuracy,
                training.mean_loss);
    std::printf("  throughput: 1e9 bytes of input per second, wall clock, one thread, best of "
                "up to 3 runs\n");

    std::vector<tensor_report> reports;
    for (const tensor* t : {&pixels, &gradients}) {
        reports.push_back(measure_tensor(*t));
        print_tensor_table(reports.back());
    }

    hivemesh::byte_buffer buffer;
    std::vector<result> byte_rows;
    byte_rows.push_back(measure_zstd("labels", std::as_bytes(std::span(data.labels)), buffer));
    byte_rows.push_back(measure_zstd("pixels", std::as_bytes(std::span(data.pixels)), buffer));
    print_bytes_table(byte_rows);

    if (!args.json.empty()) {
        hivemesh::program::write_json(args.json, json_report(data, training, reports, byte_rows));
        std::printf("\nJSON written to %s\n", args.json.c_str());
    }
    return 0;
}

} // namespace

int main(int argc, char** argv) {
    try {
        return run(parse_arguments(argc, argv));
    } catch (const hx::idx_missing_file& e) {
        std::fprintf(stderr,
                     "%s: %s\n  install the Debian package dataset-fashion-mnist, or point "
                     "--data at a directory holding the Fashion-MNIST IDX files\n",
                     program, e.what());
        return 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s: error: %s\n", program, e.what());
        return 1;
    }
}
