// hivemesh::compiled: the RPC node over TCP and over the simulated network, compiled once.
#include <hivemesh/net/impl/node_calls.hpp>
#include <hivemesh/net/impl/node_connections.hpp>
#include <hivemesh/net/node.hpp>
#include <hivemesh/net/sim.hpp>

template class hivemesh::net::node<hivemesh::net::tcp::transport>;
template class hivemesh::net::node<hivemesh::net::sim::transport>;
