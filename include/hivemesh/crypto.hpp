// The crypto layer: PeerIds, Ed25519 identities and signatures, and the secure session
// protocol (handshake and record layer, without I/O).
#pragma once

#include "hivemesh/crypto/identity.hpp"
#include "hivemesh/crypto/peer_id.hpp"
#include "hivemesh/crypto/secure_channel.hpp"
