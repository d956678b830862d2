// The whole public face of hivemesh. Optional tensor backends are included explicitly:
// <hivemesh/tensor/eigen.hpp>, <hivemesh/tensor/torch.hpp>.
#pragma once

#include "hivemesh/compression.hpp"
#include "hivemesh/core.hpp"
#include "hivemesh/tensor.hpp"
