// hivemesh::compiled: the RPC node over TCP and over the simulated network, compiled once.
#include <hivemesh/net/node.hpp>

template class hivemesh::net::node<hivemesh::net::tcp::transport>;
template class hivemesh::net::node<hivemesh::net::sim::transport>;
