// The multi-process part of a checkpoint (format: checkpoint.h). Every rank calls it at the same step. Rank 0 writes
// a token into its staging_dir(); a rank that reads it back shares rank 0's run directory and stages its state there
// (parameters, optimizer state + RNG, for a pipeline stage under DiLoCo its stage's outer state, under local
// parallelism its auxiliary heads). A rank that does not (another machine, no shared filesystem) keeps its own
// checkpoint in own_run_dir(): a whole checkpoint of its replica, resumable on that machine, and sends rank 0 its
// workers/rank{R}.jsonl so that the report sees every worker. Every rank's loader position and file stamps (size,
// xxh64) are all-gathered; the rank that publishes gets `contents` completed with them and the world size, ready for
// save_checkpoint() into publish_dir().
#pragma once

#include <functional>

#include "tributary/artifacts/checkpoint.h"
#include "tributary/comm/group.h"
#include "tributary/data/loader.h"

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
// The replicas' outer state every one of them holds alike (DiLoCo's global parameters and momentum, whole tensors).
inline constexpr const char* kOuterFile = "outer.safetensors";

// What resumed replicas start from: the checkpoint's outer state in `outer_file` (kOuterFile, or a pipeline stage's
// replica_outer_file), if it has one (none: data parallel, or DiLoCo still in its warm-up), and each sync unit's
// progress (state.json's "replicas").
struct ReplicaResume {
  std::optional<safetensors::File> outer;
  nlohmann::json progress = nlohmann::json::array();
};
ReplicaResume replica_resume(const LoadedCheckpoint& ckpt, const std::string& outer_file = kOuterFile);

// Every rank of the run, for the protocol: a barrier and an all-gather over all of them (in the order the rank runs
// its other collectives).
struct CheckpointPeers {
  int rank = 0, size = 1;
  std::function<void()> barrier;
  std::function<std::vector<torch::Tensor>(const torch::Tensor&)> all_gather;
};
// The peers of `world`, a group of every rank of the run (which outlives them).
CheckpointPeers group_peers(comm::Group& world);

// The ranks that do not see rank 0's `run_dir` (another machine, no shared filesystem), the same list on every rank.
// Collective.
std::vector<int> ranks_apart_from_lead(const CheckpointPeers& peers, const fs::path& run_dir);
// Where rank `rank` keeps its own checkpoints when it does not see rank 0's run directory: RUN_DIR/ranks/rank-R (its
// checkpoints/ as in any run directory). Its model/optim are that rank's replica (state.json's "replica_rank").
fs::path own_run_dir(const fs::path& run_dir, int rank);
// The run directory whose checkpoints/ `contents` (completed by stage_rank_state) goes to: rank 0's, or this rank's
// own.
fs::path publish_dir(const fs::path& run_dir, const CheckpointContents& contents);

// At start-up, before anything is trained: which ranks see rank 0's train.run_dir (rank 0 writes a token there, every
// rank reads it back), said once by rank 0 (and by each rank that keeps its own directory, with its path). On a resume
// (`resume_steps`: the steps of the checkpoints this rank can resume from, oldest first; empty: a fresh run) it
// returns the newest step every rank holds — a machine killed while it wrote its checkpoint may lack the newest one —
// or fails on every rank naming each rank's newest when there is none. Returns -1 for a fresh run. Collective.
int64_t check_run_dirs(const CheckpointPeers& peers, const fs::path& run_dir, const std::vector<int64_t>& resume_steps);

struct RankState {
  const NamedTensors& params;
  const NamedTensors& optim_state;
  LoaderPosition position;
  const NamedTensors* outer = nullptr;  // this rank's own outer state (a pipeline stage's DiLoCo); null: none
  const NamedTensors* aux = nullptr;    // this rank's auxiliary heads (local parallelism); null: none
  const NamedTensors* codec = nullptr;  // this rank's codec state (error feedback); null or empty: none
};

// Returns true on the ranks that publish a checkpoint (rank 0, and every rank keeping its own directory; they then
// call save_checkpoint(publish_dir(...), contents)), false on the ranks that staged their files in rank 0's.
bool stage_rank_state(const CheckpointPeers& peers, const fs::path& run_dir, int64_t step, const RankState& mine,
                      CheckpointContents& contents);

}  // namespace tributary
