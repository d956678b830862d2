#include <hivemesh/net/sim.hpp>
#include <hivemesh/net/tcp.hpp>
#include <hivemesh/net/transport.hpp>

#include <asio/io_context.hpp>

#include <catch2/catch.hpp>

namespace net = hivemesh::net;

namespace {

// The TCP transport with one requirement taken away each.
struct no_connect : net::tcp::transport {
    using net::tcp::transport::transport;
    void async_connect() = delete;
};
struct no_timer {
    using executor_type = asio::any_io_executor;
    using stream_type = net::tcp::transport::stream_type;
    using listener_type = net::tcp::transport::listener_type;
    using clock_type = hivemesh::wall_clock;
    using endpoint_type = net::tcp::transport::endpoint_type;
};

} // namespace

TEST_CASE("tcp and sim are transports, and types missing a requirement are not",
          "[net][transport]") {
    STATIC_REQUIRE(net::transport<net::tcp::transport>);
    STATIC_REQUIRE(net::transport<net::sim::transport>);
    STATIC_REQUIRE_FALSE(net::transport<int>);
    STATIC_REQUIRE_FALSE(net::transport<no_connect>);
    STATIC_REQUIRE_FALSE(net::transport<no_timer>);
}

TEST_CASE("transport_now reads each transport's clock", "[net][transport]") {
    asio::io_context io;
    net::sim::network network(io, 1);
    network.time().run_for(std::chrono::seconds(5));
    const auto virtual_now = net::transport_now<net::sim::transport>(network.get_executor());
    CHECK(virtual_now == network.time().now());
    const auto before = hivemesh::wall_clock().now();
    const auto wall_now = net::transport_now<net::tcp::transport>(io.get_executor());
    CHECK(wall_now >= before);
    CHECK(wall_now <= hivemesh::wall_clock().now());
}
