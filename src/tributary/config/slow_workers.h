// dist.slow_workers = "R:F[,R:F...]": the key's grammar (runtime/slowdown.h emulates the slow workers it names).
// No LibTorch.
#pragma once

#include <map>
#include <string>

namespace tributary {

// rank -> factor (> 1, at most 100); Error naming dist.slow_workers and the bad entry.
std::map<int, double> parse_slow_workers(const std::string& spec);

}  // namespace tributary
