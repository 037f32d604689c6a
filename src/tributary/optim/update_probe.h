// Covenant's Gauntlet on the receiving side (dist.score = "loss"): what one update alone does to the loss of the
// round's start model, on a batch its sender could not choose. The update is applied at its weight in the round's
// mean (1/n of it): the whole pseudo-gradient of one replica overshoots — its 10 inner steps fit its own batches, and
// on other windows the replica's own model was often no better than the start model (measured: half the honest
// updates "raised" the loss at step 1, none at 1/n; docs/benchmarks.md §51). The runtime implements it, since it holds
// a model and the data (runtime/sync/loss_probe.h); the robust exchange (optim/resilient_average.h) calls it on the
// communication thread while the training thread waits for the round, and agrees the scores with the other evaluators
// there.
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
