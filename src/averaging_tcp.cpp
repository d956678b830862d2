// hivemesh::compiled: the averaging services over TCP, compiled once.
#include <hivemesh/averaging/averager.hpp>

namespace hivemesh::averaging {
template class allreduce_service<net::tcp::transport>;
template class matchmaker<net::tcp::transport>;
template class state_server<net::tcp::transport>;
template class averager<net::tcp::transport>;
} // namespace hivemesh::averaging
