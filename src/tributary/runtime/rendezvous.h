// The rendezvous of a multi-process run: connect to the run's store (rank 0 hosts it unless an agent does) and
// refuse ranks whose resolved configs differ, naming the ranks and keys.
#pragma once

#include "tributary/comm/store.h"
#include "tributary/runtime/dist_env.h"
#include "tributary/runtime/run_config.h"

namespace tributary {

comm::Store rendezvous(const RunConfig& config, const DistEnv& env);

}  // namespace tributary
