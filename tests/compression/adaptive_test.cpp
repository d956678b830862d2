#include <hivemesh/compression/adaptive.hpp>

#include <catch2/catch.hpp>

using namespace hivemesh::compression;

TEST_CASE("a fixed policy always gives its codec", "[adaptive]") {
    const policy p = kind::float16;
    CHECK(p.choose({.index = 3, .size = 10, .role = tensor_role::gradient}) == kind::float16);
    CHECK(policy{}.choose({}) == kind::none);
}

TEST_CASE("by_size switches at the threshold", "[adaptive]") {
    const auto p = policy::by_size(1024, kind::float16, kind::blockwise_8bit);
    CHECK(p.choose({.size = 0}) == kind::float16);
    CHECK(p.choose({.size = 1023}) == kind::float16);
    CHECK(p.choose({.size = 1024}) == kind::blockwise_8bit);
    CHECK(p.choose({.size = 1 << 30}) == kind::blockwise_8bit);
}

TEST_CASE("by_role picks per role and nests", "[adaptive]") {
    const auto p = policy::by_role(policy::by_size(100, kind::none, kind::uniform_8bit), // gradient
                                   kind::float16,                                     // parameter
                                   kind::meanstd_16bit,                               // optimizer state
                                   kind::quantile_8bit);                              // other
    CHECK(p.choose({.size = 10, .role = tensor_role::gradient}) == kind::none);
    CHECK(p.choose({.size = 1000, .role = tensor_role::gradient}) == kind::uniform_8bit);
    CHECK(p.choose({.size = 1000, .role = tensor_role::parameter}) == kind::float16);
    CHECK(p.choose({.size = 1000, .role = tensor_role::optimizer_state}) == kind::meanstd_16bit);
    CHECK(p.choose({.size = 1000, .role = tensor_role::other}) == kind::quantile_8bit);
}

TEST_CASE("per_tensor picks by index with a fallback", "[adaptive]") {
    const auto p = policy::per_tensor({kind::none, kind::float16, policy::by_size(5, kind::none, kind::blockwise_8bit)},
                                      kind::uniform_8bit);
    CHECK(p.choose({.index = 0, .size = 100}) == kind::none);
    CHECK(p.choose({.index = 1, .size = 100}) == kind::float16);
    CHECK(p.choose({.index = 2, .size = 4}) == kind::none);
    CHECK(p.choose({.index = 2, .size = 100}) == kind::blockwise_8bit);
    CHECK(p.choose({.index = 3, .size = 100}) == kind::uniform_8bit);
}

TEST_CASE("copies of a policy decide alike", "[adaptive]") {
    policy p = policy::by_size(10, kind::none, kind::float16);
    const policy copy = p;
    p = kind::quantile_8bit;
    CHECK(copy.choose({.size = 100}) == kind::float16);
    CHECK(p.choose({.size = 100}) == kind::quantile_8bit);
}
