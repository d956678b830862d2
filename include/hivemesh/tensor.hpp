// The tensor layer: the adaptor concept and the raw-buffer backend. The Eigen and libtorch
// backends are included explicitly: <hivemesh/tensor/eigen.hpp>, <hivemesh/tensor/torch.hpp>.
#pragma once

#include "hivemesh/tensor/raw.hpp"
#include "hivemesh/tensor/tensor.hpp"
