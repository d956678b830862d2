// libFuzzer target: compression::decompress on arbitrary bytes. Any input must either
// decode or be refused with an error code; sanitizers catch everything else. The
// reducer's decoders must agree with it: decompress_add, decompress_finite_into and
// decompress_norm take exactly the buffers that decode to finite values, give the same
// values (and their norm), and leave their destination alone otherwise; none_values views
// exactly the buffers that decode as `none`.
#include <hivemesh/compression.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using namespace hivemesh::compression;
    const hivemesh::byte_view input(reinterpret_cast<const std::byte*>(data), size);
    const limits lim{.max_elements = 1 << 24};
    std::error_code ec;
    const auto values = decompress(input, ec, lim);
    header h;
    const bool has_header = !read_header(input, h, lim);
    if (!ec && (!has_header || h.count != values.size())) std::abort();
    // A destination as long as the header says, when that is believable (as decompress).
    if (!has_header || h.count > size) return 0;
    const auto raw = none_values(input, h.count, lim);
    if (raw.has_value() != (!ec && h.codec == kind::none)) std::abort();
    if (raw && none_payload_is_native && !values.empty() &&
        std::memcmp(raw->data(), values.data(), raw->size()) != 0)
        std::abort();
    const bool accept =
        !ec && std::all_of(values.begin(), values.end(), [](float v) { return std::isfinite(v); });
    std::vector<float> scratch;
    std::vector<float> sum(h.count, 2.0f);
    const auto added = decompress_add(input, sum, 0.5f, scratch, lim);
    std::vector<float> out(h.count, 3.0f);
    const auto decoded = decompress_finite_into(input, out, scratch, lim);
    double norm = -1;
    const auto screened = decompress_norm(input, h.count, norm, scratch, lim);
    if (static_cast<bool>(added) == accept || static_cast<bool>(decoded) == accept ||
        static_cast<bool>(screened) == accept)
        std::abort();
    double squares = 0;
    for (const float v : values)
        squares += static_cast<double>(v) * static_cast<double>(v);
    if (norm != (accept ? std::sqrt(squares) : -1.0)) std::abort();
    for (std::size_t i = 0; i < h.count; ++i) {
        if (sum[i] != (accept ? 2.0f + 0.5f * values[i] : 2.0f)) std::abort();
        if (out[i] != (accept ? values[i] : 3.0f)) std::abort();
    }
    return 0;
}
