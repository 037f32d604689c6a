// One optimizer step of a pipeline stage (the TrainStep seam, parallel/train_step.h): the step's batch is cut into m
// micro-batches; the stage runs its schedule's action list (schedule.h): receive an activation, run its blocks, send
// the output on; receive the output's gradient, backpropagate, send the input's gradient back. Only the last stage
// has a loss (each micro-batch's token mean, scaled by 1/m, so the sum is the batch mean of the single-process
// model). Then, in the Megatron/DeepSpeed order: tied-embedding gradients summed between the first and last stage,
// the stage's data-parallel average (if any), the global gradient norm over the pipeline (the tied copy counted
// once), clipping, and the stage's AdamW step.
//
// Every stage of a pipeline reads the same batch (same loader seed and position): the first uses the tokens, the last
// the targets. Messages go through comm::Group point-to-point with its deadline; a dead or silent neighbour is a
// NetworkError naming the peer, the message kind, the step and the micro-batch.
#pragma once

#include <torch/torch.h>

#include <optional>

#include "tributary/comm/exchange.h"
#include "tributary/comm/group.h"
#include "tributary/data/loader.h"
#include "tributary/model/transformer.h"
#include "tributary/optim/adamw.h"
#include "tributary/parallel/pipeline/activation_deltas.h"
#include "tributary/parallel/pipeline/schedule.h"
#include "tributary/parallel/pipeline/stage.h"
#include "tributary/parallel/pipeline/wire.h"
#include "tributary/parallel/train_step.h"

namespace tributary::pipeline {

struct PipelineGroups {
  comm::Group* pipe = nullptr;  // this pipeline's stages; group rank = stage
  comm::Group* tie = nullptr;   // {first stage, last stage} when embeddings are tied and stages > 1; else null
  comm::Group* data = nullptr;  // this stage's replicas in the other pipelines (data parallel); null for one pipeline
  // Gradients are averaged over `data` in steps 0 .. data_parallel_steps - 1 only (DiLoCo per stage after a
  // data-parallel warm-up); -1: every step (data parallel).
  int64_t data_parallel_steps = -1;
  const comm::WireMac* mac = nullptr;  // the run's key: every message between stages carries its MAC (wire.h)
  // With the run's key, the tied embedding's and the replicas' gradient sums take these exchanges' sealed fp32 ring
  // (over `tie` and `data`; comm/wire_mac.h) instead of Gloo's all-reduce: the same sums (a + b for two ranks, bit for
  // bit), every hop with its MAC. Null: Gloo's all-reduce.
  comm::Exchange* tie_sealed = nullptr;
  comm::Exchange* data_sealed = nullptr;
  bool averaging(int64_t step) const {
    return data && data->size() > 1 && (data_parallel_steps < 0 || step < data_parallel_steps);
  }
};

struct PipelineStepParts {
  Transformer& model;   // the whole model; the stage computes with and updates only `params`
  NamedTensors params;  // stage_params(...)
  AdamW& optimizer;     // over `params`
  BatchLoader& loader;  // the pipeline's batches
  PipelineGroups groups;
  ScheduleSpec schedule;
  StageLayout layout;
  int64_t stage = 0;
  torch::Device device = torch::kCPU;
  double grad_clip = 0;
  Wire wire = Wire::Fp32;  // activations and activation gradients on the wire
  // aq4 / aq2: the most each boundary's cache of activations may hold (parallel.activation_cache_mb)
  int64_t activation_cache_bytes = int64_t{1} << 30;
  // dist.slow_workers: this stage's device is this many times slower; every forward and backward sleeps (factor - 1)
  // x its own compute time right after it, so the neighbours see a slow stage where a slow device would be.
  double slowdown = 1;
};

struct PipelineStats {
  int64_t activation_bytes = 0, gradient_bytes = 0;  // sent by this stage, as on the wire
  int64_t data_parallel_bytes = 0;  // the stage's gradient all-reduce, as a ring sends it: 2 (n-1)/n x the gradients
  double compute_s = 0, blocked_s = 0;  // forward/backward vs waiting for messages
  int64_t activation_cache_bytes = 0;   // aq4 / aq2: what this stage's caches hold now (activation_deltas.h)
};

class PipelineStep : public TrainStep {
 public:
  explicit PipelineStep(PipelineStepParts parts);
  StepResult run(int64_t step, double lr) override;
  // The step without the optimizer: gradients are left on `params` (summed over tied copies and averaged over
  // replicas); returns the batch loss (every stage). For tests against the single-process gradients.
  double forward_backward(int64_t step);
  PipelineStats take_stats();

 private:
  void execute(const Action& a, int64_t step);

  PipelineStepParts p_;
  std::vector<Action> actions_;
  torch::Tensor batch_;  // (B, T+1)
  int64_t micro_ = 0;    // micro-batch size
  bool first_, last_;
  // per micro-batch, this step
  std::vector<torch::Tensor> inputs_, outputs_, out_grads_, send_buffers_;
  std::vector<comm::PendingCollective> sends_;
  double loss_sum_ = 0;
  PipelineStats stats_;
  // aq4 / aq2: the caches of the boundary to the previous stage (what arrives) and to the next (what leaves)
  std::optional<ActivationDeltas> arriving_, leaving_;
  std::vector<uint64_t> example_keys(int64_t mb) const;  // the micro-batch's rows
};

}  // namespace tributary::pipeline
