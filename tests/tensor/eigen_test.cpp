// Eigen backend: plain objects of every shape and storage order, maps with and without strides,
// blocks, refs, double precision, host_view write-back and tensor_ref mixing backends.
#include "support/errors.hpp"

#include <hivemesh/tensor.hpp>
#include <hivemesh/tensor/eigen.hpp>

#include <catch2/catch.hpp>

#include <Eigen/Core>

#include <system_error>
#include <vector>

using hivemesh::errc;
namespace ht = hivemesh::tensor;

namespace {

using hivemesh::test::thrown_code;

/// Sets every coefficient to a value unique to its (row, column): 10 * row + column + 1.
template <class M>
void fill_by_position(M& m) {
    for (Eigen::Index i = 0; i < m.rows(); ++i)
        for (Eigen::Index j = 0; j < m.cols(); ++j)
            m(i, j) = static_cast<typename M::Scalar>(10 * i + j + 1);
}

/// The sequence copy_to must produce: coefficients in storage order (column after column for
/// column-major, row after row for row-major), computed from (row, column), not from memory.
template <class M>
std::vector<float> storage_order(const M& m, bool row_major) {
    std::vector<float> out;
    if (row_major) {
        for (Eigen::Index i = 0; i < m.rows(); ++i)
            for (Eigen::Index j = 0; j < m.cols(); ++j)
                out.push_back(static_cast<float>(m(i, j)));
    } else {
        for (Eigen::Index j = 0; j < m.cols(); ++j)
            for (Eigen::Index i = 0; i < m.rows(); ++i)
                out.push_back(static_cast<float>(m(i, j)));
    }
    return out;
}

std::vector<float> sequence(std::size_t n, float start) {
    std::vector<float> v(n);
    for (std::size_t i = 0; i < n; ++i)
        v[i] = start + static_cast<float>(i);
    return v;
}

/// Round trip for an object whose memory is contiguous float: views alias its data.
template <class M>
void check_contiguous_float(M& m, bool row_major) {
    fill_by_position(m);
    const auto n = static_cast<std::size_t>(m.size());
    REQUIRE(ht::size(m) == n);

    std::vector<float> out(n);
    ht::copy_to(m, out);
    CHECK(out == storage_order(m, row_major));

    const auto in = sequence(n, -4.0f);
    ht::copy_from(m, in);
    CHECK(storage_order(m, row_major) == in);

    REQUIRE(ht::try_view(m).has_value());
    CHECK(ht::try_view(m)->data() == m.data());
    CHECK(ht::try_view(m)->size() == n);
    REQUIRE(ht::try_mutable_view(m).has_value());
    CHECK(ht::try_mutable_view(m)->data() == m.data());
}

} // namespace

// Which Eigen objects are tensors.
static_assert(ht::writable_tensor<Eigen::MatrixXf>);
static_assert(ht::writable_tensor<Eigen::Matrix<float, 3, 4, Eigen::RowMajor>>);
static_assert(ht::writable_tensor<Eigen::ArrayXXf>);
static_assert(ht::writable_tensor<Eigen::Vector3f>);
static_assert(ht::writable_tensor<Eigen::MatrixXd>);
static_assert(ht::writable_tensor<Eigen::Map<Eigen::MatrixXf>>);
static_assert(ht::writable_tensor<Eigen::Map<Eigen::MatrixXf, 0, Eigen::OuterStride<>>>);
static_assert(ht::writable_tensor<Eigen::Ref<Eigen::MatrixXf>>);
static_assert(ht::readable_tensor<const Eigen::MatrixXf>);
static_assert(!ht::writable_tensor<const Eigen::MatrixXf>);
static_assert(ht::readable_tensor<Eigen::Map<const Eigen::MatrixXf>>);
static_assert(!ht::writable_tensor<Eigen::Map<const Eigen::MatrixXf>>);
static_assert(!ht::readable_tensor<Eigen::MatrixXi>);
static_assert(!ht::readable_tensor<Eigen::Matrix<std::complex<float>, 2, 2>>);
// Expressions without memory of their own are not tensors.
static_assert(!ht::readable_tensor<decltype(Eigen::MatrixXf() + Eigen::MatrixXf())>);

TEST_CASE("dynamic float matrices round-trip in storage order, zero-copy", "[tensor][eigen]") {
    Eigen::MatrixXf col(3, 4);
    check_contiguous_float(col, false);
    Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> row(3, 4);
    check_contiguous_float(row, true);

    // The two storage orders really give different sequences.
    fill_by_position(col);
    fill_by_position(row);
    std::vector<float> a(12), b(12);
    ht::copy_to(col, a);
    ht::copy_to(row, b);
    CHECK(a != b);
    CHECK(a[1] == 11.0f); // (1, 0)
    CHECK(b[1] == 2.0f);  // (0, 1)
}

TEST_CASE("fixed-size matrices, vectors and arrays", "[tensor][eigen]") {
    Eigen::Matrix<float, 3, 4> fixed_col;
    check_contiguous_float(fixed_col, false);
    Eigen::Matrix<float, 3, 4, Eigen::RowMajor> fixed_row;
    check_contiguous_float(fixed_row, true);
    Eigen::Vector4f v4;
    check_contiguous_float(v4, false);
    Eigen::RowVector3f rv3;
    check_contiguous_float(rv3, true);
    Eigen::VectorXf vx(7);
    check_contiguous_float(vx, false);
    Eigen::ArrayXXf array(2, 5);
    check_contiguous_float(array, false);
    Eigen::Array<float, 3, 3, Eigen::RowMajor> array_row;
    check_contiguous_float(array_row, true);
    Eigen::MatrixXf empty(0, 3);
    check_contiguous_float(empty, false);
}

TEST_CASE("contiguous maps view the mapped buffer", "[tensor][eigen]") {
    std::vector<float> buffer(12);
    Eigen::Map<Eigen::MatrixXf> map(buffer.data(), 3, 4);
    check_contiguous_float(map, false);
    CHECK(ht::try_view(map)->data() == buffer.data());
    CHECK(buffer == sequence(12, -4.0f)); // copy_from wrote into the buffer itself

    Eigen::Map<Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>> row_map(
        buffer.data(), 4, 3);
    check_contiguous_float(row_map, true);

    // An outer stride equal to the inner size is still contiguous.
    Eigen::Map<Eigen::MatrixXf, 0, Eigen::OuterStride<>> exact(buffer.data(), 3, 4,
                                                               Eigen::OuterStride<>(3));
    CHECK(ht::try_view(exact)->data() == buffer.data());

    const Eigen::Map<const Eigen::MatrixXf> read_only(buffer.data(), 4, 3);
    REQUIRE(ht::try_view(read_only).has_value());
    CHECK(ht::try_view(read_only)->data() == buffer.data());
    std::vector<float> out(12);
    ht::copy_to(read_only, out);
    CHECK(out == buffer);
}

TEST_CASE("a map with an outer stride is copied and leaves the padding alone", "[tensor][eigen]") {
    // 3 x 2 column-major with one padding float after each column.
    std::vector<float> buffer{1, 2, 3, -1, 4, 5, 6, -1};
    Eigen::Map<Eigen::MatrixXf, 0, Eigen::OuterStride<>> map(buffer.data(), 3, 2,
                                                             Eigen::OuterStride<>(4));
    CHECK(ht::size(map) == 6);
    CHECK_FALSE(ht::try_view(map).has_value());
    CHECK_FALSE(ht::try_mutable_view(map).has_value());

    std::vector<float> out(6);
    ht::copy_to(map, out);
    CHECK(out == std::vector<float>{1, 2, 3, 4, 5, 6});

    ht::copy_from(map, sequence(6, 10.0f));
    CHECK(buffer == std::vector<float>{10, 11, 12, -1, 13, 14, 15, -1});
}

TEST_CASE("maps with inner strides and dynamic strides", "[tensor][eigen]") {
    // Every second float of the buffer.
    std::vector<float> buffer{1, -1, 2, -1, 3, -1, 4, -1};
    Eigen::Map<Eigen::VectorXf, 0, Eigen::InnerStride<2>> every_other(buffer.data(), 4);
    CHECK_FALSE(ht::try_view(every_other).has_value());
    std::vector<float> out(4);
    ht::copy_to(every_other, out);
    CHECK(out == std::vector<float>{1, 2, 3, 4});
    ht::copy_from(every_other, std::vector<float>{5, 6, 7, 8});
    CHECK(buffer == std::vector<float>{5, -1, 6, -1, 7, -1, 8, -1});

    // A row-major 2 x 3 view of a 2 x 8 buffer: outer stride 8, inner stride 2.
    std::vector<float> grid(16, -1.0f);
    using strided = Eigen::Map<Eigen::Matrix<float, 2, 3, Eigen::RowMajor>, 0,
                               Eigen::Stride<Eigen::Dynamic, Eigen::Dynamic>>;
    strided m(grid.data(), Eigen::Stride<Eigen::Dynamic, Eigen::Dynamic>(8, 2));
    CHECK_FALSE(ht::try_view(m).has_value());
    ht::copy_from(m, sequence(6, 1.0f));
    CHECK(m(0, 0) == 1.0f);
    CHECK(m(0, 2) == 3.0f);
    CHECK(m(1, 0) == 4.0f);
    CHECK(m(1, 2) == 6.0f);
    CHECK(grid[0] == 1.0f);
    CHECK(grid[2] == 2.0f);
    CHECK(grid[4] == 3.0f);
    CHECK(grid[8] == 4.0f);
    CHECK(grid[12] == 6.0f);
    int untouched = 0;
    for (float x : grid)
        untouched += x == -1.0f;
    CHECK(untouched == 10);
    std::vector<float> back(6);
    ht::copy_to(m, back);
    CHECK(back == sequence(6, 1.0f));
}

TEST_CASE("blocks and refs of a larger matrix", "[tensor][eigen]") {
    Eigen::MatrixXf m = Eigen::MatrixXf::Zero(4, 4);
    auto block = m.block(1, 1, 2, 3); // 2 x 3 inside a 4 x 4: not contiguous
    CHECK(ht::size(block) == 6);
    CHECK_FALSE(ht::try_view(block).has_value());
    ht::copy_from(block, sequence(6, 1.0f));
    CHECK(m(1, 1) == 1.0f);
    CHECK(m(2, 1) == 2.0f);
    CHECK(m(1, 2) == 3.0f);
    CHECK(m(2, 3) == 6.0f);
    CHECK(m.sum() == 21.0f);

    auto column = m.col(2); // one column of a column-major matrix is contiguous
    REQUIRE(ht::try_view(column).has_value());
    CHECK(ht::try_view(column)->data() == m.data() + 8);

    Eigen::Ref<Eigen::MatrixXf> ref = m;
    CHECK(ht::try_view(ref)->data() == m.data());
    Eigen::Ref<Eigen::MatrixXf, 0, Eigen::OuterStride<>> block_ref = m.block(0, 0, 2, 2);
    CHECK_FALSE(ht::try_view(block_ref).has_value());
    ht::copy_from(block_ref, std::vector<float>{9, 9, 9, 9});
    CHECK(m(0, 0) == 9.0f);
    CHECK(m(1, 1) == 9.0f);
    CHECK(m(1, 2) == 3.0f); // outside the ref: untouched
    CHECK(m(2, 2) == 4.0f);
    CHECK(m.sum() == 36.0f + 2.0f + 3.0f + 4.0f + 5.0f + 6.0f);
}

TEST_CASE("double matrices convert through the copy path", "[tensor][eigen]") {
    Eigen::MatrixXd m(2, 3);
    fill_by_position(m);
    CHECK_FALSE(ht::try_view(m).has_value());
    CHECK_FALSE(ht::try_mutable_view(m).has_value());

    std::vector<float> out(6);
    ht::copy_to(m, out);
    CHECK(out == storage_order(m, false));

    ht::copy_from(m, std::vector<float>{0.5f, -1.25f, 3, 4, 5, 6});
    CHECK(m(0, 0) == 0.5);
    CHECK(m(1, 0) == -1.25);
    CHECK(m(1, 2) == 6.0);

    // Values that float32 cannot hold are rounded to nearest on the way out.
    m(0, 0) = 0.1;
    ht::copy_to(m, out);
    CHECK(out[0] == 0.1f);

    Eigen::Matrix<double, 2, 2, Eigen::RowMajor> fixed;
    fill_by_position(fixed);
    std::vector<float> four(4);
    ht::copy_to(fixed, four);
    CHECK(four == std::vector<float>{1, 2, 11, 12});

    std::vector<double> padded{1, 2, -1, 3, 4, -1};
    Eigen::Map<Eigen::MatrixXd, 0, Eigen::OuterStride<>> map(padded.data(), 2, 2,
                                                             Eigen::OuterStride<>(3));
    ht::copy_from(map, std::vector<float>{5, 6, 7, 8});
    CHECK(padded == std::vector<double>{5, 6, -1, 7, 8, -1});
}

TEST_CASE("Eigen size mismatches throw size_mismatch", "[tensor][eigen]") {
    Eigen::MatrixXf m = Eigen::MatrixXf::Constant(2, 2, 3.0f);
    std::vector<float> padded{1, 2, -1, 3, 4, -1};
    Eigen::Map<Eigen::MatrixXf, 0, Eigen::OuterStride<>> strided(padded.data(), 2, 2,
                                                                 Eigen::OuterStride<>(3));
    Eigen::MatrixXd d(2, 2);
    std::vector<float> three(3), five(5);
    CHECK(thrown_code([&] { ht::copy_to(m, three); }) == errc::size_mismatch);
    CHECK(thrown_code([&] { ht::copy_from(m, five); }) == errc::size_mismatch);
    CHECK(thrown_code([&] { ht::copy_to(strided, five); }) == errc::size_mismatch);
    CHECK(thrown_code([&] { ht::copy_from(strided, three); }) == errc::size_mismatch);
    CHECK(thrown_code([&] { ht::copy_from(d, three); }) == errc::size_mismatch);
    CHECK((m.array() == 3.0f).all());
    CHECK(padded == std::vector<float>{1, 2, -1, 3, 4, -1});
}

TEST_CASE("host_view of a strided map writes back on commit", "[tensor][eigen][host_view]") {
    std::vector<float> buffer{1, 2, -1, 3, 4, -1};
    Eigen::Map<Eigen::MatrixXf, 0, Eigen::OuterStride<>> map(buffer.data(), 2, 2,
                                                             Eigen::OuterStride<>(3));
    ht::host_view view(map);
    CHECK_FALSE(view.zero_copy());
    CHECK(std::vector<float>(view.begin(), view.end()) == std::vector<float>{1, 2, 3, 4});
    for (auto& x : view)
        x = -x;
    CHECK(buffer[0] == 1.0f); // nothing written before commit
    view.commit();
    CHECK(buffer == std::vector<float>{-1, -2, -1, -3, -4, -1});

    Eigen::MatrixXf dense(2, 2);
    ht::host_view direct(dense);
    CHECK(direct.zero_copy());
    CHECK(direct.data() == dense.data());

    Eigen::MatrixXd doubles = Eigen::MatrixXd::Zero(2, 2);
    ht::host_view converted(doubles);
    CHECK_FALSE(converted.zero_copy());
    converted[3] = 2.5f;
    converted.commit();
    CHECK(doubles(1, 1) == 2.5);

    const Eigen::Map<const Eigen::MatrixXf, 0, Eigen::OuterStride<>> read_only(
        buffer.data(), 2, 2, Eigen::OuterStride<>(3));
    ht::const_host_view copied(read_only);
    CHECK_FALSE(copied.zero_copy());
    CHECK(std::vector<float>(copied.begin(), copied.end()) == std::vector<float>{-1, -2, -3, -4});
}

TEST_CASE("tensor_ref over Eigen and raw tensors", "[tensor][eigen][tensor_ref]") {
    Eigen::MatrixXf dense(2, 2);
    fill_by_position(dense); // storage order 1 11 2 12
    std::vector<float> padded{5, 6, -1, 7, 8, -1};
    Eigen::Map<Eigen::MatrixXf, 0, Eigen::OuterStride<>> strided(padded.data(), 2, 2,
                                                                 Eigen::OuterStride<>(3));
    Eigen::Vector3d doubles(0.5, 1.5, 2.5);
    std::vector<float> raw{100, 200};
    const std::vector<ht::tensor_ref> refs{dense, strided, doubles, raw};

    CHECK(ht::total_size(refs) == 13);
    REQUIRE(refs[0].try_view().has_value());
    CHECK(refs[0].try_view()->data() == dense.data());
    CHECK_FALSE(refs[1].try_view().has_value());
    CHECK_FALSE(refs[2].try_mutable_view().has_value());
    CHECK(refs[3].try_mutable_view()->data() == raw.data());

    std::vector<float> flat(13);
    ht::flatten_to(refs, flat);
    CHECK(flat == std::vector<float>{1, 11, 2, 12, 5, 6, 7, 8, 0.5f, 1.5f, 2.5f, 100, 200});

    ht::unflatten_from(refs, sequence(13, 0.0f));
    CHECK(dense(1, 0) == 1.0f);
    CHECK(dense(0, 1) == 2.0f);
    CHECK(padded == std::vector<float>{4, 5, -1, 6, 7, -1});
    CHECK(doubles == Eigen::Vector3d(8, 9, 10));
    CHECK(raw == std::vector<float>{11, 12});
}
