// The whole model's replicas (RunKind::kReplicas): data parallel, DiLoCo and its kin, fault tolerant or not; every
// rank holds and trains the whole model and reads its own share of the windows. Internal to runtime/.
#pragma once

#include "tributary/runtime/replicas.h"
#include "tributary/runtime/world/world.h"

namespace tributary::detail {

class ReplicaWorld : public World {
 public:
  explicit ReplicaWorld(const Session& session);

  Replicas* synced() override { return &replicas_; }
  StepPeers step_peers() override { return {.sync = &replicas_.sync()}; }
  std::optional<CheckpointPeers> peers() override { return checkpoint_peers(replicas_); }
  double matmul_peak(const torch::Device& device) override { return replicas_.shared_matmul_peak(device); }
  Share share() const override { return {.data = {rank_, world_}, .batches_per_step = replicas_.size()}; }
  std::optional<PendingHeal> start(const StartState& state) override;
  StopAgreement::Vote stop_vote() override;
  AfterStep after_step(int64_t step, double lr, NamedTensors& trained, bool last) override;
  double blocked_total_s() const override { return replicas_.blocked_total_s(); }
  bool stage_state(const fs::path& run_dir, int64_t step, const RankState& mine, CheckpointContents& contents) override;
  void summarize(TrainSummary& summary) override { summary.world_size = replicas_.size(); }

 private:
  Replicas replicas_;
  int rank_, world_;  // the launched ranks (a fault-tolerant run's members may be fewer)
};

}  // namespace tributary::detail
