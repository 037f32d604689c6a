// A sync unit: the parameters that are synchronised together, with their own outer optimizer (global copy +
// Nesterov momentum), the step they last synced at, and the exchange in flight. The whole model (DiLoCo), one
// Streaming DiLoCo fragment, or one DiPaCo module: only the reduction differs (an average across replicas, every
// replica holding `outer`; or DiPaCo's owner reductions, optim/owner_reducer.h, where only the module's owner holds
// `outer` and `params` is empty: the pseudo-gradients are accumulated per path outside the loop).
#pragma once

#include <torch/torch.h>

#include <future>
#include <memory>
#include <vector>

#include "tributary/optim/outer.h"

namespace tributary {

struct SyncUnit {
  std::vector<size_t> params;  // indices into the model's parameter list
  std::unique_ptr<OuterOptimizer> outer;
  int64_t last_sync = 0;
  // In flight (overlap): the averaged pseudo-gradient arrives through `pending`, to be applied at `apply_step`.
  std::future<std::vector<torch::Tensor>> pending;
  int64_t apply_step = -1;
  bool merge = false;  // sent with overlap: merge with the local progress instead of replacing it

  bool in_flight() const { return apply_step >= 0; }
};

}  // namespace tributary
