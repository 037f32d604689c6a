#include "tributary/runtime/outer_auto.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <vector>

namespace tributary {

std::string resolve_outer_auto(DistConfig& dist, int64_t steps, bool islands) {
  if (dist.ramp_steps < 0) dist.ramp_steps = 0;
  const bool auto_warmup = dist.warmup_ddp_steps < 0, auto_momentum = dist.outer_momentum < 0;
  if (!auto_warmup && !auto_momentum) return "";
  const int64_t h = std::max<int64_t>(1, dist.inner_steps);
  constexpr int64_t kFewOuterSteps = 20;
  if (auto_warmup) dist.warmup_ddp_steps = steps / h < kFewOuterSteps && !islands ? steps / 3 : 0;
  const double outer_steps = double(std::max<int64_t>(0, steps - dist.warmup_ddp_steps)) / double(h);
  if (auto_momentum) dist.outer_momentum = outer_steps > 0 ? std::clamp(1.0 - 10.0 / outer_steps, 0.5, 0.9) : 0.5;
  std::vector<std::string> chosen;
  if (auto_warmup) chosen.push_back(fmt::format("{} data-parallel warm-up steps", dist.warmup_ddp_steps));
  if (auto_momentum) chosen.push_back(fmt::format("outer momentum {:.3g}", dist.outer_momentum));
  return fmt::format("DiLoCo settings from the run ({} steps, H = {}: {:.0f} outer steps{}): {}", steps, h, outer_steps,
                     dist.warmup_ddp_steps > 0 ? " after the warm-up" : "", fmt::join(chosen, ", "));
}

}  // namespace tributary
