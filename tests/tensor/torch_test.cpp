// libtorch backend: float32 / float16 / bfloat16 CPU tensors, contiguous or not; zero-copy only
// for contiguous float32; clean errors for what is not supported. The cases run both directly
// and with host staging on, the path tensors on other devices take (no GPU is needed): the same
// values both ways, no views, and written tensors keep their storage.
//
// Only the narrow ATen headers hivemesh/tensor/torch.hpp uses are included (torch::Tensor is
// at::Tensor): in libtorch 1.13 <ATen/ATen.h>, <torch/torch.h> and even the factory-function
// headers (<ATen/ops/zeros.h>, ...) fail to compile with clang in C++20 mode, so tensors are
// made from host vectors with from_blob + clone and shaped with Tensor methods.
#include "support/errors.hpp"

#include <hivemesh/tensor.hpp>
#include <hivemesh/tensor/integer.hpp>
#include <hivemesh/tensor/torch.hpp>

#include <catch2/catch.hpp>

#include <ATen/core/Tensor.h>
#include <ATen/ops/from_blob.h>

#include <bit>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

using hivemesh::errc;
namespace ht = hivemesh::tensor;

namespace {

using hivemesh::test::thrown_code;

/// k / 8 for k = start, start + 1, ...: exactly representable in float16 and bfloat16.
std::vector<float> eighths(std::size_t n, int start) {
    std::vector<float> v(n);
    for (std::size_t i = 0; i < n; ++i)
        v[i] = static_cast<float>(start + static_cast<int>(i)) / 8;
    return v;
}

/// The tensor's elements in row-major order, read by libtorch itself (the oracle).
std::vector<float> logical_values(const at::Tensor& t) {
    const at::Tensor c = t.to(at::kFloat).contiguous();
    return {c.data_ptr<float>(), c.data_ptr<float>() + c.numel()};
}

/// A new float32 CPU tensor of shape `sizes` holding `values` in row-major order.
at::Tensor tensor_of(std::vector<float> values, at::IntArrayRef sizes) {
    return at::from_blob(values.data(), sizes, at::kFloat).clone();
}

/// 0, 1, ..., n - 1 as a float32 vector tensor.
at::Tensor arange(std::int64_t n) {
    std::vector<float> values(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < values.size(); ++i)
        values[i] = static_cast<float>(i);
    return tensor_of(std::move(values), {n});
}

/// A tensor of shape `sizes` and dtype `dtype` with every element equal to `value`.
at::Tensor filled(at::IntArrayRef sizes, float value, at::ScalarType dtype) {
    std::int64_t n = 1;
    for (const auto d : sizes)
        n *= d;
    return tensor_of(std::vector<float>(static_cast<std::size_t>(n), value), sizes).to(dtype);
}

/// 3 x 4 float32 tensor holding 0..11, row-major.
at::Tensor base_3x4() {
    return arange(12).reshape({3, 4});
}

/// Checks copy_to against libtorch's own row-major reading, then writes fresh values with
/// copy_from and checks libtorch reads them back in the same order, from the same storage and
/// dtype. Under host staging, also that the tensor is not viewed.
void check_round_trip(const at::Tensor& t, int start) {
    const auto n = static_cast<std::size_t>(t.numel());
    const void* storage = t.data_ptr();
    const auto dtype = t.scalar_type();
    REQUIRE(ht::size(t) == n);
    if (ht::torch_host_staging()) {
        CHECK_FALSE(ht::try_view(t).has_value());
        CHECK_FALSE(ht::try_mutable_view(t).has_value());
    }
    std::vector<float> out(n);
    ht::copy_to(t, out);
    CHECK(out == logical_values(t));

    const auto in = eighths(n, start);
    ht::copy_from(t, in);
    CHECK(logical_values(t) == in);
    ht::copy_to(t, out);
    CHECK(out == in);
    CHECK(t.data_ptr() == storage); // written in place
    CHECK(t.scalar_type() == dtype);
}

/// Bit patterns of `values`: equal lists are bit-identical (0.0 and -0.0 differ).
std::vector<std::uint32_t> bits_of(const std::vector<float>& values) {
    std::vector<std::uint32_t> bits;
    for (const float v : values)
        bits.push_back(std::bit_cast<std::uint32_t>(v));
    return bits;
}

/// The exit status of this test program run again with HIVEMESH_TORCH_STAGING=`value`, running
/// only the hidden cases tagged `tag`.
int exit_status_with_staging_environment(const std::string& value, const std::string& tag) {
    const auto self = std::filesystem::read_symlink("/proc/self/exe").string();
    REQUIRE(self.find('\'') == std::string::npos); // quoted for the shell below
    const std::string command =
        "HIVEMESH_TORCH_STAGING=" + value + " '" + self + "' --warn NoTests '" + tag + "'";
    return std::system(command.c_str());
}

} // namespace

static_assert(ht::writable_tensor<at::Tensor>);
static_assert(ht::writable_tensor<const at::Tensor>); // a handle, writable as in libtorch

TEST_CASE("contiguous float32 tensors are viewed in place unless staged", "[tensor][torch]") {
    const bool staging = GENERATE(false, true);
    const ht::torch_host_staging_scope scope(staging);
    INFO("host staging " << staging);
    at::Tensor t = base_3x4();
    check_round_trip(t, -20);

    if (staging) {
        CHECK_FALSE(ht::try_view(t).has_value());
        CHECK_FALSE(ht::try_mutable_view(t).has_value());
    } else {
        REQUIRE(ht::try_view(t).has_value());
        CHECK(ht::try_view(t)->data() == t.data_ptr<float>());
        CHECK(ht::try_view(t)->size() == 12);
        REQUIRE(ht::try_mutable_view(t).has_value());
        (*ht::try_mutable_view(t))[5] = 99.0f;
        CHECK(t[1][1].item<float>() == 99.0f);
    }

    // A contiguous slice with a storage offset is read and written at the right place.
    at::Tensor base = base_3x4();
    at::Tensor rows = base.narrow(0, 1, 2);
    if (!staging) {
        REQUIRE(ht::try_view(rows).has_value());
        CHECK(ht::try_view(rows)->data() == base.data_ptr<float>() + 4);
    }
    check_round_trip(rows, 1);
    CHECK(base[0][3].item<float>() == 3.0f); // the row before the slice is untouched
    CHECK(logical_values(base.narrow(0, 1, 2)) == eighths(8, 1));
}

TEST_CASE("non-contiguous float32 tensors go through a copy", "[tensor][torch]") {
    const bool staging = GENERATE(false, true);
    const ht::torch_host_staging_scope scope(staging);
    INFO("host staging " << staging);
    at::Tensor base = base_3x4();
    at::Tensor transposed = base.t(); // 4 x 3
    CHECK_FALSE(ht::try_view(transposed).has_value());
    CHECK_FALSE(ht::try_mutable_view(transposed).has_value());
    std::vector<float> out(12);
    ht::copy_to(transposed, out);
    // Row-major order of the transpose is column-major order of the base.
    CHECK(out == std::vector<float>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11});
    check_round_trip(transposed, -6);
    CHECK(base[0][1].item<float>() == -3.0f / 8); // base(0, 1) is transposed(1, 0), element 3

    at::Tensor base2 = base_3x4();
    at::Tensor columns = base2.slice(1, 1, 3); // 3 x 2, row stride 4
    CHECK_FALSE(ht::try_view(columns).has_value());
    ht::copy_to(columns, std::span<float>(out.data(), 6));
    CHECK(std::vector<float>(out.begin(), out.begin() + 6) ==
          std::vector<float>{1, 2, 5, 6, 9, 10});
    check_round_trip(columns, 3);
    CHECK(base2[0][0].item<float>() == 0.0f); // columns outside the slice are untouched
    CHECK(base2[2][3].item<float>() == 11.0f);

    at::Tensor long_vector = arange(10);
    at::Tensor every_other = long_vector.slice(0, 0, 10, 2);
    CHECK_FALSE(ht::try_view(every_other).has_value());
    check_round_trip(every_other, 0);
    CHECK(long_vector[1].item<float>() == 1.0f);

    // channels_last is dense but not in row-major order.
    at::Tensor nhwc = arange(24).reshape({1, 2, 3, 4}).contiguous(at::MemoryFormat::ChannelsLast);
    CHECK_FALSE(ht::try_view(nhwc).has_value());
    check_round_trip(nhwc, -12);
    CHECK(nhwc.is_contiguous(at::MemoryFormat::ChannelsLast)); // its layout is kept
}

TEST_CASE("float16 and bfloat16 tensors convert exactly for representable values",
          "[tensor][torch]") {
    const bool staging = GENERATE(false, true);
    const ht::torch_host_staging_scope scope(staging);
    INFO("host staging " << staging);
    for (const auto dtype : {at::kHalf, at::kBFloat16}) {
        INFO("dtype " << c10::toString(dtype));
        at::Tensor t = arange(12).reshape({3, 4}).to(dtype);
        CHECK_FALSE(ht::try_view(t).has_value());
        CHECK_FALSE(ht::try_mutable_view(t).has_value());
        std::vector<float> out(12);
        ht::copy_to(t, out);
        CHECK(out == std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
        check_round_trip(t, -40); // written in place, dtype kept

        at::Tensor transposed = arange(12).reshape({3, 4}).to(dtype).t();
        ht::copy_to(transposed, out);
        CHECK(out == std::vector<float>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11});
        check_round_trip(transposed, 7);

        // Values between representable ones are rounded by libtorch.
        at::Tensor one = filled({1}, 0, dtype);
        ht::copy_from(one, std::vector<float>{0.1f});
        CHECK(one.item<float>() == tensor_of({0.1f}, {1}).to(dtype).item<float>());
    }
}

TEST_CASE("host staging reads and writes the same bits as the direct path",
          "[tensor][torch][staging]") {
    // Fresh tensors of every kind the adaptor accepts, each made twice: one for each path.
    const std::vector<std::pair<std::string, std::function<at::Tensor()>>> kinds{
        {"contiguous", [] { return base_3x4(); }},
        {"row slice", [] { return base_3x4().narrow(0, 1, 2); }},
        {"transposed", [] { return base_3x4().t(); }},
        {"column slice", [] { return base_3x4().slice(1, 1, 3); }},
        {"every other", [] { return arange(10).slice(0, 0, 10, 2); }},
        {"channels_last",
         [] {
             return arange(24).reshape({1, 2, 3, 4}).contiguous(at::MemoryFormat::ChannelsLast);
         }},
        {"scalar", [] { return tensor_of({2.5f}, at::IntArrayRef{}); }},
        {"float16", [] { return base_3x4().to(at::kHalf); }},
        {"bfloat16 transposed", [] { return base_3x4().to(at::kBFloat16).t(); }},
        {"requires grad", [] { return base_3x4().set_requires_grad(true); }},
    };
    for (const auto& [name, make] : kinds) {
        INFO(name);
        at::Tensor direct = make();
        at::Tensor staged = make();
        const auto n = static_cast<std::size_t>(direct.numel());
        // Not representable in float16 or bfloat16, so both paths round, and large values.
        std::vector<float> in(n);
        for (std::size_t i = 0; i < n; ++i)
            in[i] = (static_cast<float>(i) - 3.3f) * 0.1f * (i % 3 == 0 ? 1e4f : 1.0f);

        std::vector<float> direct_read(n), staged_read(n);
        ht::copy_from(direct, in);
        ht::copy_to(direct, direct_read);
        {
            const ht::torch_host_staging_scope scope(true);
            ht::copy_from(staged, in);
            ht::copy_to(staged, staged_read);
        }
        CHECK(bits_of(logical_values(staged.detach())) == bits_of(logical_values(direct.detach())));
        CHECK(bits_of(staged_read) == bits_of(direct_read));
        CHECK(staged.requires_grad() == direct.requires_grad());
    }
}

TEST_CASE("scalars, empty tensors and float32 copies of float32 views", "[tensor][torch]") {
    const bool staging = GENERATE(false, true);
    const ht::torch_host_staging_scope scope(staging);
    INFO("host staging " << staging);
    at::Tensor scalar = tensor_of({2.5f}, at::IntArrayRef{});
    CHECK(ht::size(scalar) == 1);
    check_round_trip(scalar, 3);

    at::Tensor empty = filled({0, 5}, 0, at::kFloat);
    CHECK(ht::size(empty) == 0);
    ht::copy_to(empty, std::span<float>{});
    ht::copy_from(empty, std::span<const float>{});
    at::Tensor empty_half = filled({3, 0}, 0, at::kHalf);
    ht::copy_from(empty_half, std::span<const float>{});
}

TEST_CASE("parameters that require grad can be overwritten and stay where they are",
          "[tensor][torch]") {
    const bool staging = GENERATE(false, true);
    const ht::torch_host_staging_scope scope(staging);
    INFO("host staging " << staging);
    at::Tensor weight = filled({2, 3}, 0, at::kFloat).set_requires_grad(true);
    const void* weight_storage = weight.data_ptr();
    ht::copy_from(weight, eighths(6, 1));
    CHECK(logical_values(weight.detach()) == eighths(6, 1));
    CHECK(weight.requires_grad());
    CHECK(weight.data_ptr() == weight_storage);

    at::Tensor half_weight = filled({2, 3}, 0, at::kHalf).set_requires_grad(true);
    const void* half_storage = half_weight.data_ptr();
    ht::copy_from(half_weight, eighths(6, -3));
    CHECK(logical_values(half_weight.detach()) == eighths(6, -3));
    std::vector<float> out(6);
    ht::copy_to(half_weight, out);
    CHECK(out == eighths(6, -3));
    CHECK(half_weight.data_ptr() == half_storage);

    // A host_view (how the local optimizers update a parameter) commits into the same storage.
    ht::host_view view(weight);
    CHECK(view.zero_copy() == !staging);
    view[2] = -7.0f;
    view.commit();
    CHECK(weight[0][2].item<float>() == -7.0f);
    CHECK(weight.data_ptr() == weight_storage);
    CHECK(weight.requires_grad());
}

TEST_CASE("torch size mismatches throw size_mismatch", "[tensor][torch]") {
    const bool staging = GENERATE(false, true);
    const ht::torch_host_staging_scope scope(staging);
    INFO("host staging " << staging);
    at::Tensor contiguous = base_3x4();
    at::Tensor transposed = base_3x4().t();
    at::Tensor half = filled({2, 2}, 0, at::kHalf);
    std::vector<float> eleven(11), thirteen(13), five(5);
    CHECK(thrown_code([&] { ht::copy_to(contiguous, eleven); }) == errc::size_mismatch);
    CHECK(thrown_code([&] { ht::copy_from(contiguous, thirteen); }) == errc::size_mismatch);
    CHECK(thrown_code([&] { ht::copy_to(transposed, thirteen); }) == errc::size_mismatch);
    CHECK(thrown_code([&] { ht::copy_from(transposed, eleven); }) == errc::size_mismatch);
    CHECK(thrown_code([&] { ht::copy_from(half, five); }) == errc::size_mismatch);
    CHECK(logical_values(contiguous) == logical_values(base_3x4()));
    CHECK(logical_values(half) == std::vector<float>(4, 0.0f));
}

TEST_CASE("unsupported tensors throw invalid_argument", "[tensor][torch]") {
    const bool staging = GENERATE(false, true);
    const ht::torch_host_staging_scope scope(staging);
    INFO("host staging " << staging);
    std::vector<float> buffer(4);
    const std::vector<at::Tensor> unsupported{
        at::Tensor(),                                         // undefined
        filled({4}, 0, at::kInt),                             // integer dtype
        filled({4}, 0, at::kDouble),                          // float64 is not supported
        filled({4}, 0, at::kFloat).to_sparse(),               // sparse layout
        filled({4}, 0, at::kFloat).to(at::Device(at::kMeta)), // no data
    };
    for (const auto& t : unsupported) {
        CHECK(thrown_code([&] { (void)ht::size(t); }) == errc::invalid_argument);
        CHECK(thrown_code([&] { ht::copy_to(t, buffer); }) == errc::invalid_argument);
        CHECK(thrown_code([&] { ht::copy_from(t, buffer); }) == errc::invalid_argument);
        CHECK(thrown_code([&] { (void)ht::try_view(t); }) == errc::invalid_argument);
        CHECK(thrown_code([&] { (void)ht::try_mutable_view(t); }) == errc::invalid_argument);
    }
}

TEST_CASE("meta tensors hold no data and are refused naming their device",
          "[tensor][torch][staging]") {
    const bool staging = GENERATE(false, true);
    const ht::torch_host_staging_scope scope(staging);
    INFO("host staging " << staging);
    std::vector<float> buffer(6);
    for (const auto dtype : {at::kFloat, at::kHalf}) {
        INFO("dtype " << c10::toString(dtype));
        // at::empty({2, 3}, options) through a tensor: <ATen/ops/empty.h> does not compile with
        // clang 14 in C++20 mode.
        const at::Tensor meta =
            arange(1).new_empty({2, 3}, at::TensorOptions().dtype(dtype).device(at::kMeta));
        REQUIRE(meta.device().is_meta());
        const std::vector<std::function<void()>> operations{
            [&] { (void)ht::size(meta); },
            [&] { ht::copy_to(meta, buffer); },
            [&] { ht::copy_from(meta, buffer); },
            [&] { (void)ht::try_view(meta); },
            [&] { (void)ht::try_mutable_view(meta); },
        };
        for (const auto& operation : operations) {
            try {
                operation();
                FAIL("no exception");
            } catch (const std::system_error& e) {
                CHECK(e.code() == errc::invalid_argument);
                CHECK_THAT(std::string(e.what()), Catch::Matchers::Contains("on meta"));
            }
        }
    }
}

TEST_CASE("expanded tensors can be read but not written", "[tensor][torch]") {
    const bool staging = GENERATE(false, true);
    const ht::torch_host_staging_scope scope(staging);
    INFO("host staging " << staging);
    at::Tensor row = arange(3);
    at::Tensor expanded = row.expand({2, 3});
    std::vector<float> out(6);
    ht::copy_to(expanded, out);
    CHECK(out == std::vector<float>{0, 1, 2, 0, 1, 2});
    CHECK(thrown_code([&] { ht::copy_from(expanded, out); }) == errc::invalid_argument);
    CHECK(logical_values(row) == std::vector<float>{0, 1, 2});
}

TEST_CASE("host_view of a transposed tensor writes back on commit", "[tensor][torch][host_view]") {
    const bool staging = GENERATE(false, true);
    const ht::torch_host_staging_scope scope(staging);
    INFO("host staging " << staging);
    for (const auto dtype : {at::kFloat, at::kBFloat16}) {
        INFO("dtype " << c10::toString(dtype));
        at::Tensor base = arange(6).reshape({2, 3}).to(dtype);
        at::Tensor transposed = base.t(); // 3 x 2
        ht::host_view view(transposed);
        CHECK_FALSE(view.zero_copy());
        CHECK(std::vector<float>(view.begin(), view.end()) == std::vector<float>{0, 3, 1, 4, 2, 5});
        view[1] = 30.0f;                         // transposed(0, 1) = base(1, 0)
        CHECK(base[1][0].item<float>() == 3.0f); // not before commit
        view.commit();
        CHECK(base[1][0].item<float>() == 30.0f);
        CHECK(logical_values(base) == std::vector<float>{0, 1, 2, 30, 4, 5});
    }

    at::Tensor contiguous = filled({2, 2}, 0, at::kFloat);
    ht::host_view direct(contiguous);
    CHECK(direct.zero_copy() == !staging);
    direct[3] = 1.0f;
    if (staging) {
        CHECK(contiguous[1][1].item<float>() == 0.0f); // not before commit
        direct.commit();
    } else {
        CHECK(direct.data() == contiguous.data_ptr<float>());
    }
    CHECK(contiguous[1][1].item<float>() == 1.0f);

    const at::Tensor half = filled({3}, 1, at::kHalf);
    ht::const_host_view read(half);
    CHECK_FALSE(read.zero_copy());
    CHECK(std::vector<float>(read.begin(), read.end()) == std::vector<float>{1, 1, 1});
}

TEST_CASE("tensor_ref over torch and raw tensors", "[tensor][torch][tensor_ref]") {
    const bool staging = GENERATE(false, true);
    const ht::torch_host_staging_scope scope(staging);
    INFO("host staging " << staging);
    at::Tensor weight = arange(4).reshape({2, 2});
    at::Tensor transposed = arange(6).reshape({2, 3}).to(at::kBFloat16).t();
    const at::Tensor half = filled({2}, 0.5f, at::kHalf);
    std::vector<float> raw{7, 8};
    std::vector<float> span_storage{9};
    std::span<float> span = span_storage;
    const std::vector<ht::tensor_ref> refs{weight, transposed, half, raw, span};

    CHECK(ht::total_size(refs) == 15);
    if (staging) {
        CHECK_FALSE(refs[0].try_view().has_value());
    } else {
        REQUIRE(refs[0].try_view().has_value());
        CHECK(refs[0].try_view()->data() == weight.data_ptr<float>());
    }
    CHECK_FALSE(refs[1].try_view().has_value());
    CHECK_FALSE(refs[2].try_mutable_view().has_value());
    CHECK(refs[4].try_mutable_view()->data() == span_storage.data()); // not a torch tensor

    std::vector<float> flat(15);
    ht::flatten_to(refs, flat);
    CHECK(flat == std::vector<float>{0, 1, 2, 3, 0, 3, 1, 4, 2, 5, 0.5f, 0.5f, 7, 8, 9});

    ht::unflatten_from(refs, eighths(15, -7));
    const auto expected = eighths(15, -7);
    CHECK(logical_values(weight) == std::vector<float>(expected.begin(), expected.begin() + 4));
    CHECK(logical_values(transposed) ==
          std::vector<float>(expected.begin() + 4, expected.begin() + 10));
    CHECK(logical_values(half) == std::vector<float>(expected.begin() + 10, expected.begin() + 12));
    CHECK(raw == std::vector<float>(expected.begin() + 12, expected.begin() + 14));
    CHECK(span_storage[0] == expected[14]);

    // A tensor that cannot be handled fails when the list is sized, before any copy.
    at::Tensor ints = filled({2}, 0, at::kInt);
    const std::vector<ht::tensor_ref> bad{weight, ints};
    CHECK(thrown_code([&] { (void)ht::total_size(bad); }) == errc::invalid_argument);
}

TEST_CASE("HIVEMESH_TORCH_STAGING=1 turns host staging on at first use",
          "[tensor][torch][staging]") {
    // A fresh process each: the variable is read once, and this one has read it already.
    CHECK(exit_status_with_staging_environment("1", "[torch_staging_environment_on]") == 0);
    CHECK(exit_status_with_staging_environment("0", "[torch_staging_environment_off]") == 0);
}

// Hidden: run only by the case above, in a process of their own.
TEST_CASE("staged by HIVEMESH_TORCH_STAGING=1", "[.][torch_staging_environment_on]") {
    CHECK(ht::torch_host_staging());
    const at::Tensor t = base_3x4();
    CHECK_FALSE(ht::try_view(t).has_value());
    check_round_trip(t, 2);
}

TEST_CASE("not staged by HIVEMESH_TORCH_STAGING=0", "[.][torch_staging_environment_off]") {
    CHECK_FALSE(ht::torch_host_staging());
    const at::Tensor t = base_3x4();
    CHECK(ht::try_view(t).has_value());
}

TEST_CASE("integer tensors read and write as int64, and refuse a value their type cannot hold",
          "[tensor][torch][integer]") {
    const bool staging = GENERATE(false, true);
    INFO("host staging " << staging);
    const hivemesh::tensor::torch_host_staging_scope scope(staging);
    using hivemesh::tensor::integer_ref;
    // A 0-dimensional int64, as BatchNorm's num_batches_tracked.
    at::Tensor count = filled({}, 0, at::kLong);
    integer_ref count_ref(count);
    CHECK(count_ref.size() == 1);
    const std::vector<std::int64_t> big{(1LL << 53) + 1}; // not representable in float32/64
    count_ref.copy_from(big);
    CHECK(count.item<std::int64_t>() == big[0]);
    CHECK(count_ref.values() == big);

    // A transposed int32 view, written in row-major order of its own sizes.
    at::Tensor base = filled({2, 3}, 0, at::kInt);
    at::Tensor transposed = base.t();
    integer_ref t_ref(transposed);
    t_ref.copy_from(std::vector<std::int64_t>{1, 2, 3, 4, 5, 6});
    CHECK(t_ref.values() == std::vector<std::int64_t>{1, 2, 3, 4, 5, 6});
    CHECK(base[0][1].item<std::int32_t>() == 3);

    // Out of range for int32, or negative for uint8: refused before anything is written.
    CHECK_THROWS_WITH(t_ref.copy_from(std::vector<std::int64_t>{0, 0, 0, 0, 0, 1LL << 40}),
                      Catch::Matchers::Contains("does not fit"));
    CHECK(t_ref.values() == std::vector<std::int64_t>{1, 2, 3, 4, 5, 6});
    at::Tensor bytes = filled({2}, 0, at::kByte);
    integer_ref b_ref(bytes);
    CHECK_THROWS_AS(b_ref.copy_from(std::vector<std::int64_t>{-1, 0}), std::system_error);
    b_ref.copy_from(std::vector<std::int64_t>{255, 7});
    CHECK(b_ref.values() == std::vector<std::int64_t>{255, 7});

    // Sizes, other types, and expanded views.
    CHECK_THROWS_AS(count_ref.copy_from(std::vector<std::int64_t>{1, 2}), std::system_error);
    at::Tensor floats = filled({2}, 0, at::kFloat);
    CHECK_THROWS_WITH(integer_ref(floats).size(), Catch::Matchers::Contains("not an integer type"));
    at::Tensor flags = filled({2}, 0, at::kBool);
    CHECK_THROWS_WITH(integer_ref(flags).size(), Catch::Matchers::Contains("not an integer type"));
    at::Tensor expanded = filled({1}, 0, at::kLong).expand({3});
    CHECK(integer_ref(expanded).values() == std::vector<std::int64_t>{0, 0, 0});
    CHECK_THROWS_WITH(integer_ref(expanded).copy_from(std::vector<std::int64_t>{1, 2, 3}),
                      Catch::Matchers::Contains("share memory"));
}
