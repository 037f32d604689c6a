// A pipeline stage's sync (runtime/sync/sync.h; RunKind::kPipelines, parallel.pipeline_stages > 1): each rank trains
// one stage of one pipeline, formed over the run's session (runtime/session.h) as the groups of this rank's place in
// the layout (parallel/layout.h: Megatron's order, or a placement from `tributary plan`): its pipeline; its stage's
// replicas in the other pipelines, averaging gradients every step or, with dist.algorithm = diloco, taking DiLoCo's
// rounds (a ReplicaSync of their own); first + last stage for the tied embedding; the stop vote over every rank; and
// the consolidation that brings every stage's current parameters to every rank of the pipeline before the whole model
// is read (evaluation, the dense checkpoint rank 0 writes). Every rank of a pipeline reads the same windows. The step
// itself is parallel/pipeline/pipeline_step.h.
//
// Fault tolerant (dist.fault_tolerant with parallel.islands = machines: one pipeline per machine, launched with
// --restart-island): a pipeline is the fault domain and one member of the run's quorum, spoken for by its stage 0
// (the lead) as an island is by its rank 0 (island_sync.h). When a round is due, the pipeline makes its lead's copy
// of the whole model current (each stage broadcasts its own), the lead takes DiLoCo's round for the whole model with
// the other pipelines' leads (a ReplicaSync over the quorum's scope of the store: commit, or redo without a dead
// pipeline), and hands the result to its stages. The stages follow the lead every step over the pipeline (the round
// due, what landed, the stop, the data position). A rank lost takes its pipeline out: the others' collectives fail,
// launch starts the machine's pipeline again as its next life (groups pipe.<i>.life<L>), its lead rejoins the quorum
// and heals from a peer pipeline's lead — every stage's parameters and AdamW moments (pipeline_state.h), made by the
// peer pipeline's stages together — and hands each stage its part. The checkpoints are the leads': the whole model
// and every stage's moments, which a resume hands each stage its part of.
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
#include "tributary/runtime/sync/pipeline_state.h"
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
  // A resumed stage's replicas take their outer state from the stage's rank's own file. Fault tolerant, the lead
  // starts the whole model's rounds (a resume: from the checkpoint's outer state); a pipeline started again joins
  // instead (its lead heals from a peer pipeline's, then hands every stage its part).
  Started start(const StartState& state) override;
  // DiLoCo per stage (dist.algorithm = diloco, more than one pipeline): this stage's replicas across the pipelines,
  // which take outer steps every H inner steps instead of averaging gradients every step (groups().data averages
  // only during dist.warmup_ddp_steps, and is null without a warm-up). Fault tolerant: the pipelines' leads' replicas
  // of the whole model, on the lead. Null otherwise.
  ReplicaSync* replicas() override { return fault_tolerant_ ? across_.get() : stage_replicas_.get(); }
  StepPeers step_peers() override { return {.pipelines = this}; }
  // DiLoCo per stage: the stage replicas' outer steps due (`last`: and the pending ones). Several pipelines per island
  // (Layout::pipelines_per_island() > 1): the island's first pipeline's stage takes them across the islands, then the
  // island's other pipelines learn whether one landed and take its stage over the stage's island group (true on every
  // rank of the island).
  // Fault tolerant: the whole model's round on the lead when one is due, told to the pipeline (true on every rank).
  AfterStep after_step(int64_t step, double lr, NamedTensors& trained, bool last) override;
  // Fault tolerant, between rounds: a heal's state made by the pipeline (every stage's parameters and moments).
  std::optional<HealState> heal_made_together(bool heals, const std::function<HealState()>& own) override;
  // Fault tolerant: the stages read the windows and take the tokens per step of their lead.
  int64_t follow_lead(BatchLoader& loader, int64_t tokens_per_step) override;
  // Fault tolerant, the stop: any stage's wish is its pipeline's, which the lead votes with in the quorum's rounds. A
  // pipeline started again takes no part in the run's checkpoint collectives.
  RunPeers peers() override {
    return {.checkpoint = world_ ? std::optional(group_peers(*world_)) : std::nullopt,
            .stop = [this](bool local) { return stop_agreed(local); }};
  }
  // Pipeline stages hold only their own parameters current: every stage broadcasts its own (and its auxiliary head)
  // over its pipeline; fault tolerant, every stage's moments reach the lead too (its checkpoint's). Called by every
  // rank at the same steps.
  void before_read(NamedTensors& params, NamedTensors* aux_params) override;
  // A pipeline rank's parameters are its whole model as consolidated over its pipeline (its own stage current), so
  // `restore` reads them as it reads a replica's; DiLoCo per stage adds the stage's outer state per rank.
  bool checkpoint_part(const fs::path& run_dir, int64_t step, const RankState& mine,
                       CheckpointContents& contents) override;
  void summarize(TrainSummary& summary) override { summary.world_size = world_size(); }

  int rank() const { return launched_rank_; }
  int world_size() const { return launched_world_; }
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
  // Refuses a shape the pipelines cannot run (fewer blocks than fragments in a stage, fault tolerance without its
  // launch), naming the key.
  void check_shape(const Session& session, const Layout& layout) const;
  void form_replicas(const Session& session, const Layout& layout);  // stage_replicas_, or across_ (fault tolerant)
  // Fault tolerant: a pipeline started again joins the run (its lead is healed), and its stages take their parts.
  std::optional<PendingHeal> join(const StartState& state);
  AfterStep member_after_step(int64_t step, double lr, bool last);
  bool stop_agreed(bool local_stop);

  pipeline::StageLayout layout_;
  pipeline::ScheduleSpec schedule_;
  Layout place_;  // this rank's stage and pipeline among the run's
  int64_t blocks_per_level_;
  int launched_rank_, launched_world_;
  bool tied_embeddings_;
  std::string line_;  // the start-up line that describes the pipelines
  std::unique_ptr<comm::Group> pipe_, tie_, data_;
  std::unique_ptr<comm::Group> world_;  // every rank: the checkpoint protocol
  std::unique_ptr<ReplicaSync> stage_replicas_;
  bool fault_tolerant_;
  std::unique_ptr<ReplicaSync> across_;   // fault tolerant, on the lead: the pipelines' replicas of the whole model
  NamedTensors params_;                   // fault tolerant: every parameter, this rank's copy
  std::unique_ptr<PipelineState> state_;  // fault tolerant: the pipeline's parameters and every stage's moments
  NamedTensors moments_;                  // fault tolerant, on the lead: every stage's, as of the last before_read
  std::unique_ptr<comm::LaggedVote> stop_vote_;
  std::unique_ptr<comm::LaggedReduce> report_;
  std::optional<comm::WireMac> mac_;                          // the run's secret: the stages' messages carry its MAC
  std::unique_ptr<comm::Exchange> tie_sealed_, data_sealed_;  // and the stage's gradient sums (PipelineGroups)
  std::optional<comm::Store> store_;  // the run's: the consolidation's tags (with a secret), the start's mark
  int64_t broadcasts_ = 0;            // sealed broadcasts so far (the same count on every rank of the pipeline)
  bool quiescent_ = true;
};

}  // namespace tributary
