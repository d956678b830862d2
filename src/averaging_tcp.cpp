// hivemesh::compiled: the averaging services over TCP, compiled once.
#include <hivemesh/averaging/averager.hpp>
#include <hivemesh/averaging/impl/allreduce_round.hpp>

namespace hivemesh::averaging {
template class allreduce_service<net::tcp::transport>;
template class matchmaker<net::tcp::transport>;
template class state_server<net::tcp::transport>;
template class averager<net::tcp::transport>;

template asio::awaitable<std::pair<std::error_code, std::vector<donor_info>>>
detail::list_donors(dht::node<net::tcp::transport>&, std::string);
template asio::awaitable<std::pair<std::error_code, downloaded_state>>
detail::load_state(net::node<net::tcp::transport>&, dht::node<net::tcp::transport>&, std::string,
                   load_options);
} // namespace hivemesh::averaging
