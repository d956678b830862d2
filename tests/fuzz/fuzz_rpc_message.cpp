// libFuzzer target: the RPC call header, reply and datagram message decoders on arbitrary
// messages. Every input decodes or is refused; what decodes re-encodes to the same meaning.
#include <hivemesh/net/rpc_wire.hpp>

#include <cstdint>
#include <cstdlib>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using namespace hivemesh;
    const byte_view input(reinterpret_cast<const std::byte*>(data), size);

    net::call_header header;
    if (!net::decode_call_header(input, header)) {
        const auto again =
            net::encode_call_header(header.kind, header.method, header.timeout_ms, header.body);
        if (again.size() != input.size() || !std::equal(again.begin(), again.end(), input.begin()))
            std::abort();
    }

    net::reply_message reply;
    if (!net::decode_reply(input, reply)) {
        const auto again = reply.tag == net::reply_tag::status
                               ? net::encode_status(reply.status, reply.detail)
                               : net::encode_reply(reply.tag, reply.body);
        net::reply_message decoded;
        if (net::decode_reply(again, decoded) || decoded.tag != reply.tag ||
            decoded.status != reply.status || decoded.detail != reply.detail ||
            decoded.body.size() != reply.body.size())
            std::abort();
    }

    net::datagram_message datagram;
    if (!net::decode_datagram_message(input, datagram)) {
        byte_buffer again;
        net::append_datagram_header(datagram.kind, datagram.call, again);
        again.insert(again.end(), datagram.message.begin(), datagram.message.end());
        if (again.size() != input.size() || !std::equal(again.begin(), again.end(), input.begin()))
            std::abort();
    }
    return 0;
}
