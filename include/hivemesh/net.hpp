// The net layer: peer addresses, the TCP transport, the secure stream, the stream
// multiplexer, the rate caps and the RPC node. The simulated transport is included explicitly:
// <hivemesh/net/sim.hpp>.
#pragma once

#include "hivemesh/net/address.hpp"
#include "hivemesh/net/frame.hpp"
#include "hivemesh/net/mux.hpp"
#include "hivemesh/net/node.hpp"
#include "hivemesh/net/rate_limit.hpp"
#include "hivemesh/net/rpc_wire.hpp"
#include "hivemesh/net/secure_stream.hpp"
#include "hivemesh/net/tcp.hpp"
#include "hivemesh/net/transport.hpp"
