#include "tributary/runtime/slowdown.h"

#include <chrono>
#include <cstdlib>
#include <thread>

#include "tributary/core/error.h"
#include "tributary/core/number_list.h"

namespace tributary {

Slowdown::Slowdown(const std::string& spec, int rank, int world_size) {
  for (const auto& [r, factor] : parse_slow_workers(spec)) {
    if (r >= world_size)
      fail("dist.slow_workers = '{}' names worker {}, but the run has {} worker(s) (ranks 0-{})", spec, r, world_size,
           world_size - 1);
    if (r == rank) factor_ = factor;
  }
}

void Slowdown::after_step(double step_seconds) const {
  if (factor_ > 1 && step_seconds > 0)
    std::this_thread::sleep_for(std::chrono::duration<double>((factor_ - 1) * step_seconds));
}

}  // namespace tributary
