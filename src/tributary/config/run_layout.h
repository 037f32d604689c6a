// The run's layout (parallel/layout.h) from its config and this process's place: the keys that imply it, and the
// placement file parallel.placement names (read here, so that a bad file fails before any group forms).
#pragma once

#include "tributary/config/run_config.h"
#include "tributary/launch/dist_env.h"
#include "tributary/parallel/layout.h"

namespace tributary {

Layout run_layout(const RunConfig& config, const DistEnv& env);

}  // namespace tributary
