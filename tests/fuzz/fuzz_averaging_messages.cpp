// libFuzzer target: the averaging decoders (matchmaking request, response, group, disband;
// all-reduce begin, part and result heads with their exclusions) on arbitrary input. Every
// input decodes or is refused; whatever decodes re-encodes to exactly the input bytes.
#include <hivemesh/averaging/allreduce_wire.hpp>
#include <hivemesh/averaging/matchmaking_wire.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdlib>

namespace {

using namespace hivemesh;

void require_same(byte_view a, byte_view b) {
    if (a.size() != b.size() || !std::equal(a.begin(), a.end(), b.begin())) std::abort();
}

template <class Message>
void check_canonical(byte_view input) {
    Message message;
    if (averaging::decode(input, message)) return;
    byte_buffer again;
    try {
        again = averaging::encode(message);
    } catch (...) {
        std::abort(); // the encoder refused what the decoder accepted
    }
    require_same(again, input);
}

void check_part(byte_view input, averaging::allreduce_message type, std::size_t group_size) {
    averaging::part_message m;
    if (averaging::decode_part(input, type, group_size, m)) return;
    byte_buffer again;
    if (type == averaging::allreduce_message::part)
        averaging::encode_part_head(again, m.part);
    else
        averaging::encode_result_head(again, m.part, m.contributors, m.excluded);
    again.insert(again.end(), m.payload.begin(), m.payload.end());
    require_same(again, input);
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const byte_view input(reinterpret_cast<const std::byte*>(data), size);
    check_canonical<averaging::join_request>(input);
    check_canonical<averaging::join_response>(input);
    check_canonical<averaging::group_message>(input);
    check_canonical<averaging::disband_message>(input);
    check_canonical<averaging::begin_message>(input);
    check_part(input, averaging::allreduce_message::part, 0);
    for (const std::size_t group_size : {1, 5, 8, 9, 300})
        check_part(input, averaging::allreduce_message::result, group_size);
    return 0;
}
