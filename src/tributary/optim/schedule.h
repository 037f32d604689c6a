// Learning-rate schedule: linear warm-up to the peak, then cosine decay to peak * min_lr_ratio at the last step.
// A pure function of the step, so resuming from a checkpoint needs no schedule state.
#pragma once

#include <cstdint>

namespace tributary {

struct CosineSchedule {
  double peak_lr;
  int64_t warmup_steps;
  int64_t total_steps;
  double min_lr_ratio;

  double lr(int64_t step) const;  // step counts from 0; lr used by the step-th optimizer update
};

}  // namespace tributary
