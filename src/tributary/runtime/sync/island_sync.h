// The islands' sync (runtime/sync/sync.h; parallel.islands; INTELLECT-1's and torchft's HSDP shape), a composition of
// two replica syncs: ranks joined by a fast link form an island,
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
//
// Asynchronous (dist.algorithm = async_diloco, Decoupled DiLoCo's learners as sites): an island's inner data-parallel
// group stays synchronous, the islands are asynchronous to each other. Each island's rank 0 is one member of
// asynchronous DiLoCo (runtime/sync/async_sync.h: it posts its island's pseudo-gradient every H steps without waiting,
// adopts each newer global version at once, and holds a merger candidate); when it adopts one it hands the model to
// its island (one broadcast). An island stops on its own (its ranks' wishes), as an asynchronous replica does, and the
// run's lead writes the global model.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>

#include "tributary/artifacts/checkpoint.h"
#include "tributary/comm/group.h"
#include "tributary/comm/lagged_vote.h"
#include "tributary/config/run_config.h"
#include "tributary/launch/dist_env.h"
#include "tributary/optim/adamw.h"
#include "tributary/parallel/layout.h"
#include "tributary/runtime/replica_checkpoint.h"
#include "tributary/runtime/run_state.h"
#include "tributary/runtime/sync/async_sync.h"
#include "tributary/runtime/sync/replica_sync.h"
#include "tributary/runtime/sync/sync.h"

namespace tributary {

// Size: the Sync's answers; everything else is private.
class IslandSync : public Sync {
 public:
  IslandSync(const Session& session, const Layout& layout);
  ~IslandSync() override;

  // Every rank reads its own share of the windows (a fault-tolerant island's other ranks follow their rank 0's).
  Share share() const override;
  // parallel.island_steps = "auto": the islands first agree on the pace (runtime/step_seconds.h). Then every island
  // agrees on its rank 0's parameters and AdamW state (a resume from another shape included), shards the optimizer
  // (ZeRO-1), and starts the outer loop over this rank's shard (resumed: the rows of the checkpoint's whole outer
  // state). Fault tolerant, an island started again (DistEnv::joining) joins instead: its rank 0 joins the quorum and
  // heals from a peer island (join_run), then hands the state to the island's other ranks.
  Started start(const StartState& state) override;
  // DiLoCo across the islands for this rank's outer shard. Null when this rank holds none (an island larger than
  // the smallest one).
  ReplicaSync* replicas() override { return across_.get(); }
  // Data parallel inside the island: the dense step averages its gradients through it (none for an island of one).
  StepPeers step_peers() override { return {.rounds = inside_ ? &inside_->rounds() : nullptr}; }
  // The outer steps due for this rank's shard (`last`: and the pending ones), then, when one landed, the island's
  // all-gather of the shards. Landed on every rank of every island alike. Asynchronous: the island's rank 0's round
  // and adoption, the adopted model handed to the island.
  AfterStep after_step(int64_t step, double lr, NamedTensors& params, bool last) override;
  // Asynchronous: the lead reads the newest global version (async_sync.h), handed to its island.
  void before_read(NamedTensors& params, NamedTensors* aux_params) override;
  // Fault tolerant: ZeRO-1's AdamW state a heal sends is gathered by the island's ranks together.
  std::optional<HealState> heal_made_together(bool heals, const std::function<HealState()>& own) override {
    return shard_optimizer_ && rank_zero_says(heals) ? std::optional(own()) : std::nullopt;
  }
  // Fault tolerant, every unit and after start(): the island's other ranks read the windows their rank 0's shard of
  // the members implies (rank 0's loader rank + their island rank, its world and position) and take its tokens per
  // step (returned; rank 0's own on rank 0). Collective in the island.
  int64_t follow_lead(BatchLoader& loader, int64_t tokens_per_step) override;
  // Fault tolerant, the stop: the island's wish (any of its ranks') is its rank 0's vote in the quorum's rounds; the
  // decision is told to the island. An island started again takes no part in the run's checkpoint collectives.
  RunPeers peers() override {
    return {.checkpoint = world_ ? std::optional(group_peers(*world_)) : std::nullopt,
            .stop = [this](bool local) { return stop_agreed(local); }};
  }
  // The checkpoint's part beyond the per-rank files: the whole outer state (outer.safetensors, gathered within the
  // island) and the units' progress, on rank 0. Collective over the run, like stage_rank_state.
  bool checkpoint_part(const fs::path& run_dir, int64_t step, const RankState& mine,
                       CheckpointContents& contents) override;
  void summarize(TrainSummary& summary) override;

 private:
  // parallel.island_steps = "auto": the pace every rank's step_seconds() gives, or a resume's (its checkpoint's).
  // Collective over the run.
  void pace(const LoadedCheckpoint* ckpt, const std::function<double()>& step_seconds, bool lead);
  void start_island(NamedTensors& params, AdamW& optimizer, int64_t step, const safetensors::File* outer,
                    const nlohmann::json& progress);
  std::optional<PendingHeal> join(NamedTensors& params, AdamW& optimizer, BatchLoader& loader, RunProgress& progress,
                                  int64_t total_steps);
  bool stop_agreed(bool local_stop);
  AfterStep async_after_step(int64_t step, double lr, NamedTensors& params, bool last);
  bool rank_zero_says(bool mine);  // fault tolerant: rank 0's `mine`, on every rank of the island; `mine` elsewhere
  std::vector<double> all_seconds(double mine);  // every rank's measured step seconds, in rank order
  NamedTensors whole_outer_state(const NamedTensors& params);
  void weigh_updates();  // this island's pseudo-gradient's weight across the islands, from the layout's pace
  void gather_shards(const std::vector<torch::Tensor>& tensors, int64_t shards);  // island all-gather of rows
  void from_lead(const std::vector<torch::Tensor>& tensors);                      // island broadcast from its rank 0
  void shard(AdamW& optimizer);  // ZeRO-1 (parallel.shard_optimizer): this rank keeps its rows of the moments

  RunConfig config_;
  DistEnv env_;
  Layout layout_;
  bool shard_optimizer_;
  bool fault_tolerant_;
  comm::Store store_;  // the run's
  std::unique_ptr<comm::Group> island_, world_;
  std::unique_ptr<comm::LaggedVote> stop_vote_;
  std::unique_ptr<ReplicaSync> inside_, across_;
  bool async_islands_;                // dist.algorithm = async_diloco: the islands asynchronous to each other
  std::unique_ptr<AsyncSync> async_;  // then, on each island's rank 0: its member of asynchronous DiLoCo
  NamedTensors params_;               // every parameter (whole), for the island's all-gather after an outer step
  NamedTensors outer_params_;         // this rank's outer shard: views of the parameters' rows
  bool quiescent_ = true;
};

}  // namespace tributary
