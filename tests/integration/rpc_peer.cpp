// One RPC peer as an OS process, for the multi-process test (two_processes.sh):
//   rpc_peer serve <identity file> <port> <address file>   serve until SIGTERM or SIGINT
//   rpc_peer call <address> <calls>                           call and verify, print "ok <pid>"
#include "support/echo.hpp"

#include <hivemesh/core/random.hpp>
#include <hivemesh/crypto.hpp>
#include <hivemesh/net/address.hpp>
#include <hivemesh/net/node.hpp>
#include <hivemesh/net/tcp.hpp>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/signal_set.hpp>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>

using namespace hivemesh;
using namespace std::chrono_literals;

namespace {

int serve(const char* identity_file, const char* port_text, const char* address_file) {
    asio::io_context io;
    net::tcp::transport transport(io.get_executor());
    net::node<net::tcp::transport> node(transport, crypto::identity::load_or_create(identity_file));
    auto listener = transport.listen(asio::ip::tcp::endpoint(
        asio::ip::address_v4::loopback(), static_cast<std::uint16_t>(std::stoi(port_text))));
    const auto address = net::tcp::to_address(listener.local_endpoint(), node.id());
    node.serve(std::move(listener));
    test::add_echo_handler(node);
    node.add_handler("pid",
                     [](const net::call_context&, byte_view,
                        byte_buffer& response) -> asio::awaitable<std::error_code> {
                         response = to_buffer(as_bytes(std::to_string(::getpid())));
                         co_return std::error_code{};
                     });
    asio::signal_set signals(io, SIGINT, SIGTERM);
    signals.async_wait([&](std::error_code, int) {
        node.close();
        io.stop();
    });
    { // written whole, then renamed: the test never reads half an address
        const std::string partial = std::string(address_file) + ".partial";
        std::ofstream(partial) << address.to_string() << '\n';
        std::rename(partial.c_str(), address_file);
    }
    io.run();
    return 0;
}

int call(const char* address_text, const char* count_text) {
    const auto address = net::peer_address::from_string(address_text);
    const auto endpoint = net::tcp::to_endpoint(address);
    if (!endpoint || !address.peer) {
        std::cerr << "not a dialable address: " << address_text << '\n';
        return 2;
    }
    asio::io_context io;
    net::tcp::transport transport(io.get_executor());
    net::node<net::tcp::transport> node(transport, crypto::identity::generate());
    const net::node<net::tcp::transport>::peer target{*address.peer, *endpoint};
    const int calls = std::stoi(count_text);
    int exit_code = 1;
    asio::co_spawn(
        io,
        [&]() -> asio::awaitable<void> {
            random_generator rng(static_cast<std::uint64_t>(::getpid()));
            for (int i = 0; i < calls; ++i) {
                byte_buffer request(rng.uniform(1 << 20));
                for (auto& b : request)
                    b = static_cast<std::byte>(rng() & 0xFF);
                auto [ec, response] =
                    co_await node.async_call(target, "echo", request, 30s,
                                             asio::experimental::as_tuple(asio::use_awaitable));
                if (ec || response != request) {
                    std::cerr << "echo " << i << " failed: " << ec.message() << '\n';
                    co_return;
                }
            }
            auto [ec, pid] = co_await node.async_call(
                target, "pid", {}, 30s, asio::experimental::as_tuple(asio::use_awaitable));
            if (ec) {
                std::cerr << "pid failed: " << ec.message() << '\n';
                co_return;
            }
            std::cout << "ok " << as_string_view(pid) << std::endl;
            exit_code = 0;
            node.close();
        },
        asio::detached);
    io.run();
    return exit_code;
}

} // namespace

int main(int argc, char** argv) {
    try {
        const std::string mode = argc > 1 ? argv[1] : "";
        if (mode == "serve" && argc == 5) return serve(argv[2], argv[3], argv[4]);
        if (mode == "call" && argc == 4) return call(argv[2], argv[3]);
        std::cerr << "usage: rpc_peer serve <identity file> <port> <address file>\n"
                     "       rpc_peer call <address> <calls>\n";
        return 2;
    } catch (const std::exception& e) {
        std::cerr << "rpc_peer: " << e.what() << '\n';
        return 1;
    }
}
