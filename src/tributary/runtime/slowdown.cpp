#include "tributary/runtime/slowdown.h"

#include <chrono>
#include <cstdlib>
#include <thread>

#include "tributary/core/error.h"
#include "tributary/core/number_list.h"

namespace tributary {

std::map<int, double> parse_slow_workers(const std::string& spec) {
  std::map<int, double> out;
  for (const std::string& entry : split_list(spec)) {
    const size_t colon = entry.find(':');
    char* rank_end = nullptr;
    char* factor_end = nullptr;
    const long rank = colon == std::string::npos ? -1 : std::strtol(entry.c_str(), &rank_end, 10);
    const double factor = colon == std::string::npos ? 0 : std::strtod(entry.c_str() + colon + 1, &factor_end);
    if (colon == std::string::npos || rank_end != entry.c_str() + colon || rank < 0 || *factor_end != '\0' ||
        !(factor >= 1 && factor <= 100))
      fail(
          "dist.slow_workers = '{}': '{}' is not RANK:FACTOR with a rank >= 0 and a factor in [1, 100] (e.g. '1:3' "
          "makes worker 1 three times slower)",
          spec, entry);
    if (out.count(static_cast<int>(rank))) fail("dist.slow_workers = '{}' names worker {} twice", spec, rank);
    out[static_cast<int>(rank)] = factor;
  }
  return out;
}

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
