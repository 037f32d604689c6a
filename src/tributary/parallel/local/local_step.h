// Local parallelism in one process (the compute-efficiency study), behind the step seam (parallel/train_step.h):
// every chunk of the model runs the chunk protocol (chunks.h) on each micro-batch, then each chunk's gradients are
// clipped on their own and AdamW steps every parameter, the auxiliary heads' included. With one chunk this is the
// plain trainer's step, bit for bit.
#pragma once

#include <torch/torch.h>

#include "tributary/data/loader.h"
#include "tributary/model/aux_head.h"
#include "tributary/model/transformer.h"
#include "tributary/optim/adamw.h"
#include "tributary/parallel/local/chunks.h"
#include "tributary/parallel/train_step.h"

namespace tributary::local {

struct LocalStepParts {
  Transformer& model;
  AuxHeads& heads;
  AdamW& optimizer;  // over the model's and the heads' parameters
  BatchLoader& loader;
  ChunkPlan plan;
  double aux_weight = 1.0;  // weight of each auxiliary loss; the model's head weighs 1
  torch::Device device = torch::kCPU;
  int64_t grad_accum = 1;
  double grad_clip = 0;
  std::vector<double> lr_scale;  // per chunk, multiplies the step's lr (a tied embedding: the first chunk's); {} = 1
};

class LocalStep : public TrainStep {
 public:
  explicit LocalStep(LocalStepParts parts);
  // StepResult.loss is the model's head (the last chunk's); chunk_losses every chunk's, the last included.
  StepResult run(int64_t step, double lr) override;

 private:
  LocalStepParts p_;
  std::vector<NamedTensors> groups_;
  std::vector<double> weights_;
  torch::Tensor batch_;  // (B, T+1) host buffer
};

}  // namespace tributary::local
