// The two worlds a networked test runs in: the simulated network (virtual time) and
// loopback TCP (real time), with the same shape so one test template serves both.
#pragma once

#include <hivemesh/core/clock.hpp>
#include <hivemesh/net/node.hpp>
#include <hivemesh/net/sim.hpp>
#include <hivemesh/net/tcp.hpp>

#include <asio/io_context.hpp>

#include <chrono>
#include <deque>

namespace hivemesh::test {

using namespace std::chrono_literals;

/// Simulated network: virtual time, so timeouts of seconds cost nothing.
struct sim_world {
    using transport_type = net::sim::transport;
    static constexpr const char* name = "sim";
    asio::io_context io;
    net::sim::network network;
    std::deque<transport_type> transports;

    explicit sim_world(const net::sim::network_config& config = {})
        : network(io, 42, config) {}

    transport_type& add_host() { return transports.emplace_back(network, network.add_node()); }
    net::sim::endpoint listen(net::node<transport_type>& node, transport_type& t) {
        return listen_at(node, t, {t.node(), 0});
    }
    net::sim::endpoint listen_at(net::node<transport_type>& node, transport_type& t,
                                 const net::sim::endpoint& at) {
        auto listener = t.listen(at);
        const auto endpoint = listener.local_endpoint();
        node.serve(std::move(listener));
        return endpoint;
    }
    template <class Predicate>
    bool run_until(Predicate done, duration max = 3600s) {
        return network.time().run_until(done, max);
    }
    void settle() { network.time().run_for(1s); }
    /// The time the nodes see: virtual.
    time_point now() const { return network.time().now(); }
};

/// Loopback TCP in real time.
struct tcp_world {
    using transport_type = net::tcp::transport;
    static constexpr const char* name = "tcp";
    asio::io_context io;
    std::deque<transport_type> transports;

    transport_type& add_host() { return transports.emplace_back(io.get_executor()); }
    asio::ip::tcp::endpoint listen(net::node<transport_type>& node, transport_type& t) {
        return listen_at(node, t, {asio::ip::address_v4::loopback(), 0});
    }
    asio::ip::tcp::endpoint listen_at(net::node<transport_type>& node, transport_type& t,
                                      const asio::ip::tcp::endpoint& at) {
        auto listener = t.listen(at);
        const auto endpoint = listener.local_endpoint();
        node.serve(std::move(listener));
        return endpoint;
    }
    template <class Predicate>
    bool run_until(Predicate done, duration = 0s) {
        // The bound keeps a broken test from hanging; it asserts nothing about speed.
        const auto give_up = std::chrono::steady_clock::now() + 120s;
        while (!done()) {
            io.run_one_for(100ms);
            if (io.stopped()) io.restart();
            if (std::chrono::steady_clock::now() > give_up) return false;
        }
        return true;
    }
    void settle() {
        for (int i = 0; i < 50; ++i) {
            io.run_for(2ms);
            if (io.stopped()) io.restart();
        }
    }
    /// The time the nodes see: the wall clock.
    time_point now() const { return transport_type::clock_type().now(); }
};

} // namespace hivemesh::test
