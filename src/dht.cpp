// hivemesh::compiled: the DHT node over TCP and over the simulated network, compiled once.
#include <hivemesh/dht/impl/node_contacts.hpp>
#include <hivemesh/dht/impl/node_lookup.hpp>
#include <hivemesh/dht/impl/node_maintenance.hpp>
#include <hivemesh/dht/impl/node_operations.hpp>
#include <hivemesh/dht/impl/node_serving.hpp>
#include <hivemesh/dht/node.hpp>
#include <hivemesh/net/sim.hpp>

template class hivemesh::dht::node<hivemesh::net::tcp::transport>;
template class hivemesh::dht::node<hivemesh::net::sim::transport>;
