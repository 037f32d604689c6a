// The step seam (torchtitan's train_step -> forward_backward_step): the training loop asks a TrainStep for one
// optimizer step and does not know how it is computed. DenseStep is the whole model in one process (plus the
// replicas' gradient averaging for data parallel); a pipeline stage (only the last stage has a loss) and a
// local-parallel step (auxiliary heads, no backward messages) are other implementations of the same interface.
#pragma once

#include <torch/torch.h>

#include <cstdint>

#include "tributary/data/loader.h"
#include "tributary/model/tensor_io.h"
#include "tributary/model/transformer.h"
#include "tributary/optim/adamw.h"

namespace tributary {

class Replicas;

struct StepResult {
  double loss = 0;       // mean over the step's micro-batches (this replica)
  double grad_norm = 0;  // before clipping
};

class TrainStep {
 public:
  virtual ~TrainStep() = default;
  // Takes optimizer step number `step` (0-based) at learning rate `lr`. Throws Error when the loss is not finite.
  virtual StepResult run(int64_t step, double lr) = 0;
};

struct DenseStepParts {
  Transformer& model;
  NamedTensors& params;
  AdamW& optimizer;
  BatchLoader& loader;
  Replicas* replicas = nullptr;  // data parallel: gradients averaged before the optimizer step
  torch::Device device = torch::kCPU;
  int64_t grad_accum = 1;
  double grad_clip = 0;
};

// next micro-batch -> forward -> loss -> backward (x grad_accum) -> average gradients -> clip -> AdamW step.
class DenseStep : public TrainStep {
 public:
  explicit DenseStep(DenseStepParts parts);
  StepResult run(int64_t step, double lr) override;

 private:
  DenseStepParts p_;
  torch::Tensor batch_;  // (B, T+1) host buffer
};

}  // namespace tributary
