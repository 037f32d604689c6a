#include "tributary/optim/schedule.h"

#include <algorithm>
#include <cmath>

namespace tributary {

double CosineSchedule::lr(int64_t step) const {
  if (warmup_steps > 0 && step < warmup_steps) return peak_lr * static_cast<double>(step + 1) / warmup_steps;
  const int64_t decay_steps = std::max<int64_t>(1, total_steps - warmup_steps);
  double progress = std::clamp(static_cast<double>(step - warmup_steps) / decay_steps, 0.0, 1.0);
  double cosine = 0.5 * (1.0 + std::cos(M_PI * progress));
  return peak_lr * (min_lr_ratio + (1.0 - min_lr_ratio) * cosine);
}

}  // namespace tributary
