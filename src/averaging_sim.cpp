// hivemesh::compiled: the averaging services over the simulated network, compiled once.
#include <hivemesh/averaging/averager.hpp>

namespace hivemesh::averaging {
template class allreduce_service<net::sim::transport>;
template class matchmaker<net::sim::transport>;
template class state_server<net::sim::transport>;
template class averager<net::sim::transport>;
} // namespace hivemesh::averaging
