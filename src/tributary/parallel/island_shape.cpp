#include "tributary/parallel/island_shape.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace tributary {

IslandShape::IslandShape(std::vector<int64_t> sizes, std::vector<int64_t> steps, int rank, bool measured,
                         bool leads_exchange)
    : sizes_(std::move(sizes)),
      steps_(std::move(steps)),
      rank_(rank),
      measured_(measured),
      leads_exchange_(leads_exchange) {
  while (island_ + 1 < count() && begin(island_ + 1) <= rank_) ++island_;
}

int IslandShape::begin(int64_t island) const {
  int begin = 0;
  for (int64_t i = 0; i < island && i < count(); ++i) begin += int(sizes_[size_t(i)]);
  return begin;
}

std::vector<int> IslandShape::ranks() const {
  std::vector<int> out(size_t(size(island_)));
  std::iota(out.begin(), out.end(), begin(island_));
  return out;
}

bool IslandShape::equal() const {
  return std::all_of(sizes_.begin(), sizes_.end(), [&](int64_t n) { return n == sizes_[0]; });
}

int64_t IslandShape::outer_shards() const {
  return leads_exchange_ ? 1 : *std::min_element(sizes_.begin(), sizes_.end());
}

std::vector<int> IslandShape::outer_shard_ranks() const {
  std::vector<int> out;
  if (outer_shard() < 0) return out;
  for (int64_t i = 0; i < count(); ++i) out.push_back(begin(i) + int(outer_shard()));
  return out;
}

std::vector<int64_t> IslandShape::paced_steps(const std::vector<double>& seconds) const {
  std::vector<double> island(sizes_.size(), 0.0);
  for (int64_t i = 0; i < count(); ++i)
    for (int r = begin(i); r < begin(i) + int(size(i)) && r < int(seconds.size()); ++r)
      island[size_t(i)] = std::max(island[size_t(i)], seconds[size_t(r)]);
  const double slowest = *std::max_element(island.begin(), island.end());
  std::vector<int64_t> steps;
  for (double t : island) {
    const double ratio = t > 0 ? slowest / t : 1.0;
    steps.push_back(std::clamp<int64_t>(std::llround(ratio), 1, kMaxPacedSteps));
  }
  return steps;
}

int64_t IslandShape::batches_per_tick() const {
  int64_t batches = 0;
  for (size_t i = 0; i < sizes_.size(); ++i) batches += sizes_[i] * steps_[i];
  return batches;
}

}  // namespace tributary
