// The whole public face of hivemesh. Optional parts are included explicitly: the tensor
// backends <hivemesh/tensor/eigen.hpp>, <hivemesh/tensor/torch.hpp>, the libtorch optimizer
// wrapper <hivemesh/optim/torch.hpp>, and the simulated network <hivemesh/net/sim.hpp>.
#pragma once

#include "hivemesh/averaging.hpp"
#include "hivemesh/compression.hpp"
#include "hivemesh/core.hpp"
#include "hivemesh/crypto.hpp"
#include "hivemesh/dht.hpp"
#include "hivemesh/net.hpp"
#include "hivemesh/optim.hpp"
#include "hivemesh/peer.hpp"
#include "hivemesh/progress.hpp"
#include "hivemesh/tensor.hpp"
