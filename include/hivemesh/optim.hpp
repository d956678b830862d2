// The optim layer: local optimizers over the tensor adaptor (SGD, Adam, AdamW, LAMB) and the
// collaborative optimizer. The libtorch wrapper is included explicitly:
// <hivemesh/optim/torch.hpp>.
#pragma once

#include "hivemesh/optim/adam.hpp"
#include "hivemesh/optim/collaborative.hpp"
#include "hivemesh/optim/lamb.hpp"
#include "hivemesh/optim/local_optimizer.hpp"
#include "hivemesh/optim/sgd.hpp"
