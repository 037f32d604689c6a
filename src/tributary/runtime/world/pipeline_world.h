// Pipelines (RunKind::kPipelines): each rank trains one stage of one pipeline, and a stage's replicas across the
// pipelines average gradients every step or take DiLoCo's outer steps (Pipelines::stage_replicas). Every rank of a
// pipeline reads the same windows; the whole model is brought to every rank before it is read. Internal to runtime/.
#pragma once

#include "tributary/runtime/pipelines.h"
#include "tributary/runtime/world/world.h"

namespace tributary::detail {

class PipelineWorld : public World {
 public:
  PipelineWorld(const Session& session, const Layout& layout);

  Replicas* synced() override { return pipelines_.stage_replicas(); }
  Pipelines* pipelines() override { return &pipelines_; }
  std::optional<CheckpointPeers> peers() override;
  DataShard data_shard() const override { return {int(layout_.replica()), int(layout_.replicas())}; }
  int64_t batches_per_step() const override { return layout_.replicas(); }
  std::optional<PendingHeal> start(const StartState& state) override;
  StopAgreement::Vote stop_vote() override;
  bool after_step(int64_t step, double lr, NamedTensors& trained, bool last) override {
    return pipelines_.after_step(step, lr, trained, last);
  }
  bool quiescent() override { return pipelines_.quiescent(); }
  void whole_model(NamedTensors& params, NamedTensors* aux_params) override;
  bool stage_state(const fs::path& run_dir, int64_t step, const RankState& mine, CheckpointContents& contents) override;
  void describe() override;
  std::string replicas_of() const override { return " of each stage"; }
  void summarize(TrainSummary& summary) override { summary.world_size = world_size_; }

 private:
  RunConfig config_;
  Layout layout_;
  Pipelines pipelines_;
  int rank_, world_size_;
};

}  // namespace tributary::detail
