// A consumer of an installed hivemesh: built by tests/consumer/find_package/CMakeLists.txt
// (find_package(hivemesh CONFIG)) and, with the flags of `pkg-config --cflags --libs
// hivemesh`, by the pkg-config test. Prints "hivemesh consumer: ok" and returns 0 when every
// check passes.
#include <hivemesh/hivemesh.hpp>

#include "../consumer_checks.hpp"

#if defined(HIVEMESH_CONSUMER_EIGEN)
#include <Eigen/Core>
#if __has_include(<hivemesh/tensor/eigen.hpp>)
#include <hivemesh/tensor/eigen.hpp>
#endif
#endif

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>

#include <chrono>
#include <cstdint>
#include <string>
#include <system_error>

using consumer::check;

namespace {

/// One unary call from a node to itself over loopback TCP: the installed headers, the
/// coroutine support the package turns on, and libsodium all working together.
bool rpc_to_self() {
    using namespace hivemesh;
    asio::io_context io;
    net::tcp::transport transport(io.get_executor());
    net::node<net::tcp::transport> node(transport, crypto::identity::generate());
    auto listener = transport.listen({asio::ip::address_v4::loopback(), 0});
    const net::node<net::tcp::transport>::peer self{node.id(), listener.local_endpoint()};
    node.serve(std::move(listener));
    node.add_handler("echo",
                     [](const net::call_context&, byte_view request,
                        byte_buffer& response) -> asio::awaitable<std::error_code> {
                         response.assign(request.begin(), request.end());
                         co_return std::error_code{};
                     });
    bool ok = false;
    node.async_call(self, "echo", to_buffer(as_bytes(std::string_view("ping"))),
                    std::chrono::seconds(10), [&](std::error_code ec, byte_buffer response) {
                        ok = !ec && as_string_view(response) == "ping";
                        node.close();
                        io.stop();
                    });
    io.run_for(std::chrono::seconds(20));
    return ok;
}

} // namespace

int main() {
    hivemesh::byte_buffer buf;
    hivemesh::binary_writer writer(buf);
    writer.write(std::uint32_t{0x01020304});
    writer.write_string("consumer");
    writer.write_f64(-0.5);
    check(buf.size() == 4 + 4 + 8 + 8, "encoded size");
    check(buf[0] == std::byte{0x04} && buf[3] == std::byte{0x01}, "little-endian layout");

    hivemesh::binary_reader reader(buf);
    check(reader.read<std::uint32_t>() == 0x01020304, "u32 round trip");
    check(reader.read_string(64) == "consumer", "string round trip");
    check(reader.read_f64() == -0.5, "f64 round trip");
    check(!reader.finish(), "whole message consumed");

    hivemesh::binary_reader truncated(hivemesh::byte_view(buf).first(10));
    check(truncated.read<std::uint32_t>() == 0x01020304, "prefix field");
    check(truncated.read_string(64).empty(), "truncated string is empty");
    const std::error_code ec = truncated.finish();
    check(ec == hivemesh::errc::truncated_input, "truncated_input reported");
    check(ec != hivemesh::errc::trailing_data, "errc comparison");
    check(std::string(ec.category().name()) == "hivemesh", "category name");

    consumer::check_dependencies();
    check(rpc_to_self(), "an RPC over loopback TCP through the installed headers");

#if defined(HIVEMESH_CONSUMER_EIGEN)
    // hivemesh::eigen brings Eigen's include directories.
    const Eigen::Vector3f v(1.0f, 2.0f, 3.0f);
    check(v.sum() == 6.0f, "Eigen through hivemesh::eigen");
#endif

    return consumer::finish();
}
