// The README's RPC snippet as a whole program, for bench/compile_time/measure.sh: one node
// serves "echo" on loopback and calls itself.
#include <hivemesh/hivemesh.hpp>

#include <chrono>
#include <iostream>

int main() {
    using namespace std::chrono_literals;
    asio::io_context io;
    hivemesh::net::tcp::transport tcp(io.get_executor());
    hivemesh::net::node node(tcp, hivemesh::crypto::identity::generate());
    auto listener = tcp.listen({asio::ip::address_v4::loopback(), 0});
    const auto endpoint = listener.local_endpoint();
    node.serve(std::move(listener));
    node.add_handler("echo",
                     [](const hivemesh::net::call_context&, hivemesh::byte_view request,
                        hivemesh::byte_buffer& response) -> asio::awaitable<std::error_code> {
                         response.assign(request.begin(), request.end());
                         co_return std::error_code{};
                     });
    const hivemesh::byte_buffer request = hivemesh::to_buffer(hivemesh::as_bytes("hello"));
    node.async_call({node.id(), endpoint}, "echo", request, 5s,
                    [&](std::error_code ec, hivemesh::byte_buffer response) {
                        std::cout << (ec ? ec.message()
                                         : "echo: " +
                                               std::string(hivemesh::as_string_view(response)))
                                  << '\n';
                        node.close();
                    });
    io.run();
}
