// hivemesh::compiled: the collaborative optimizer over TCP and over the simulated network,
// compiled once.
#include <hivemesh/net/sim.hpp>
#include <hivemesh/optim/collaborative.hpp>
#include <hivemesh/optim/impl/collaborative_checkpoint.hpp>
#include <hivemesh/optim/impl/collaborative_delayed.hpp>
#include <hivemesh/optim/impl/collaborative_rounds.hpp>
#include <hivemesh/optim/impl/collaborative_state.hpp>
#include <hivemesh/optim/impl/collaborative_step.hpp>

template class hivemesh::optim::collaborative_optimizer<hivemesh::net::tcp::transport>;
template class hivemesh::optim::collaborative_optimizer<hivemesh::net::sim::transport>;
