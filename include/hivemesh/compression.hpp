// The compression layer: tensor codecs, adaptive codec choice, zstd for byte payloads.
#pragma once

#include "hivemesh/compression/adaptive.hpp"
#include "hivemesh/compression/compress.hpp"
#include "hivemesh/compression/kind.hpp"
#include "hivemesh/compression/throughput.hpp"
#include "hivemesh/compression/zstd.hpp"
