// hivemesh::compiled: the collaborative optimizer over TCP and over the simulated network,
// compiled once.
#include <hivemesh/optim/collaborative.hpp>

template class hivemesh::optim::collaborative_optimizer<hivemesh::net::tcp::transport>;
template class hivemesh::optim::collaborative_optimizer<hivemesh::net::sim::transport>;
