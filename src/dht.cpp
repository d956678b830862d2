// hivemesh::compiled: the DHT node over TCP and over the simulated network, compiled once.
#include <hivemesh/dht/node.hpp>

template class hivemesh::dht::node<hivemesh::net::tcp::transport>;
template class hivemesh::dht::node<hivemesh::net::sim::transport>;
