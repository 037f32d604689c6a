// DiLoCo's outer settings chosen from the run itself: dist.outer_momentum = -1 and dist.warmup_ddp_steps = -1 mean
// "auto" (configs/diloco.toml ships them so). Why: an outer step with momentum 0.9 remembers ~10 earlier ones, more
// than a short run has; from scratch at 300 steps x 4 workers with H = 50 the paper's 0.9 is 22% behind data
// parallel, 0.5 after a 100-step data-parallel warm-up about 5% (docs/benchmarks.md §4.1, §15), while long runs
// keep the paper's 0.9.
//   warm-up  a third of the steps as data parallel when the run would take fewer than 20 outer steps, else none;
//            none with islands (parallel.islands: the warm-up would cross the slow link they avoid);
//   momentum 1 - 10 / K for the K outer steps after the warm-up, within [0.5, 0.9]: its memory, 1 / (1 - momentum)
//            outer steps, at most a tenth of the run.
// Explicit values (>= 0) are kept. No LibTorch.
#pragma once

#include <cstdint>
#include <string>

#include "tributary/runtime/run_config.h"

namespace tributary {

// Replaces the -1s of `dist` by the values above for a run of `steps` steps; returns a line saying what was chosen
// and why ("" when nothing was auto), which the lead prints at start-up.
std::string resolve_outer_auto(DistConfig& dist, int64_t steps, bool islands = false);

}  // namespace tributary
