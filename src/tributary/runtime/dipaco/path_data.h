// A DiPaCo path's data: its routed shard from the routes directory (written by `tributary route`).
#pragma once

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "tributary/core/fs.h"
#include "tributary/runtime/run_config.h"

namespace tributary {

// A path's routed shard: training stream (units of T+1 tokens) and the held-out slice for early stopping.
struct PathData {
  std::shared_ptr<const std::vector<uint32_t>> train;
  torch::Tensor holdout;  // (H, T+1)
  double weight = 0;      // w_p: training tokens of the shard
  int64_t vocab_size = 0;
};

// Loads path `path`'s shard; an Error names the shard and what to change when it holds less than one batch.
PathData load_path_data(const fs::path& routes, int64_t path, const RunConfig& config);

}  // namespace tributary
