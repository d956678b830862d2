// The simulated transport: the per-node face of a sim::network. It satisfies net::transport
// (net/transport.hpp), as net::tcp::transport does, so that components written as templates
// over a transport run on either.
#pragma once

#include <hivemesh/net/address.hpp>
#include <hivemesh/net/sim/network.hpp>
#include <hivemesh/net/sim/virtual_time.hpp>
#include <hivemesh/net/transport.hpp>

#include <asio.hpp>

#include <cerrno>
#include <cstdint>
#include <optional>
#include <system_error>
#include <utility>

namespace hivemesh::net::sim {

/// Listens, dials and opens datagram sockets as one node of a simulated network. Cheap to
/// copy; the network must outlive it.
class transport {
public:
    using executor_type = asio::any_io_executor;
    using stream_type = sim::stream;
    using listener_type = sim::listener;
    using datagram_socket_type = sim::datagram_socket;
    using timer_type = sim::timer;
    using clock_type = sim::clock;
    using endpoint_type = sim::endpoint;

    /// Throws std::out_of_range for an unknown node.
    transport(network& net, node_id node)
        : network_(&net)
        , node_(node) {
        net.core_->check_node(node);
    }

    executor_type executor() const noexcept { return network_->get_executor(); }

    /// The endpoint of a sim address; nullopt for other protocols.
    static std::optional<endpoint_type> to_endpoint(const peer_address& address) {
        const auto n = address.sim_node();
        if (!n) return std::nullopt;
        return endpoint_type{*n, address.port};
    }
    /// The sim address of `endpoint`, naming `peer` if given.
    static peer_address to_address(const endpoint_type& endpoint,
                                   std::optional<crypto::peer_id> peer = std::nullopt) {
        return peer_address::sim(endpoint.node, endpoint.port, peer);
    }
    /// The round-trip time of `stream`'s links (see stream::round_trip_time).
    static hivemesh::duration round_trip_time(const stream_type& stream) noexcept {
        return stream.round_trip_time();
    }
    node_id node() const noexcept { return node_; }
    network& net() const noexcept { return *network_; }
    clock_type clock() const noexcept { return clock_type(network_->time()); }
    hivemesh::duration connect_timeout() const noexcept {
        return network_->config().connect_timeout;
    }

    /// Listens on `port` of this node (0 picks a free port); see network::listen.
    /// Throws std::system_error.
    listener_type listen(std::uint16_t port) const { return network_->listen(node_, port); }
    /// As above, reporting failure in `ec` (the listener is then closed).
    listener_type listen(std::uint16_t port, std::error_code& ec) const {
        return network_->listen(node_, port, ec);
    }

    /// Listens on `local`, whose node must be this one (else address_not_available, as when
    /// binding a TCP socket to another host's address). Throws std::system_error.
    listener_type listen(const endpoint_type& local) const {
        std::error_code ec;
        auto l = listen(local, ec);
        if (ec) throw std::system_error(ec, "hivemesh::net::sim::transport::listen");
        return l;
    }
    listener_type listen(const endpoint_type& local, std::error_code& ec) const {
        if (local.node != node_) {
            ec = std::error_code(EADDRNOTAVAIL, asio::error::get_system_category());
            return listener_type(executor());
        }
        return network_->listen(node_, local.port, ec);
    }

    /// Opens a datagram socket bound to `local`, whose node must be this one (else
    /// address_not_available, as listen()); port 0 picks a free port. Datagram ports are
    /// apart from listening ports. Errors: address_in_use (another datagram socket holds the
    /// port), network_down (node crashed). Throws std::system_error.
    datagram_socket_type open_datagram(const endpoint_type& local) const {
        std::error_code ec;
        auto s = open_datagram(local, ec);
        if (ec) throw std::system_error(ec, "hivemesh::net::sim::transport::open_datagram");
        return s;
    }
    /// As above, reporting failure in `ec` (the socket is then closed).
    datagram_socket_type open_datagram(const endpoint_type& local, std::error_code& ec) const {
        if (local.node != node_) {
            ec = std::error_code(EADDRNOTAVAIL, asio::error::get_system_category());
            return datagram_socket_type(executor());
        }
        return network_->open_datagram(node_, local.port, ec);
    }
    /// Where a datagram socket that serves nothing binds to reach `remote`: this node, an
    /// ephemeral port (net::transport asks for it).
    endpoint_type datagram_endpoint_for(const endpoint_type& /*remote*/) const noexcept {
        return {node_, 0};
    }

    /// Connects to `remote`, giving up after `timeout`; see network::async_connect.
    /// Completion: void(std::error_code, stream_type). Cancellation: the handler's slot, any
    /// type (completes with operation_aborted).
    template <ASIO_COMPLETION_TOKEN_FOR(void(std::error_code, stream_type)) ConnectToken>
    auto async_connect(const endpoint_type& remote, hivemesh::duration timeout,
                       ConnectToken&& token) {
        return network_->async_connect(node_, remote, timeout, std::forward<ConnectToken>(token));
    }

    /// As above with connect_timeout().
    template <ASIO_COMPLETION_TOKEN_FOR(void(std::error_code, stream_type)) ConnectToken>
    auto async_connect(const endpoint_type& remote, ConnectToken&& token) {
        return network_->async_connect(node_, remote, std::forward<ConnectToken>(token));
    }

private:
    network* network_;
    node_id node_;
};

static_assert(net::transport<transport>);

} // namespace hivemesh::net::sim
