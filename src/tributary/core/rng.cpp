#include "tributary/core/rng.h"

#include <numeric>
#include <utility>

namespace tributary {

std::vector<uint64_t> permutation(uint64_t n, uint64_t seed) {
  std::vector<uint64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  SplitMix64 rng(seed);
  for (uint64_t i = n; i > 1; --i) std::swap(order[i - 1], order[rng.below(i)]);
  return order;
}

}  // namespace tributary
