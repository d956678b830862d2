// The progress layer: each peer's signed progress record in the DHT, the estimate of the
// swarm's epoch, samples and ETA from them, and the tracker that keeps both up to date.
#pragma once

#include "hivemesh/progress/estimate.hpp"
#include "hivemesh/progress/record.hpp"
#include "hivemesh/progress/tracker.hpp"
