// The crypto layer: PeerIds, Ed25519 identities and signatures, the secure session protocol
// (handshake and record layer, without I/O) and sealed datagrams.
#pragma once

#include "hivemesh/crypto/datagram.hpp"
#include "hivemesh/crypto/identity.hpp"
#include "hivemesh/crypto/peer_id.hpp"
#include "hivemesh/crypto/secure_channel.hpp"
