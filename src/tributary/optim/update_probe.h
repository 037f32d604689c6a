// Covenant's Gauntlet on the receiving side (dist.score = "loss"): what one update alone does to the loss of the
// round's start model, on a batch its sender could not choose. The update is applied at its weight in the round's
// mean (1/n of it): one replica's whole pseudo-gradient overshoots — its inner steps fit its own batches, and honest
// updates applied whole "raised" the probe's loss in 5 of 12 measurements, at 1/n in 1 (docs/benchmarks.md §51). The
// runtime implements it, since it holds a model and the data (runtime/sync/loss_probe.h); the jury
// (optim/probe_jury.h) calls it on the communication thread inside the robust exchange, while the training thread
// waits for the round.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace tributary {

class UpdateProbe {
 public:
  virtual ~UpdateProbe() = default;
  // Whether an exchange of `numel` values is one this probe can judge (the whole model's pseudo-gradient, in the
  // outer loop's order); false for a data-parallel warm-up's gradients.
  virtual bool applies(int64_t numel) const = 0;
  // The mean loss, on the windows drawn from `seed`, of the round's start model minus `step` x each update (nullptr:
  // the start model itself). Every evaluator that draws the same seed reads the same windows.
  virtual std::vector<double> losses(const std::vector<const torch::Tensor*>& updates, double step, uint64_t seed) = 0;
};

}  // namespace tributary
