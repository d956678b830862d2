// The "echo" RPC method of the tests: it answers every request with the request itself.
#pragma once

#include <hivemesh/core/bytes.hpp>
#include <hivemesh/net/node.hpp>

#include <asio/awaitable.hpp>

#include <system_error>

namespace hivemesh::test {

/// Adds the method "echo" to `node` (a net::node over any transport).
template <class Node>
void add_echo_handler(Node& node) {
    node.add_handler("echo",
                     [](const net::call_context&, byte_view request,
                        byte_buffer& response) -> asio::awaitable<std::error_code> {
                         response.assign(request.begin(), request.end());
                         co_return std::error_code{};
                     });
}

} // namespace hivemesh::test
