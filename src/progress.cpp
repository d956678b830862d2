// hivemesh::compiled: the progress tracker over TCP and over the simulated network, compiled
// once.
#include <hivemesh/progress/tracker.hpp>

template class hivemesh::progress::tracker<hivemesh::net::tcp::transport>;
template class hivemesh::progress::tracker<hivemesh::net::sim::transport>;
