// hivemesh::compiled: hivemesh::peer and the peer over TCP, compiled once.
#include <hivemesh/impl/peer.ipp>

template class hivemesh::basic_peer<hivemesh::net::tcp::transport>;
