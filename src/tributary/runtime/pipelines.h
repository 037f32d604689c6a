// The pipelines of a multi-process run, as the trainer sees them (parallel.pipeline_stages > 1): formed over the run's
// session (runtime/session.h), the groups of this rank's place in the layout (parallel/layout.h: Megatron's order, or
// a placement from `tributary plan`): its groups (its pipeline; its stage's replicas in
// the other pipelines, averaging gradients every step or, with dist.algorithm = diloco, taking DiLoCo outer steps;
// first + last stage for the tied embedding), the stop vote over every rank, and the
// consolidation that brings every stage's current parameters to every rank of the pipeline (for evaluation and the
// dense checkpoint rank 0 writes). The step itself is parallel/pipeline/pipeline_step.h.
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
#include "tributary/runtime/replicas.h"

namespace tributary {

class Pipelines {
 public:
  // The groups of this rank's place in `layout` (RunKind::kPipelines), formed over the session.
  Pipelines(const Session& session, const Layout& layout);
  ~Pipelines();

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
  // DiLoCo per stage (dist.algorithm = diloco, more than one pipeline): this stage's replicas across the pipelines,
  // which take outer steps every H inner steps instead of averaging gradients every step (groups().data averages
  // only during dist.warmup_ddp_steps, and is null without a warm-up). Null otherwise.
  Replicas* stage_replicas() { return stage_replicas_.get(); }
  // After each step: DiLoCo per stage (stage_replicas()'s sync: its outer steps due, `last`: and the pending ones);
  // true when an outer step landed. Several pipelines per island (Layout::pipelines_per_island() > 1): the island's
  // first pipeline's stage takes them across the islands, then the island's other pipelines learn whether one landed
  // and take its stage over the stage's island group (true on every rank of the island).
  bool after_step(int64_t step, double lr, NamedTensors& trained, bool last);
  bool quiescent() const { return quiescent_; }  // no exchange in flight (the island's first pipeline's, for all)
  // Local parallelism (local.chunks > 0): the pipeline's lagged sum of the stages' numbers, lag local.queue_steps.
  comm::LaggedReduce* stage_report() { return report_.get(); }

  bool stop_agreed(bool local_stop) { return stop_vote_->step(local_stop); }
  // Every stage's numbers (same length on every rank) gathered over the pipeline: [stage][i].
  std::vector<std::vector<double>> gather_stages(const std::vector<double>& mine);
  // Every rank of the run, for the multi-process checkpoint (runtime/replica_checkpoint.h).
  void barrier() { world_->barrier(); }
  std::vector<torch::Tensor> all_gather(const torch::Tensor& t) { return world_->all_gather(t); }
  // Every stage broadcasts the parameters it owns over its pipeline: afterwards every rank's whole model is current.
  // Called by every rank at the same steps.
  void consolidate(NamedTensors& all_params, int64_t blocks_per_level);
  // Local parallelism: stage s broadcasts its auxiliary head ("aux.<s>.*") over its pipeline, so every rank's copy of
  // every head is current (rank 0 checkpoints them all). Called by every rank at the same steps.
  void consolidate_aux_heads(NamedTensors& aux_params);

 private:
  // `root`'s tensors to the whole pipeline; with the run's secret their tag goes through the sealed store and every
  // receiver checks it (NetworkError naming the stage otherwise).
  void broadcast_sealed(std::vector<torch::Tensor>& buffers, int root);

  pipeline::StageLayout layout_;
  pipeline::ScheduleSpec schedule_;
  Layout place_;  // this rank's stage and pipeline among the run's
  std::unique_ptr<comm::Group> pipe_, tie_, data_;
  std::unique_ptr<comm::Group> world_;  // every rank: the checkpoint protocol
  std::unique_ptr<Replicas> stage_replicas_;
  std::unique_ptr<comm::LaggedVote> stop_vote_;
  std::unique_ptr<comm::LaggedReduce> report_;
  std::optional<comm::WireMac> mac_;                          // the run's secret: the stages' messages carry its MAC
  std::unique_ptr<comm::Exchange> tie_sealed_, data_sealed_;  // and the stage's gradient sums (PipelineGroups)
  std::optional<comm::Store> store_;                          // the run's (with a secret): the consolidation's tags
  int64_t broadcasts_ = 0;  // sealed broadcasts so far (the same count on every rank of the pipeline)
  bool quiescent_ = true;
};

}  // namespace tributary
