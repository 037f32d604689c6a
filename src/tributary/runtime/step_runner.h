// DenseStep, the step of the whole model in one process (plus the replicas' gradient averaging for data parallel),
// behind the step seam (parallel/train_step.h).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>

#include "tributary/data/loader.h"
#include "tributary/model/tensor_io.h"
#include "tributary/model/transformer.h"
#include "tributary/optim/adamw.h"
#include "tributary/parallel/train_step.h"

namespace tributary {

class ReplicaRounds;

struct DenseStepParts {
  Transformer& model;
  NamedTensors& params;
  AdamW& optimizer;
  BatchLoader& loader;
  ReplicaRounds* sync = nullptr;  // data parallel: gradients averaged before the optimizer step
  torch::Device device = torch::kCPU;
  int64_t grad_accum = 1;
  double grad_clip = 0;
  bool bf16 = false;  // train.precision = bf16: the forward pass under autocast (model/autocast.h)
  // train.cuda_graph: the step captured once and replayed (runtime/step_graph.h) whenever the replicas do not average
  // gradients that step. Every parameter then has a gradient from the start (zeros before the first backward).
  bool cuda_graph = false;
};

// The loss of one (B, T+1) token batch on its device: the forward pass under autocast when `bf16` (fp32 master
// weights), the cross-entropy in fp32. The dense step's, and what a measured pace times (runtime/step_seconds.h).
torch::Tensor next_token_loss(Transformer& model, const torch::Tensor& tokens, bool bf16);

// next micro-batch -> forward (bf16 under autocast when asked) -> fp32 loss -> backward (x grad_accum) -> average
// gradients -> clip -> AdamW step.
class DenseStep : public TrainStep {
 public:
  explicit DenseStep(DenseStepParts parts);
  ~DenseStep() override;
  StepResult run(int64_t step, double lr) override;

 private:
  struct Graphed;  // cuda_graph: the graph and the tensors it reads and writes
  StepResult run_graphed(int64_t step, double lr);
  void graphed_body();  // device work only: what the graph captures

  DenseStepParts p_;
  torch::Tensor batch_;  // (B, T+1) host buffer
  std::unique_ptr<Graphed> graphed_;
};

}  // namespace tributary
