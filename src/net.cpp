// hivemesh::compiled: the RPC node over TCP and over the simulated network, compiled once.
#include <hivemesh/net/impl/node_calls.hpp>
#include <hivemesh/net/impl/node_connections.hpp>
#include <hivemesh/net/impl/node_datagrams.hpp>
#include <hivemesh/net/node.hpp>
#include <hivemesh/net/sim.hpp>

// The non-template functions of the TCP transport and the multiplexer (HIVEMESH_DECL): their
// one definition, which the headers leave out in the compiled mode.
#include <hivemesh/net/impl/mux.ipp>
#include <hivemesh/net/impl/tcp.ipp>

template class hivemesh::net::node<hivemesh::net::tcp::transport>;
template class hivemesh::net::node<hivemesh::net::sim::transport>;
