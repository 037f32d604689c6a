// Islands (RunKind::kIslands): data parallel inside an island (optionally ZeRO-1), DiLoCo across the islands over
// each rank's outer shard, or, fault tolerant, over the islands' ranks 0 (runtime/islands.h). Every rank reads its own
// share of the windows (a fault-tolerant island's other ranks follow their rank 0's). Internal to runtime/.
#pragma once

#include "tributary/runtime/islands.h"
#include "tributary/runtime/world/world.h"

namespace tributary::detail {

class IslandWorld : public World {
 public:
  IslandWorld(const Session& session, const Layout& layout);

  Replicas* synced() override { return islands_.across(); }
  StepPeers step_peers() override { return {.sync = islands_.inside()}; }
  std::optional<CheckpointPeers> peers() override { return islands_.peers(); }
  Share share() const override;
  std::optional<PendingHeal> start(const StartState& state) override;
  StopAgreement::Vote stop_vote() override;
  AfterStep after_step(int64_t step, double lr, NamedTensors& trained, bool last) override {
    const bool landed = islands_.after_step(step, lr, trained, last);
    return {.landed = landed, .quiescent = islands_.quiescent()};
  }
  int64_t follow_lead(BatchLoader& loader, int64_t tokens_per_step) override {
    return islands_.follow_lead(loader, tokens_per_step);
  }
  bool heal_reads_together(bool heals) override {
    return islands_.shards_optimizer() && islands_.rank_zero_says(heals);
  }
  bool stage_state(const fs::path& run_dir, int64_t step, const RankState& mine,
                   CheckpointContents& contents) override {
    return islands_.stage_state(run_dir, step, mine, contents);
  }
  void describe() override;
  void summarize(TrainSummary& summary) override;

 private:
  // parallel.island_steps = "auto": the pace every rank's step_seconds() gives, or a resume's (its checkpoint's).
  // Collective over the run.
  void pace(const LoadedCheckpoint* ckpt, const std::function<double()>& step_seconds, bool lead);

  RunConfig config_;
  DistEnv env_;
  Layout layout_;
  Islands islands_;
};

}  // namespace tributary::detail
