#include "tributary/config/slow_workers.h"

#include <cstdlib>

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

}  // namespace tributary
