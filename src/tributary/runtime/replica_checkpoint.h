// The multi-process part of a checkpoint (format: checkpoint.h). Every rank calls it at the same step: ranks >= 1
// stage their replica (parameters, optimizer state + RNG) in staging_dir(), every rank's loader position and file
// stamps (size, xxh64) are all-gathered, and rank 0 gets `contents` completed with them, the world size and
// DiLoCo's outer state, ready for save_checkpoint().
#pragma once

#include "tributary/data/loader.h"
#include "tributary/runtime/checkpoint.h"
#include "tributary/runtime/replicas.h"

namespace tributary {

// The files holding replica `rank`'s parameters and optimizer state (rank >= 1; rank 0's are model/optim).
std::string replica_model_file(int rank);
std::string replica_optim_file(int rank);

// Returns true on rank 0 (which then calls save_checkpoint with `contents`), false on the other ranks.
bool stage_replica_state(Replicas& replicas, const fs::path& run_dir, int64_t step, const NamedTensors& params,
                         const NamedTensors& optim_state, LoaderPosition position, CheckpointContents& contents);

}  // namespace tributary
