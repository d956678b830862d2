// The core layer: buffers, the bounded reader/writer, errors, clocks, files, logging, random.
#pragma once

#include "hivemesh/core/async.hpp"
#include "hivemesh/core/binary.hpp"
#include "hivemesh/core/bytes.hpp"
#include "hivemesh/core/clock.hpp"
#include "hivemesh/core/config.hpp"
#include "hivemesh/core/error.hpp"
#include "hivemesh/core/file.hpp"
#include "hivemesh/core/log.hpp"
#include "hivemesh/core/random.hpp"
