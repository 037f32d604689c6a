// Local parallelism across processes (shared/reference/pipeline-and-local.md §2.5): each pipeline stage is one chunk,
// behind the step seam (parallel/train_step.h). Per micro-batch a stage receives its input activation, runs its blocks,
// sends the output on at once (before its own loss), then computes its chunk's loss with its auxiliary head (the last
// stage: the model's head), backpropagates and accumulates. No gradient crosses a stage boundary in `chunked` mode.
// `overlapping` (synchronous): a stage sends the gradient of its loss at its input back to the previous stage, which
// backpropagates it through its last overlap blocks at the end of the step, after all of its own micro-batches.
// Then the stage's gradient reduction (pipeline/stage_gradients.h: tied embedding, data-parallel replicas), each
// chunk's clipping (local/chunks.h clip_groups) and the AdamW step.
//
// Stages are decoupled by a bounded queue: a stage does not wait for its sends at the end of a step, only for those
// `queue_steps` steps old, and shares its loss, step time and bytes through a lagged sum (comm/lagged_reduce.h) read
// `queue_steps` steps later; so a stage runs up to queue_steps steps ahead of the stages after it, and a slow stage
// holds up only what depends on it. (Overlapping mode and a tied embedding exchange gradients within the step, which
// couples the stages they join.) Every stage reads the same batch (same loader seed and position), so the targets
// need not travel.
#pragma once

#include <torch/torch.h>

#include <deque>

#include "tributary/comm/group.h"
#include "tributary/comm/lagged_reduce.h"
#include "tributary/data/loader.h"
#include "tributary/model/aux_head.h"
#include "tributary/model/transformer.h"
#include "tributary/optim/adamw.h"
#include "tributary/parallel/local/chunks.h"
#include "tributary/parallel/pipeline/pipeline_step.h"
#include "tributary/parallel/pipeline/wire.h"
#include "tributary/parallel/train_step.h"

namespace tributary::local {

struct LocalStageParts {
  Transformer& model;   // the whole model; the stage computes with and updates only its chunk
  AuxHeads& heads;      // every chunk's head (drawn alike on every rank); this stage uses head(stage)
  NamedTensors params;  // what the stage updates: pipeline::stage_params(...) + its head's parameters
  AdamW& optimizer;     // over `params`
  BatchLoader& loader;
  pipeline::PipelineGroups groups;
  comm::LaggedReduce* report = nullptr;  // over the pipeline; its lag is the queue's length in steps
  ChunkPlan plan;
  int64_t stage = 0;
  int64_t micro_batches = 1;
  double aux_weight = 1.0;
  torch::Device device = torch::kCPU;
  double grad_clip = 0;
  pipeline::Wire wire = pipeline::Wire::Fp32;
  std::vector<double> lr_scale;  // per chunk, multiplies the step's lr (a tied embedding: the first chunk's); {} = 1
};

class LocalStage : public TrainStep {
 public:
  explicit LocalStage(LocalStageParts parts);
  // Every stage returns the same result, `report->lag()` steps late: the model head's loss, every chunk's loss and
  // stage's step time and bytes forward, the norm of all gradients.
  StepResult run(int64_t step, double lr) override;
  std::vector<StepResult> drain() override;
  // The micro-batches without the optimizer: gradients are left on `params` (reduced); returns this chunk's loss.
  double forward_backward(int64_t step);
  pipeline::PipelineStats take_stats() { return std::exchange(stats_, {}); }

 private:
  torch::Tensor receive(int kind, int64_t step, int64_t mb, int peer);
  void send(const torch::Tensor& t, int kind, int64_t step, int64_t mb, int peer);
  void take_overlap_gradients(int64_t step, std::vector<torch::Tensor>& outputs);
  void retire_sends(int64_t oldest_kept_step);
  StepResult result_of(const std::vector<double>& shared, int64_t step) const;

  LocalStageParts p_;
  bool first_, last_;
  int64_t micro_ = 0;
  std::vector<NamedTensors> clip_groups_;  // this chunk's, then the tied embedding's (first and last stage)
  torch::Tensor batch_;
  struct InFlight {  // a send and its buffer, alive until it completed
    int64_t step;
    torch::Tensor buffer;
    comm::PendingCollective work;
  };
  std::deque<InFlight> in_flight_;
  pipeline::PipelineStats stats_;
  int64_t last_step_ = -1;
};

}  // namespace tributary::local
