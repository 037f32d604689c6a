#include "tributary/parallel/row_shards.h"

#include <algorithm>

#include "tributary/core/error.h"

namespace tributary {

RowShards::RowShards(int64_t index, int64_t count) : index_(index), count_(count) {
  TRIB_CHECK(count >= 1 && index >= 0 && index < count, "row shard {} of {}", index, count);
}

torch::Tensor RowShards::mine(const torch::Tensor& t) const {
  TRIB_CHECK(t.dim() >= 1, "a row shard of a scalar");
  const auto [begin, n] = row_split(t.size(0), index_, count_);
  return t.narrow(0, begin, n);
}

NamedTensors RowShards::mine(const NamedTensors& tensors) const {
  NamedTensors out;
  for (const auto& [name, t] : tensors) {
    auto view = mine(t);
    if (view.numel() > 0) out.emplace_back(name, view);
  }
  return out;
}

void RowShards::all_gather(comm::Group& group, const std::vector<torch::Tensor>& tensors) const {
  TRIB_CHECK(group.size() >= count_, "{} row shards over a group of {}", count_, group.size());
  // One flat buffer per rank: for each tensor, ceil(rows / count) rows (the shard's own, zero-padded).
  int64_t length = 0;
  for (const auto& t : tensors)
    length += (t.size(0) + count_ - 1) / count_ * (t.numel() / std::max<int64_t>(1, t.size(0)));
  torch::NoGradGuard no_grad;
  auto mine_flat = torch::zeros({length}, torch::kFloat32);
  const int self = group.rank();
  int64_t at = 0;
  for (const auto& t : tensors) {
    const int64_t row = t.numel() / std::max<int64_t>(1, t.size(0)), per = (t.size(0) + count_ - 1) / count_;
    if (self < count_) {
      const auto [begin, n] = row_split(t.size(0), self, count_);
      if (n > 0) mine_flat.narrow(0, at, n * row).copy_(t.narrow(0, begin, n).reshape({-1}));
    }
    at += per * row;
  }
  const std::vector<torch::Tensor> all = group.all_gather(mine_flat);
  for (int64_t r = 0; r < count_; ++r) {
    if (r == self) continue;
    at = 0;
    for (const auto& t : tensors) {
      const int64_t row = t.numel() / std::max<int64_t>(1, t.size(0)), per = (t.size(0) + count_ - 1) / count_;
      const auto [begin, n] = row_split(t.size(0), r, count_);
      if (n > 0) t.narrow(0, begin, n).copy_(all[size_t(r)].narrow(0, at, n * row).view(t.narrow(0, begin, n).sizes()));
      at += per * row;
    }
  }
}

}  // namespace tributary
