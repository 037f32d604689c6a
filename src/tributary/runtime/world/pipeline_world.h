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
  StepPeers step_peers() override { return {.pipelines = &pipelines_}; }
  std::optional<CheckpointPeers> peers() override;
  Share share() const override {
    return {.data = {int(layout_.replica()), int(layout_.replicas())},
            .batches_per_step = layout_.replicas(),
            .replicas_of = " of each stage"};
  }
  std::optional<PendingHeal> start(const StartState& state) override;
  StopAgreement::Vote stop_vote() override;
  AfterStep after_step(int64_t step, double lr, NamedTensors& trained, bool last) override {
    const bool landed = pipelines_.after_step(step, lr, trained, last);
    return {.landed = landed, .quiescent = pipelines_.quiescent()};
  }
  void whole_model(NamedTensors& params, NamedTensors* aux_params) override;
  bool stage_state(const fs::path& run_dir, int64_t step, const RankState& mine, CheckpointContents& contents) override;
  void describe() override;
  void summarize(TrainSummary& summary) override { summary.world_size = world_size_; }

 private:
  RunConfig config_;
  Layout layout_;
  Pipelines pipelines_;
  int rank_, world_size_;
};

}  // namespace tributary::detail
