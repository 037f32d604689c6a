// The multi-process part of a checkpoint (format: checkpoint.h). Every rank calls it at the same step: ranks >= 1
// stage their state (parameters, optimizer state + RNG, for a pipeline stage under DiLoCo its stage's outer state,
// under local parallelism its auxiliary heads) in staging_dir(), every rank's loader position and file stamps (size,
// xxh64) are all-gathered, and rank 0 gets `contents` completed with them and the world size, ready for
// save_checkpoint().
#pragma once

#include <functional>

#include "tributary/data/loader.h"
#include "tributary/runtime/checkpoint.h"
#include "tributary/runtime/replicas.h"

namespace tributary {

// The files holding rank `rank`'s parameters, optimizer state and (pipeline stages under DiLoCo) outer state; rank
// 0's parameters and optimizer state are model/optim, its outer state is rank-0.outer.safetensors.
std::string replica_model_file(int rank);
std::string replica_optim_file(int rank);
std::string replica_outer_file(int rank);
// Local parallelism: rank R >= 1's copy of the auxiliary heads (its pipeline's, consolidated; rank 0's is
// aux_heads.safetensors). Replicas of a stage may differ between DiLoCo's outer steps, so each rank keeps its own.
std::string replica_aux_file(int rank);
// Rank R's codec state (error feedback of top-k, SparseLoCo, PowerSGD), rank 0's too: it differs between ranks.
std::string replica_codec_file(int rank);

// Every rank of the run, for the protocol: a barrier and an all-gather over all of them (in the order the rank runs
// its other collectives).
struct CheckpointPeers {
  int rank = 0, size = 1;
  std::function<void()> barrier;
  std::function<std::vector<torch::Tensor>(const torch::Tensor&)> all_gather;
};

// Every rank of the run sees train.run_dir as rank 0 does: the multi-process checkpoint stages each rank's files in
// rank 0's directory, so a rank on another machine without a shared filesystem would lose the run at its first
// checkpoint. Rank 0 writes a token there, every rank reads it back at the same path; an Error on every rank, naming
// the ranks that do not see it, at start-up instead. Collective over `peers`.
void require_shared_run_dir(const CheckpointPeers& peers, const fs::path& run_dir);

// The peers of the replicas of the whole model.
CheckpointPeers checkpoint_peers(Replicas& replicas);

struct RankState {
  const NamedTensors& params;
  const NamedTensors& optim_state;
  LoaderPosition position;
  const NamedTensors* outer = nullptr;  // this rank's own outer state (a pipeline stage's DiLoCo); null: none
  const NamedTensors* aux = nullptr;    // this rank's auxiliary heads (local parallelism); null: none
  const NamedTensors* codec = nullptr;  // this rank's codec state (error feedback); null or empty: none
};

// Returns true on rank 0 (which then calls save_checkpoint with `contents`), false on the other ranks.
bool stage_rank_state(const CheckpointPeers& peers, const fs::path& run_dir, int64_t step, const RankState& mine,
                      CheckpointContents& contents);

// The replicas of the whole model: stage_rank_state over them, plus DiLoCo's outer state (identical on every rank,
// outer.safetensors) and the units' progress.
bool stage_replica_state(Replicas& replicas, const fs::path& run_dir, int64_t step, const NamedTensors& params,
                         const NamedTensors& optim_state, LoaderPosition position, CheckpointContents& contents);

}  // namespace tributary
