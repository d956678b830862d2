// hivemesh::compiled: the progress tracker over TCP and over the simulated network, compiled
// once.
#include <hivemesh/net/sim.hpp>
#include <hivemesh/progress/impl/tracker_estimating.hpp>
#include <hivemesh/progress/impl/tracker_reporting.hpp>
#include <hivemesh/progress/tracker.hpp>

template class hivemesh::progress::tracker<hivemesh::net::tcp::transport>;
template class hivemesh::progress::tracker<hivemesh::net::sim::transport>;
