// Local parallelism across processes (reference pipeline-and-local.md §2.5): each pipeline stage is one chunk, behind
// the step seam (parallel/train_step.h). Per micro-batch a stage receives its input activation, runs its blocks,
// sends the output on at once (before its own loss), then computes its chunk's loss with its auxiliary head (the last
// stage: the model's head), backpropagates and accumulates. No gradient crosses a stage boundary in `chunked` mode.
// `overlapping` (synchronous): a stage sends the gradient of its loss at its input back to the previous stage, which
// backpropagates it through its last overlap blocks at the end of the step, after all of its own micro-batches.
// Then the stage's gradient reduction (pipeline/stage_gradients.h: tied embedding, data-parallel replicas), each
// chunk's clipping (local/chunks.h clip_groups) and the AdamW step. One small all-reduce per step over the pipeline
// shares the chunks' losses and gradient norms for the report. Every stage reads the same batch (same loader seed and
// position), so the targets need not travel.
#pragma once

#include <torch/torch.h>

#include "tributary/comm/group.h"
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
  Transformer& model;     // the whole model; the stage computes with and updates only its chunk
  AuxHeads& heads;        // every chunk's head (drawn alike on every rank); this stage uses head(stage)
  NamedTensors params;    // what the stage updates: pipeline::stage_params(...) + its head's parameters
  AdamW& optimizer;       // over `params`
  BatchLoader& loader;
  pipeline::PipelineGroups groups;
  ChunkPlan plan;
  int64_t stage = 0;
  int64_t micro_batches = 1;
  double aux_weight = 1.0;
  torch::Device device = torch::kCPU;
  double grad_clip = 0;
  bool tied_embeddings = true;
  pipeline::Wire wire = pipeline::Wire::Fp32;
};

class LocalStage : public TrainStep {
 public:
  explicit LocalStage(LocalStageParts parts);
  // Every stage returns the same result: the model head's loss, every chunk's loss, the norm of all gradients.
  StepResult run(int64_t step, double lr) override;
  // The micro-batches without the optimizer: gradients are left on `params` (reduced); returns this chunk's loss.
  double forward_backward(int64_t step);
  pipeline::PipelineStats take_stats() { return std::exchange(stats_, {}); }

 private:
  torch::Tensor receive(int kind, int64_t step, int64_t mb, int peer);
  void send(const torch::Tensor& t, int kind, int64_t step, int64_t mb, int peer);
  void take_overlap_gradients(int64_t step, std::vector<torch::Tensor>& outputs);

  LocalStageParts p_;
  bool first_, last_;
  int64_t micro_ = 0;
  std::vector<NamedTensors> clip_groups_;  // this chunk's, then the tied embedding's (first and last stage)
  torch::Tensor batch_;
  std::vector<torch::Tensor> send_buffers_;
  std::vector<comm::PendingCollective> sends_;
  pipeline::PipelineStats stats_;
};

}  // namespace tributary::local
