// The averaging layer: matchmaking, load balancing, Moshpit group keys, butterfly all-reduce,
// state sharing, and the averager that composes them.
#pragma once

#include "hivemesh/averaging/allreduce.hpp"
#include "hivemesh/averaging/allreduce_wire.hpp"
#include "hivemesh/averaging/averager.hpp"
#include "hivemesh/averaging/group.hpp"
#include "hivemesh/averaging/group_key.hpp"
#include "hivemesh/averaging/load_balancing.hpp"
#include "hivemesh/averaging/matchmaking.hpp"
#include "hivemesh/averaging/matchmaking_wire.hpp"
#include "hivemesh/averaging/state_loading.hpp"
#include "hivemesh/averaging/state_server.hpp"
#include "hivemesh/averaging/state_sharing.hpp"
#include "hivemesh/averaging/state_wire.hpp"
