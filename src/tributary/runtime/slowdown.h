// dist.slow_workers = "R:F[,R:F...]": worker R runs F times slower than it would, by sleeping (F - 1) x the measured
// compute time of each training step after it (the caller leaves out the time blocked on communication: a slower
// machine waiting for the others is not slower at waiting, and counting the wait would feed every worker's sleep into
// the others' when all are slowed). Emulates the unlike machines of a heterogeneous run on one machine (DiPaCo's
// task queue gives a slow worker fewer paths; DiLoCo and data parallel wait for it at every synchronisation), so
// that what heterogeneity costs each algorithm can be measured side by side. No LibTorch.
#pragma once

#include <string>

#include "tributary/config/slow_workers.h"

namespace tributary {

class Slowdown {
 public:
  // Error naming dist.slow_workers when a listed rank is not in [0, world_size).
  Slowdown(const std::string& spec, int rank, int world_size);
  double factor() const { return factor_; }
  void after_step(double step_seconds) const;  // sleeps (factor - 1) x step_seconds; nothing for factor 1

 private:
  double factor_ = 1;
};

}  // namespace tributary
