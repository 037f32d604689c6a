#include "tributary/routing/units.h"

#include <algorithm>

namespace tributary {

Units cut_units(const Dataset& dataset, const std::string& split, int64_t context) {
  const int64_t row = context + 1;
  std::vector<int64_t> ids;
  Units units;
  for (const Shard& shard : dataset.load_shards(split)) {
    const int64_t n = static_cast<int64_t>(shard.tokens.size()) / row;
    size_t doc = 0;
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t first = static_cast<uint64_t>(i * row);
      while (doc + 1 < shard.docs.size() && shard.docs[doc + 1].first_token <= first) ++doc;
      units.domain.push_back(shard.docs.empty() ? 0 : shard.docs[doc].domain);
      ids.insert(ids.end(), shard.tokens.begin() + first, shard.tokens.begin() + first + row);
    }
  }
  units.tokens = torch::tensor(ids, torch::kInt64).reshape({-1, row});
  return units;
}

}  // namespace tributary
