// The deterministic simulated network transport: virtual time (sim/virtual_time.hpp), the
// network of nodes with its streams and listeners (sim/network.hpp), and the per-node
// transport facade (sim/transport.hpp).
#pragma once

#include <hivemesh/net/sim/network.hpp>
#include <hivemesh/net/sim/transport.hpp>
#include <hivemesh/net/sim/virtual_time.hpp>
