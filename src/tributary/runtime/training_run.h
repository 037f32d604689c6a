// The trainer's source of work for the one run loop (run_loop.h): one step and its sync per unit, for one process,
// replicas, pipelines, local parallelism and islands (training_run.cpp): where those differ it asks its Sync
// (sync/sync.h); a fault-tolerant run's changing membership is ft/membership_follower.h's. Internal to runtime/.
#pragma once

#include <functional>
#include <memory>
#include <optional>

#include "tributary/artifacts/checkpoint.h"
#include "tributary/core/clock.h"
#include "tributary/data/dataset.h"
#include "tributary/data/loader.h"
#include "tributary/model/aux_head.h"
#include "tributary/model/transformer.h"
#include "tributary/optim/adamw.h"
#include "tributary/optim/schedule.h"
#include "tributary/parallel/layout.h"
#include "tributary/parallel/train_step.h"
#include "tributary/runtime/ft/lead.h"
#include "tributary/runtime/ft/membership_follower.h"
#include "tributary/runtime/run_loop.h"
#include "tributary/runtime/run_report.h"
#include "tributary/runtime/run_state.h"
#include "tributary/runtime/slowdown.h"
#include "tributary/runtime/stage_accounting.h"
#include "tributary/runtime/step_factory.h"
#include "tributary/runtime/stop.h"
#include "tributary/runtime/sync/sync.h"
#include "tributary/runtime/train_options.h"
#include "tributary/runtime/train_summary.h"

namespace tributary::detail {

// What this rank trains: the model (every rank holds the whole model; a pipeline stage trains its own part), local
// parallelism's auxiliary heads, and the optimizer over `trained`.
struct ModelParts {
  std::shared_ptr<Transformer> model;
  NamedTensors params;                  // every parameter of `model`
  std::shared_ptr<AuxHeads> aux_heads;  // local parallelism: the chunks' auxiliary heads (kept out of `model`)
  NamedTensors aux_params;
  NamedTensors trained;  // what the optimizer updates: every parameter, or its stage's (+ its head's)
  std::unique_ptr<AdamW> optimizer;
};

// What this rank reads: the dataset, its share of the training windows, the validation tokens (the lead evaluates).
struct RunData {
  std::optional<Dataset> dataset;
  std::unique_ptr<BatchLoader> loader;
  std::shared_ptr<const std::vector<uint32_t>> val_tokens;
  size_t num_train_tokens = 0;
  // The training split as one stream, or with data.shards = "domains" one per domain (dist.score = "loss" draws its
  // probe batches from all of them alike).
  std::vector<std::shared_ptr<const std::vector<uint32_t>>> train_strata;
};

// One training run of one process: built in order (the seed fixes the initialisation, so nothing may draw random
// numbers before the model), then driven unit by unit (one step and its sync) by the run loop.
// Size: the run's parts (layout, its sync and the replicas' rounds, model parts, the step, data, report, the members)
// and what is carried from step to step (progress, tokens and FLOPs per step, training and evaluation time).
class TrainingRun : public WorkSource {
 public:
  TrainingRun(const RunConfig& config, const TrainOptions& options);

  StopAgreement::Vote stop_vote() override;
  bool lead() const override { return lead_.is(); }
  bool done() const override { return progress_.step >= max_steps() || over_; }
  UnitDone next() override;  // batch -> step -> sync -> (membership) -> report
  Due due_after(const UnitDone& unit, bool stop) override;
  void when_due(const UnitDone& unit, const Due& due) override;
  void between_units(const UnitDone& unit) override;
  TrainSummary finish(bool stopped_early) override;

 private:
  void build_model_and_data();
  std::optional<PendingHeal> start_sync();  // a joiner healed mid-round: its pending heal
  void start_report(double bytes_per_token);
  void start_training();
  void load_codec_state();  // a resumed rank's error feedback, when the world is the same
  void describe(int64_t threads) const;
  StepResult step_once(int64_t step, double lr);
  void measure_stage();  // a pipeline stage's step: its traffic, compute, bubble and peak memory
  void report_exchange(int64_t step, bool synced, double elapsed);
  void count_traffic(const comm::CommStats& c);  // the replicas' exchanges, into the summary
  void record(const StepResult& result, int64_t step, double lr, double now);
  void save(int64_t step, double elapsed);
  double elapsed() const { return progress_.elapsed_before + seconds_since(run_start_); }
  // train.steps, or more where the sync ends the run itself (Share::max_steps: asynchronous rounds).
  int64_t max_steps() const { return share_.max_steps > 0 ? share_.max_steps : tc_.steps; }
  // The rounds of the sync's replicas() (their outer loop, their traffic); null where none.
  ReplicaRounds* rounds() const;
  bool averaging_gradients() const;  // data parallel, or DiLoCo's warm-up
  // A step's tokens, all replicas together: a fault-tolerant run's members' as of their last change.
  int64_t tokens_per_step() const { return members_ ? members_->tokens_per_step() : tokens_per_step_; }

  RunConfig config_;
  const TrainConfig& tc_ = config_.train;
  TrainOptions options_;
  Layout layout_;  // what kind of run, and this rank's place in it
  torch::Device device_;
  Lead lead_;  // writes metrics.jsonl, evaluates, writes the summary (fault tolerance: the lowest member)
  // This process's connection to the run (every group of the world is formed over it); none for one process.
  std::unique_ptr<Session> session_;
  std::unique_ptr<Sync> sync_;             // how this rank keeps together with the others (sync/sync.h)
  Share share_;                            // this rank's share of the run, as the sync's start left it
  std::function<double()> blocked_s_;      // the training thread's time blocked on communication (StepPeers)
  std::optional<StageAccounting> stages_;  // a pipeline stage's measurements
  std::optional<LoadedCheckpoint> ckpt_;
  ModelParts parts_;
  BuiltStep step_;  // the step behind the seam (parallel/train_step.h)
  CosineSchedule schedule_;
  RunData data_;
  RunProgress progress_;
  int64_t tokens_at_start_ = 0;  // progress_.tokens when this process began training (resumed or healed: not 0)
  std::unique_ptr<RunReport> report_;
  TrainSummary summary_;
  int64_t tokens_per_step_ = 0;                  // all replicas together, at the start
  std::unique_ptr<MembershipFollower> members_;  // dist.fault_tolerant: the replicas' changing members
  double flops_per_token_ = 0;
  double train_seconds_ = 0;  // in steps so far, this invocation
  double eval_seconds_ = 0;   // in evaluations so far, this invocation (inside elapsed())
  bool over_ = false;         // the sync ended the run's work (AfterStep::over)
  Clock::time_point run_start_;
  std::optional<Slowdown> slowdown_;  // dist.slow_workers: this worker's emulated slowness
  Faults faults_;                     // injected on purpose (TrainOptions::faults)
};

}  // namespace tributary::detail
