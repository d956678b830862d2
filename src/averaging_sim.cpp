// hivemesh::compiled: the averaging services over the simulated network, compiled once.
#include <hivemesh/averaging/averager.hpp>
#include <hivemesh/averaging/impl/allreduce_round.hpp>
#include <hivemesh/net/sim.hpp>

namespace hivemesh::averaging {
template class allreduce_service<net::sim::transport>;
template class matchmaker<net::sim::transport>;
template class state_server<net::sim::transport>;
template class averager<net::sim::transport>;

template asio::awaitable<std::pair<std::error_code, std::vector<donor_info>>>
detail::list_donors(dht::node<net::sim::transport>&, std::string);
template asio::awaitable<std::pair<std::error_code, downloaded_state>>
detail::load_state(net::node<net::sim::transport>&, dht::node<net::sim::transport>&, std::string,
                   load_options);
} // namespace hivemesh::averaging
