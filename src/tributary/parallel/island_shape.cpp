#include "tributary/parallel/island_shape.h"

#include <algorithm>
#include <numeric>

namespace tributary {

IslandShape::IslandShape(std::vector<int64_t> sizes, std::vector<int64_t> steps, int rank)
    : sizes_(std::move(sizes)), steps_(std::move(steps)), rank_(rank) {
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

int64_t IslandShape::outer_shards() const { return *std::min_element(sizes_.begin(), sizes_.end()); }

std::vector<int> IslandShape::outer_shard_ranks() const {
  std::vector<int> out;
  if (outer_shard() < 0) return out;
  for (int64_t i = 0; i < count(); ++i) out.push_back(begin(i) + int(outer_shard()));
  return out;
}

int64_t IslandShape::batches_per_tick() const {
  int64_t batches = 0;
  for (size_t i = 0; i < sizes_.size(); ++i) batches += sizes_[i] * steps_[i];
  return batches;
}

}  // namespace tributary
