// Islands (parallel.islands; INTELLECT-1's and torchft's HSDP shape): ranks joined by a fast link form an island,
// islands are joined by slow links. Inside an island the ranks are one replica trained data parallel (the bucketed,
// overlapped all-reduce of parallel/data_parallel.h), optionally with ZeRO-1 (parallel.shard_optimizer: rank r keeps
// and steps rows r/N of every AdamW moment, and the island all-gathers the step's parameters). Across islands the
// replicas keep together by DiLoCo (Streaming fragments, overlap and every codec included), sharded: the outer state
// and the pseudo-gradient are cut into S = smallest-island-size row shards (parallel/row_shards.h), rank r < S of an
// island exchanges shard r with rank r of the other islands over the slow link (S parallel streams, each 1/S of the
// bytes, and 1/S of the outer state per rank), and after an outer step lands the island all-gathers the shards.
//
// Groups on the run's store: island.<i> (the island's own collectives), island-dp.<i> (its gradient all-reduce),
// islands.shard<r> (shard r across the islands; the emulated WAN applies here only), world (stop vote, checkpoints).
//
// Fault tolerant (dist.fault_tolerant; an island is a machine's workers, launched with --restart-island): the run's
// one quorum has the islands as its members, each spoken for by its rank 0, which exchanges the whole model with the
// other islands' ranks 0 (one outer shard) under the quorum's own scope of the store (kIslandsScope): rounds commit
// or are redone without a dead island, and the run's checkpoints, evaluation, stop vote and heals are the island
// leads' (runtime/ft/). The island's other ranks follow their rank 0 every step over the island's group (what landed,
// the stop, the data shard). A rank lost inside an island takes the island out: the others' collectives fail, launch
// starts the island again as its next life (groups island.<i>.life<L>), its rank 0 rejoins the quorum, heals from a
// peer island's rank 0 and hands the state to the island's other ranks.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>

#include "tributary/comm/group.h"
#include "tributary/comm/lagged_vote.h"
#include "tributary/config/run_config.h"
#include "tributary/launch/dist_env.h"
#include "tributary/optim/adamw.h"
#include "tributary/parallel/layout.h"
#include "tributary/runtime/checkpoint.h"
#include "tributary/runtime/replica_checkpoint.h"
#include "tributary/runtime/replicas.h"
#include "tributary/runtime/run_state.h"

namespace tributary {

class Islands {
 public:
  Islands(const Session& session, const Layout& layout);
  ~Islands();

  // Data parallel inside the island: the dense step averages its gradients through it. Null for an island of one.
  ReplicaSync* inside() { return inside_ ? &inside_->sync() : nullptr; }
  // DiLoCo across the islands for this rank's outer shard. Null when this rank holds none (an island larger than
  // the smallest one).
  Replicas* across() { return across_.get(); }

  // Every island agrees on its rank 0's parameters and AdamW state (a resume from another shape included), shards
  // the optimizer (ZeRO-1), and starts the outer loop over this rank's shard at `step` (resumed: `outer` is the whole
  // outer.safetensors, `progress` its units' progress). Collective over the run.
  void start(NamedTensors& params, AdamW& optimizer, int64_t step = 0, const safetensors::File* outer = nullptr,
             const nlohmann::json& progress = nlohmann::json::array());
  // Fault tolerant, an island started again (DistEnv::joining) instead of start(): its rank 0 joins the quorum and
  // heals from a peer island (join_run: `progress`, the loader), then hands the state to the island's other ranks.
  // Rank 0's pending heal (it trains on and becomes a member at the next round), if any. Collective in the island.
  std::optional<PendingHeal> join(NamedTensors& params, AdamW& optimizer, BatchLoader& loader, RunProgress& progress,
                                  int64_t total_steps);
  // Fault tolerant, every unit and after start()/join(): the island's other ranks read the windows their rank 0's
  // shard of the members implies (rank 0's loader rank + their island rank, its world and position) and take its
  // tokens per step (returned; rank 0's own on rank 0). Collective in the island.
  int64_t follow_lead(BatchLoader& loader, int64_t tokens_per_step);
  bool shards_optimizer() const { return shard_optimizer_; }  // ZeRO-1 in this run
  // Fault tolerant: rank 0's `mine`, on every rank of the island (collective in the island); `mine` elsewhere.
  bool rank_zero_says(bool mine);
  // After each step: the outer steps due for this rank's shard (`last`: and the pending ones), then, when one
  // landed, the island's all-gather of the shards. True on every rank of every island when an outer step landed.
  bool after_step(int64_t step, double lr, NamedTensors& params, bool last);
  bool quiescent() const { return quiescent_; }  // no exchange in flight (the island's rank 0's, for all of it)
  int64_t outer_steps() const { return across_ ? across_->sync().outer_steps() : 0; }

  // Fault tolerant: the island's wish (any of its ranks') is its rank 0's vote in the quorum's rounds; the decision is
  // told to the island.
  bool stop_agreed(bool local_stop);
  // parallel.island_steps = "auto" (runtime/island_pace.h): every rank's measured step seconds, in rank order
  // (collective over the run); then the layout with the pace they give, before start().
  std::vector<double> all_seconds(double mine);
  void set_pace(const Layout& layout);
  CheckpointPeers peers();  // every rank of the run
  // A checkpoint's part beyond the per-rank files: the whole outer state (outer.safetensors, gathered within the
  // island) and the units' progress, on rank 0. Collective over the run, like stage_rank_state.
  bool stage_state(const fs::path& run_dir, int64_t step, const RankState& mine, CheckpointContents& contents);
  // The gradient all-reduce's traffic inside the island since the last call (fast link).
  comm::CommStats take_inside_stats();

 private:
  NamedTensors whole_outer_state(const NamedTensors& params);
  void weigh_updates();  // this island's pseudo-gradient's weight across the islands, from the layout's pace
  void share(const std::vector<torch::Tensor>& tensors, int64_t shards);  // island all-gather of row shards
  void from_lead(const std::vector<torch::Tensor>& tensors);              // island broadcast from its rank 0
  void shard(AdamW& optimizer);  // ZeRO-1 (parallel.shard_optimizer): this rank keeps its rows of the moments

  Layout layout_;
  bool shard_optimizer_;
  bool fault_tolerant_;
  comm::Store store_;  // the run's
  std::unique_ptr<comm::Group> island_, world_;
  std::unique_ptr<comm::LaggedVote> stop_vote_;
  std::unique_ptr<Replicas> inside_, across_;
  NamedTensors params_;        // every parameter (whole), for the island's all-gather after an outer step
  NamedTensors outer_params_;  // this rank's outer shard: views of the parameters' rows
  bool quiescent_ = true;
};

}  // namespace tributary
