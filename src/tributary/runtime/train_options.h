// How one invocation of `train` runs: resume or start over, a planned stop, and this process's place in the world.
#pragma once

#include <cstdint>
#include <string>

#include "tributary/launch/dist_env.h"
#include "tributary/runtime/ft/faults.h"

namespace tributary {

struct TrainOptions {
  bool resume = false;          // continue from a checkpoint
  std::string resume_from;      // checkpoint or run directory; empty with resume: latest in train.run_dir
  int64_t stop_after_step = 0;  // > 0: checkpoint and stop after this step (a planned pre-emption)
  bool overwrite = false;       // start fresh even if train.run_dir already has checkpoints
  DistEnv dist;                 // rank and world of this process (one process by default)
  FaultPlan faults;             // faults to inject (tests, chaos runs); none by default
};

}  // namespace tributary
