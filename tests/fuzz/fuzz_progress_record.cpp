// libFuzzer target: the progress record decoder and the run's schema check on arbitrary input.
// Every input decodes or is refused; whatever decodes re-encodes to exactly the input bytes,
// and the schema check agrees with the decoder.
#include <hivemesh/progress/record.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdlib>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using namespace hivemesh;
    const byte_view input(reinterpret_cast<const std::byte*>(data), size);
    progress::progress_record record;
    const std::error_code ec = progress::decode(input, record);
    if (!ec) {
        byte_buffer again;
        try {
            again = progress::encode(record);
        } catch (...) {
            std::abort(); // the encoder refused what the decoder accepted
        }
        if (again.size() != input.size() || !std::equal(again.begin(), again.end(), input.begin()))
            std::abort();
    }
    // The same bytes as a DHT value under the run's key and an owner marker: accepted exactly
    // when they decode, or are empty (a tombstone).
    static const auto validator = progress::make_progress_validator("fuzz");
    static const byte_buffer key = to_buffer(as_bytes(progress::progress_key("fuzz")));
    static const byte_buffer subkey =
        to_buffer(as_bytes("[owner:" + crypto::base58_encode(byte_buffer(32, std::byte{7})) + "]"));
    const dht::record r{key, subkey, to_buffer(input), time_point{}, {}};
    if (static_cast<bool>(validator->validate(r)) != (static_cast<bool>(ec) && size != 0))
        std::abort();
    // And as a subkey, which must be one owner marker to be admitted.
    const dht::record as_subkey{key, to_buffer(input), {}, time_point{}, {}};
    if (!validator->validate(as_subkey) != progress::is_owner_marker(input)) std::abort();
    return 0;
}
