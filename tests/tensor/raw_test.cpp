// Raw-buffer backend: std::vector<float>, std::span<float>, std::span<const float>.
#include "support/errors.hpp"
#include "support/floats.hpp"

#include <hivemesh/tensor.hpp>

#include <catch2/catch.hpp>

#include <array>
#include <numeric>
#include <span>
#include <system_error>
#include <vector>

using hivemesh::errc;
namespace ht = hivemesh::tensor;

namespace {

using hivemesh::test::iota;
using hivemesh::test::thrown_code;

} // namespace

static_assert(ht::writable_tensor<std::vector<float>>);
static_assert(ht::readable_tensor<const std::vector<float>>);
static_assert(!ht::writable_tensor<const std::vector<float>>);
static_assert(ht::writable_tensor<std::span<float>>);
static_assert(ht::writable_tensor<const std::span<float>>); // a handle: shallow constness
static_assert(ht::writable_tensor<std::span<float, 4>>);
static_assert(ht::readable_tensor<std::span<const float>>);
static_assert(!ht::writable_tensor<std::span<const float>>);
static_assert(ht::readable_tensor<std::span<const float, 2>>);
static_assert(!ht::writable_tensor<std::span<const float, 2>>);
static_assert(!ht::readable_tensor<std::span<double>>);
static_assert(!ht::readable_tensor<std::vector<int>>);

TEST_CASE("std::vector<float> round-trips through zero-copy views", "[tensor][raw]") {
    auto v = iota(6, 1.0f);
    CHECK(ht::size(v) == 6);

    std::vector<float> out(6);
    ht::copy_to(v, out);
    CHECK(out == v);

    const auto in = iota(6, -3.0f);
    ht::copy_from(v, in);
    CHECK(v == in);
    CHECK(v.size() == 6);

    REQUIRE(ht::try_view(v).has_value());
    CHECK(ht::try_view(v)->data() == v.data());
    CHECK(ht::try_view(v)->size() == 6);
    REQUIRE(ht::try_mutable_view(v).has_value());
    CHECK(ht::try_mutable_view(v)->data() == v.data());

    const std::vector<float>& cv = v;
    CHECK(ht::try_view(cv)->data() == v.data());
}

TEST_CASE("std::span<float> writes through to the memory it spans", "[tensor][raw]") {
    std::array<float, 8> storage{};
    const std::span<float> s = std::span<float>(storage).subspan(2, 4);
    CHECK(ht::size(s) == 4);

    ht::copy_from(s, std::vector<float>{1.5f, -2.0f, 3.25f, 4.0f});
    CHECK(storage == std::array<float, 8>{0, 0, 1.5f, -2.0f, 3.25f, 4.0f, 0, 0});

    std::vector<float> out(4);
    ht::copy_to(s, out);
    CHECK(out == std::vector<float>{1.5f, -2.0f, 3.25f, 4.0f});

    CHECK(ht::try_view(s)->data() == storage.data() + 2);
    CHECK(ht::try_mutable_view(s)->data() == storage.data() + 2);
    CHECK(ht::try_mutable_view(s)->size() == 4);
}

TEST_CASE("fixed-extent spans", "[tensor][raw]") {
    std::array<float, 3> storage{1, 2, 3};
    std::span<float, 3> s = storage;
    std::vector<float> out(3);
    ht::copy_to(s, out);
    CHECK(out == std::vector<float>{1, 2, 3});
    ht::copy_from(s, std::vector<float>{7, 8, 9});
    CHECK(storage == std::array<float, 3>{7, 8, 9});

    std::span<const float, 3> cs = storage;
    ht::copy_to(cs, out);
    CHECK(out == std::vector<float>{7, 8, 9});
    CHECK(ht::try_view(cs)->data() == storage.data());
}

TEST_CASE("std::span<const float> is readable", "[tensor][raw]") {
    const auto values = iota(5, 10.0f);
    const std::span<const float> s = values;
    CHECK(ht::size(s) == 5);
    std::vector<float> out(5);
    ht::copy_to(s, out);
    CHECK(out == values);
    CHECK(ht::try_view(s)->data() == values.data());

    ht::const_host_view view(s);
    CHECK(view.zero_copy());
    CHECK(view.data() == values.data());
}

TEST_CASE("raw size mismatches throw size_mismatch", "[tensor][raw]") {
    auto v = iota(4, 1.0f);
    const std::span<float> s = v;
    const std::span<const float> cs = v;
    std::vector<float> three(3), five(5);
    CHECK(thrown_code([&] { ht::copy_to(v, three); }) == errc::size_mismatch);
    CHECK(thrown_code([&] { ht::copy_to(v, five); }) == errc::size_mismatch);
    CHECK(thrown_code([&] { ht::copy_from(v, three); }) == errc::size_mismatch);
    CHECK(thrown_code([&] { ht::copy_from(v, five); }) == errc::size_mismatch);
    CHECK(thrown_code([&] { ht::copy_to(s, three); }) == errc::size_mismatch);
    CHECK(thrown_code([&] { ht::copy_from(s, five); }) == errc::size_mismatch);
    CHECK(thrown_code([&] { ht::copy_to(cs, five); }) == errc::size_mismatch);
    // copy_from never resizes a vector to fit.
    CHECK(v == std::vector<float>{1, 2, 3, 4});
    CHECK(three == std::vector<float>(3, 0.0f));
}

TEST_CASE("empty raw tensors and copies onto themselves", "[tensor][raw]") {
    std::vector<float> empty;
    std::span<float> none;
    CHECK(ht::size(empty) == 0);
    ht::copy_to(empty, none);
    ht::copy_from(empty, none);
    ht::copy_from(none, std::span<const float>{});
    CHECK(ht::try_view(none)->empty());

    // The same memory as source and destination is allowed and changes nothing.
    auto v = iota(4, 1.0f);
    ht::copy_to(v, std::span<float>(v));
    ht::copy_from(v, std::span<const float>(v));
    CHECK(v == std::vector<float>{1, 2, 3, 4});
}

TEST_CASE("host_view of a span is always zero-copy", "[tensor][raw][host_view]") {
    auto v = iota(3, 0.0f);
    std::span<float> s = v;
    ht::host_view view(s);
    CHECK(view.zero_copy());
    CHECK(view.data() == v.data());
    view[0] = 9.0f;
    CHECK(v[0] == 9.0f);
}
