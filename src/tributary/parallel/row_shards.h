// Row shards: tensors cut along dim 0 into `count` shards of ceil(rows / count) rows (the last ones shorter or empty,
// torch.chunk's split), shard `index` being this rank's. ZeRO-1 inside an island keeps and steps one shard of the
// AdamW moments per rank; the islands' sharded outer exchange sends one shard of the pseudo-gradient per rank. A
// shard of a contiguous tensor is a contiguous view, so a shard's update lands in the tensor itself.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "tributary/comm/group.h"
#include "tributary/core/row_split.h"
#include "tributary/model/tensor_io.h"

namespace tributary {

class RowShards {
 public:
  RowShards(int64_t index, int64_t count);

  int64_t index() const { return index_; }
  int64_t count() const { return count_; }
  torch::Tensor mine(const torch::Tensor& t) const;  // this shard's rows of `t`: a view
  // This shard's rows of each tensor, under the same names; tensors of which this shard holds no row are left out.
  NamedTensors mine(const NamedTensors& tensors) const;
  // Whole tensors in which each rank has its own shard current: afterwards every rank's are current everywhere.
  // Collective over `group`, whose rank r holds shard r (ranks >= count() hold none and only receive). CPU buffers
  // on the wire; the tensors may live on any device.
  void all_gather(comm::Group& group, const std::vector<torch::Tensor>& tensors) const;

 private:
  int64_t index_, count_;
};

}  // namespace tributary
