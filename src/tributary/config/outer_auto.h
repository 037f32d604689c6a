// DiLoCo's outer settings chosen from the run itself: -1 in dist.outer_lr, dist.outer_momentum or
// dist.warmup_ddp_steps means "auto" (configs/diloco.toml ships them so). Why: the paper's outer Nesterov (lr 0.7,
// momentum 0.9) was tuned for thousands of outer steps of H = 500 from a pre-trained model. From scratch, with tens
// of outer steps of a few inner steps each, momentum overshoots: at 300 steps x 4 workers, H = 10, plain averaging
// is 8% behind data parallel, momentum 0.67 14%, and H = 5 with 0.83 34% (docs/benchmarks.md §22); plain averaging
// was also the best measured after pre-training (§4.1) and at H = 30 (§13.1).
//   outer    plain averaging (lr 1, momentum 0; FedAvg) for a run of fewer than 1,000 outer steps, else the
//            paper's lr 0.7 and momentum 0.9 (measured up to 150 outer steps; the threshold is the paper's regime);
//   warm-up  a third of the steps as data parallel when the run has fewer than 20 outer steps, else none; none with
//            islands (it would cross the slow link they avoid). Its bytes are data parallel's, which is why the
//            shipped config takes short rounds instead (H = 10, int8: ~40x fewer bytes than data parallel).
// Explicit values (>= 0) are kept. No LibTorch.
#pragma once

#include <cstdint>
#include <string>

#include "tributary/config/run_config.h"

namespace tributary {

// Replaces the -1s of `dist` by the values above for a run of `steps` steps; returns a line saying what was chosen
// and why ("" when nothing was auto), which the lead prints at start-up.
std::string resolve_outer_auto(DistConfig& dist, int64_t steps, bool islands = false);

// How many outer steps a run of `steps` steps takes with `dist`'s warm-up and round lengths (the ramp; not QSR).
int64_t count_rounds(const DistConfig& dist, int64_t steps);

}  // namespace tributary
