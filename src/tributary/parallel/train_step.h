// The step seam (torchtitan's train_step -> forward_backward_step): the training loop asks a TrainStep for one
// optimizer step and does not know how it is computed. DenseStep (runtime/step_runner.h) is the whole model in one
// process; a pipeline stage (parallel/pipeline/pipeline_step.h: only the last stage has a loss) and a local-parallel
// step (auxiliary heads, no backward messages) are other implementations of the same interface.
#pragma once

#include <cstdint>
#include <vector>

namespace tributary {

struct StepResult {
  double loss = 0;                   // mean over the step's micro-batches (this replica)
  double grad_norm = 0;              // before clipping
  std::vector<double> chunk_losses;  // local parallelism: each chunk's own loss (the last is the model's head)
  std::vector<double> stage_step_s, stage_bytes_forward;  // local stages: each stage's step seconds and bytes sent on
  // A step whose stages run ahead of each other learns its numbers late: they are those of the step `lag` steps
  // before this one, or none yet (reported = false).
  int64_t lag = 0;
  bool reported = true;
};

class TrainStep {
 public:
  virtual ~TrainStep() = default;
  // Takes optimizer step number `step` (0-based) at learning rate `lr`. Throws Error when the loss is not finite.
  virtual StepResult run(int64_t step, double lr) = 0;
  // The results still owed at the end of the run (steps that report late), oldest first.
  virtual std::vector<StepResult> drain() { return {}; }
};

}  // namespace tributary
