// The rows of shard `index` of `count` when `rows` rows are cut as torch.chunk cuts them: ceil(rows / count) per
// shard, the last ones shorter or empty. The one rule ZeRO-1's optimizer shards (optim/adamw.h) and the islands'
// outer-exchange shards (parallel/row_shards.h) share. No LibTorch.
#pragma once

#include <algorithm>
#include <cstdint>

namespace tributary {

struct RowRange {
  int64_t begin = 0, rows = 0;
};

inline RowRange row_split(int64_t rows, int64_t index, int64_t count) {
  const int64_t per = (rows + count - 1) / count;
  const int64_t begin = std::min(rows, index * per);
  return {begin, std::min(rows, begin + per) - begin};
}

}  // namespace tributary
