// The generic layer: concepts, free functions, host_view, const_host_view, tensor_ref,
// total_size, flatten_to / unflatten_from. A toy strided tensor defined here exercises the
// host-copy paths without any third-party backend.
#include "support/errors.hpp"
#include "support/floats.hpp"

#include <hivemesh/tensor.hpp>

#include <catch2/catch.hpp>

#include <array>
#include <cstddef>
#include <numeric>
#include <stdexcept>
#include <system_error>
#include <type_traits>
#include <vector>

using hivemesh::errc;
namespace ht = hivemesh::tensor;

namespace {

using hivemesh::test::iota;
using hivemesh::test::thrown_code;

/// Every second element of `storage` is an element of the tensor; the others are padding that
/// must never be touched. Never contiguous, so it always takes the host-copy path.
struct strided_tensor {
    std::vector<float> storage;
    std::size_t elements() const { return storage.size() / 2; }
};

/// A read-only tensor with a contiguous view (to test const_host_view's zero-copy path on a
/// type that has no copy_from).
struct readonly_tensor {
    std::vector<float> values;
};

strided_tensor make_strided(std::size_t n) {
    strided_tensor t{std::vector<float>(2 * n, -1.0f)};
    for (std::size_t i = 0; i < n; ++i)
        t.storage[2 * i] = 100.0f + static_cast<float>(i);
    return t;
}

bool padding_untouched(const strided_tensor& t) {
    for (std::size_t i = 1; i < t.storage.size(); i += 2)
        if (t.storage[i] != -1.0f) return false;
    return true;
}

} // namespace

template <>
struct hivemesh::tensor::adaptor<strided_tensor> {
    static std::size_t size(const strided_tensor& t) { return t.elements(); }
    static void copy_to(const strided_tensor& t, std::span<float> out) {
        detail::check_size(t.elements(), out.size(), "copy_to");
        for (std::size_t i = 0; i < out.size(); ++i)
            out[i] = t.storage[2 * i];
    }
    static void copy_from(strided_tensor& t, std::span<const float> in) {
        detail::check_size(t.elements(), in.size(), "copy_from");
        for (std::size_t i = 0; i < in.size(); ++i)
            t.storage[2 * i] = in[i];
    }
    static std::optional<std::span<const float>> try_view(const strided_tensor&) {
        return std::nullopt;
    }
    static std::optional<std::span<float>> try_mutable_view(strided_tensor&) {
        return std::nullopt;
    }
};

template <>
struct hivemesh::tensor::adaptor<readonly_tensor> {
    static std::size_t size(const readonly_tensor& t) { return t.values.size(); }
    static void copy_to(const readonly_tensor& t, std::span<float> out) {
        detail::check_size(t.values.size(), out.size(), "copy_to");
        std::copy(t.values.begin(), t.values.end(), out.begin());
    }
    static std::optional<std::span<const float>> try_view(const readonly_tensor& t) {
        return std::span<const float>(t.values);
    }
};

// Concepts: what is and is not a tensor.
static_assert(ht::writable_tensor<strided_tensor>);
static_assert(ht::readable_tensor<const strided_tensor>);
static_assert(!ht::writable_tensor<const strided_tensor>);
static_assert(ht::readable_tensor<readonly_tensor>);
static_assert(!ht::writable_tensor<readonly_tensor>);
static_assert(!ht::readable_tensor<int>);
static_assert(!ht::readable_tensor<std::vector<double>>);
static_assert(!ht::readable_tensor<std::array<float, 3>>);
static_assert(ht::writable_tensor<ht::tensor_ref>);
static_assert(ht::writable_tensor<const ht::tensor_ref>);

// tensor_ref: two pointers, trivially copyable, refers to writable lvalues only.
static_assert(sizeof(ht::tensor_ref) == 2 * sizeof(void*));
static_assert(std::is_trivially_copyable_v<ht::tensor_ref>);
static_assert(std::is_constructible_v<ht::tensor_ref, strided_tensor&>);
static_assert(std::is_convertible_v<strided_tensor&, ht::tensor_ref>);
static_assert(!std::is_constructible_v<ht::tensor_ref, strided_tensor&&>);
static_assert(!std::is_constructible_v<ht::tensor_ref, const strided_tensor&>);
static_assert(!std::is_constructible_v<ht::tensor_ref, const strided_tensor&&>);
static_assert(!std::is_constructible_v<ht::tensor_ref, readonly_tensor&>);
static_assert(!std::is_constructible_v<ht::tensor_ref, int&>);

TEST_CASE("free functions dispatch to the adaptor", "[tensor]") {
    auto t = make_strided(4);
    CHECK(ht::size(t) == 4);

    std::vector<float> out(4);
    ht::copy_to(t, out);
    CHECK(out == std::vector<float>{100, 101, 102, 103});

    ht::copy_from(t, iota(4));
    CHECK(t.storage == std::vector<float>{1, -1, 2, -1, 3, -1, 4, -1});

    CHECK_FALSE(ht::try_view(t).has_value());
    CHECK_FALSE(ht::try_mutable_view(t).has_value());
}

TEST_CASE("size mismatches throw size_mismatch and write nothing", "[tensor]") {
    auto t = make_strided(4);
    const auto before = t.storage;
    std::vector<float> small(3), large(5);
    CHECK(thrown_code([&] { ht::copy_to(t, small); }) == errc::size_mismatch);
    CHECK(thrown_code([&] { ht::copy_to(t, large); }) == errc::size_mismatch);
    CHECK(thrown_code([&] { ht::copy_from(t, small); }) == errc::size_mismatch);
    CHECK(thrown_code([&] { ht::copy_from(t, large); }) == errc::size_mismatch);
    CHECK(t.storage == before);
    CHECK(small == std::vector<float>(3, 0.0f));
}

TEST_CASE("check_size names both sizes in its message", "[tensor]") {
    try {
        ht::detail::check_size(4, 3, "op");
        FAIL("no exception");
    } catch (const std::system_error& e) {
        CHECK(e.code() == errc::size_mismatch);
        const std::string what = e.what();
        CHECK(what.find("op") != std::string::npos);
        CHECK(what.find('4') != std::string::npos);
        CHECK(what.find('3') != std::string::npos);
    }
    CHECK_NOTHROW(ht::detail::check_size(7, 7, "op"));
}

TEST_CASE("host_view is zero-copy for contiguous float32 memory", "[tensor][host_view]") {
    auto v = iota(5);
    ht::host_view view(v);
    static_assert(std::is_same_v<decltype(view), ht::host_view<std::vector<float>>>);
    CHECK(view.zero_copy());
    CHECK(view.data() == v.data());
    CHECK(view.size() == 5);
    view[2] = 42.0f; // lands in the tensor at once
    CHECK(v[2] == 42.0f);
    view.commit(); // a no-op
    CHECK(v == std::vector<float>{1, 2, 42, 4, 5});
}

TEST_CASE("host_view copies a non-contiguous tensor and writes back on commit",
          "[tensor][host_view]") {
    auto t = make_strided(3);
    {
        ht::host_view view(t);
        CHECK_FALSE(view.zero_copy());
        CHECK(std::vector<float>(view.begin(), view.end()) == std::vector<float>{100, 101, 102});
        for (auto& x : view)
            x *= 2.0f;
        CHECK(t.storage[0] == 100.0f); // not yet written back
        view.commit();
        CHECK(t.storage == std::vector<float>{200, -1, 202, -1, 204, -1});
        view[1] = 7.0f;
        view.commit(); // commit may be repeated
        CHECK(t.storage[2] == 7.0f);
    }
    {
        ht::host_view view(t);
        view[0] = -5.0f;
        // destroyed without commit: the tensor keeps its values
    }
    CHECK(t.storage == std::vector<float>{200, -1, 7, -1, 204, -1});
    CHECK(padding_untouched(t));
}

TEST_CASE("const_host_view reads through a view or a copy", "[tensor][host_view]") {
    const readonly_tensor r{iota(4)};
    ht::const_host_view direct(r);
    CHECK(direct.zero_copy());
    CHECK(direct.data() == r.values.data());
    CHECK(direct[3] == 4.0f);

    const auto t = make_strided(3);
    ht::const_host_view copied(t);
    CHECK_FALSE(copied.zero_copy());
    CHECK(std::vector<float>(copied.begin(), copied.end()) == std::vector<float>{100, 101, 102});
    CHECK(copied.span().size() == 3);
}

TEST_CASE("host_view of an empty tensor", "[tensor][host_view]") {
    std::vector<float> empty;
    ht::host_view a(empty);
    CHECK(a.size() == 0);
    a.commit();
    auto t = make_strided(0);
    ht::host_view b(t);
    CHECK(b.size() == 0);
    CHECK_FALSE(b.zero_copy());
    b.commit();
}

TEST_CASE("tensor_ref forwards every operation to the referenced tensor", "[tensor][tensor_ref]") {
    auto v = iota(3);
    auto t = make_strided(2);
    const ht::tensor_ref rv = v;
    const ht::tensor_ref rt = t;

    CHECK(rv.size() == 3);
    CHECK(rt.size() == 2);
    CHECK(rv.address() == &v);
    CHECK(rt.address() == &t);

    REQUIRE(rv.try_view().has_value());
    CHECK(rv.try_view()->data() == v.data());
    REQUIRE(rv.try_mutable_view().has_value());
    CHECK(rv.try_mutable_view()->data() == v.data());
    CHECK_FALSE(rt.try_view().has_value());
    CHECK_FALSE(rt.try_mutable_view().has_value());

    std::vector<float> out(2);
    rt.copy_to(out);
    CHECK(out == std::vector<float>{100, 101});
    rt.copy_from(std::vector<float>{8, 9});
    CHECK(t.storage == std::vector<float>{8, -1, 9, -1});
    rv.copy_from(std::vector<float>{4, 5, 6});
    CHECK(v == std::vector<float>{4, 5, 6});

    CHECK(thrown_code([&] { rv.copy_to(out); }) == errc::size_mismatch);
    CHECK(thrown_code([&] { rt.copy_from(std::vector<float>(3)); }) == errc::size_mismatch);

    // A copy refers to the same tensor.
    ht::tensor_ref copy = rt;
    CHECK(copy.address() == &t);
    copy = rv;
    CHECK(copy.size() == 3);
}

TEST_CASE("tensor_ref is a tensor itself", "[tensor][tensor_ref]") {
    auto t = make_strided(2);
    ht::tensor_ref r = t;
    CHECK(ht::size(r) == 2);
    ht::host_view view(r);
    CHECK_FALSE(view.zero_copy());
    view[1] = 55.0f;
    view.commit();
    CHECK(t.storage[2] == 55.0f);

    auto v = iota(2);
    ht::tensor_ref rv = v;
    ht::host_view direct(rv);
    CHECK(direct.zero_copy());
    CHECK(direct.data() == v.data());
}

TEST_CASE("total_size, flatten_to and unflatten_from over several tensors",
          "[tensor][tensor_ref]") {
    auto a = iota(3, 1.0f);   // 1 2 3
    auto b = make_strided(2); // 100 101
    std::vector<float> empty;
    auto c = iota(1, 9.0f); // 9
    std::array<float, 2> d_storage{20.0f, 21.0f};
    std::span<float> d = d_storage;
    const std::vector<ht::tensor_ref> refs{a, b, empty, c, d};

    CHECK(ht::total_size(refs) == 8);
    CHECK(ht::total_size({}) == 0);

    std::vector<float> flat(8);
    ht::flatten_to(refs, flat);
    CHECK(flat == std::vector<float>{1, 2, 3, 100, 101, 9, 20, 21});

    ht::unflatten_from(refs, iota(8, 50.0f));
    CHECK(a == std::vector<float>{50, 51, 52});
    CHECK(b.storage == std::vector<float>{53, -1, 54, -1});
    CHECK(c == std::vector<float>{55});
    CHECK(d_storage == std::array<float, 2>{56, 57});

    // A wrong total is refused before any tensor is touched.
    std::vector<float> short_flat(7);
    CHECK(thrown_code([&] { ht::flatten_to(refs, short_flat); }) == errc::size_mismatch);
    CHECK(thrown_code([&] { ht::unflatten_from(refs, iota(9, 0.0f)); }) == errc::size_mismatch);
    CHECK(a == std::vector<float>{50, 51, 52});
    CHECK(b.storage == std::vector<float>{53, -1, 54, -1});
    CHECK(d_storage == std::array<float, 2>{56, 57});
}
