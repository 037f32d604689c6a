// A pipeline stage's sync (runtime/sync/sync.h; RunKind::kPipelines, parallel.pipeline_stages > 1): each rank trains
// one stage of one pipeline, formed over the run's session (runtime/session.h) as the groups of this rank's place in
// the layout (parallel/layout.h: Megatron's order, or a placement from `tributary plan`): its pipeline; its stage's
// replicas in the other pipelines, averaging gradients every step or, with dist.algorithm = diloco, taking DiLoCo's
// rounds (a ReplicaSync of their own); first + last stage for the tied embedding; the stop vote over every rank; and
// the consolidation that brings every stage's current parameters to every rank of the pipeline before the whole model
// is read (evaluation, the dense checkpoint rank 0 writes). Every rank of a pipeline reads the same windows. The step
// itself is parallel/pipeline/pipeline_step.h.
#pragma once

#include <memory>
#include <optional>

#include "tributary/comm/group.h"
#include "tributary/comm/lagged_reduce.h"
#include "tributary/comm/lagged_vote.h"
#include "tributary/config/run_config.h"
#include "tributary/launch/dist_env.h"
#include "tributary/model/tensor_io.h"
#include "tributary/parallel/layout.h"
#include "tributary/parallel/pipeline/pipeline_step.h"
#include "tributary/runtime/sync/replica_sync.h"
#include "tributary/runtime/sync/sync.h"

namespace tributary {

// Size: the Sync's answers, and what the pipeline step (parallel/pipeline/pipeline_step.h) and the stages' accounting
// ask of the pipeline: its layout, schedule, groups and lagged report, and the stages' numbers gathered.
class PipelineSync : public Sync {
 public:
  // The groups of this rank's place in `layout` (RunKind::kPipelines), formed over the session.
  PipelineSync(const Session& session, const Layout& layout);
  ~PipelineSync() override;

  Share share() const override {
    return {.data = {int(place_.replica()), int(place_.replicas())},
            .batches_per_step = place_.replicas(),
            .replicas_of = " of each stage",
            .line = line_};
  }
  // A resumed stage's replicas take their outer state from the stage's rank's own file.
  Started start(const StartState& state) override;
  // DiLoCo per stage (dist.algorithm = diloco, more than one pipeline): this stage's replicas across the pipelines,
  // which take outer steps every H inner steps instead of averaging gradients every step (groups().data averages
  // only during dist.warmup_ddp_steps, and is null without a warm-up). Null otherwise.
  ReplicaSync* replicas() override { return stage_replicas_.get(); }
  StepPeers step_peers() override { return {.pipelines = this}; }
  // DiLoCo per stage: the stage replicas' outer steps due (`last`: and the pending ones). Several pipelines per island
  // (Layout::pipelines_per_island() > 1): the island's first pipeline's stage takes them across the islands, then the
  // island's other pipelines learn whether one landed and take its stage over the stage's island group (true on every
  // rank of the island).
  AfterStep after_step(int64_t step, double lr, NamedTensors& trained, bool last) override;
  RunPeers peers() override {
    return {.checkpoint = group_peers(*world_), .stop = [this](bool local) { return stop_vote_->step(local); }};
  }
  // Pipeline stages hold only their own parameters current: every stage broadcasts its own (and its auxiliary head)
  // over its pipeline. Called by every rank at the same steps.
  void before_read(NamedTensors& params, NamedTensors* aux_params) override;
  // A pipeline rank's parameters are its whole model as consolidated over its pipeline (its own stage current), so
  // `restore` reads them as it reads a replica's; DiLoCo per stage adds the stage's outer state per rank.
  bool checkpoint_part(const fs::path& run_dir, int64_t step, const RankState& mine,
                       CheckpointContents& contents) override;
  void summarize(TrainSummary& summary) override { summary.world_size = world_size(); }

  int rank() const { return world_->rank(); }
  int world_size() const { return world_->size(); }
  int64_t stage() const { return place_.stage(); }  // the rest of this rank's place: the run's Layout
  const pipeline::StageLayout& layout() const { return layout_; }
  pipeline::ScheduleSpec schedule() const { return schedule_; }
  pipeline::PipelineGroups groups() {
    return {
        pipe_.get(),       tie_.get(),        data_.get(), place_.stage_data_parallel_steps(), mac_ ? &*mac_ : nullptr,
        tie_sealed_.get(), data_sealed_.get()};
  }
  // Local parallelism (local.chunks > 0): the pipeline's lagged sum of the stages' numbers, lag local.queue_steps.
  comm::LaggedReduce* stage_report() { return report_.get(); }
  // Every stage's numbers (same length on every rank) gathered over the pipeline: [stage][i].
  std::vector<std::vector<double>> gather_stages(const std::vector<double>& mine);

 private:
  // Every stage broadcasts the parameters it owns over its pipeline: afterwards every rank's whole model is current.
  void consolidate(NamedTensors& all_params);
  // Local parallelism: stage s broadcasts its auxiliary head ("aux.<s>.*") over its pipeline, so every rank's copy of
  // every head is current (rank 0 checkpoints them all).
  void consolidate_aux_heads(NamedTensors& aux_params);
  // `root`'s tensors to the whole pipeline; with the run's secret their tag goes through the sealed store and every
  // receiver checks it (NetworkError naming the stage otherwise).
  void broadcast_sealed(std::vector<torch::Tensor>& buffers, int root);

  pipeline::StageLayout layout_;
  pipeline::ScheduleSpec schedule_;
  Layout place_;  // this rank's stage and pipeline among the run's
  int64_t blocks_per_level_;
  int launched_rank_;
  std::string line_;  // the start-up line that describes the pipelines
  std::unique_ptr<comm::Group> pipe_, tie_, data_;
  std::unique_ptr<comm::Group> world_;  // every rank: the checkpoint protocol
  std::unique_ptr<ReplicaSync> stage_replicas_;
  std::unique_ptr<comm::LaggedVote> stop_vote_;
  std::unique_ptr<comm::LaggedReduce> report_;
  std::optional<comm::WireMac> mac_;                          // the run's secret: the stages' messages carry its MAC
  std::unique_ptr<comm::Exchange> tie_sealed_, data_sealed_;  // and the stage's gradient sums (PipelineGroups)
  std::optional<comm::Store> store_;                          // the run's (with a secret): the consolidation's tags
  int64_t broadcasts_ = 0;  // sealed broadcasts so far (the same count on every rank of the pipeline)
  bool quiescent_ = true;
};

}  // namespace tributary
