// The DHT layer: Kademlia node, routing table, storage, validators, wire messages.
#pragma once

#include "hivemesh/dht/id.hpp"
#include "hivemesh/dht/messages.hpp"
#include "hivemesh/dht/node.hpp"
#include "hivemesh/dht/rate_limiter.hpp"
#include "hivemesh/dht/record.hpp"
#include "hivemesh/dht/routing_table.hpp"
#include "hivemesh/dht/storage.hpp"
#include "hivemesh/dht/typed.hpp"
#include "hivemesh/dht/validator.hpp"
