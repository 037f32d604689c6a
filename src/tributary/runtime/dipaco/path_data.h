// A DiPaCo path's data: its routed shard from the routes directory (written by `tributary route`).
#pragma once

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "tributary/config/run_config.h"
#include "tributary/core/fs.h"
#include "tributary/model/path_grid.h"

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
// Every path's shard from dipaco.routes, refused naming the key when it was routed for another grid or context; sets
// model.vocab_size from the data when it is 0.
std::vector<PathData> load_routed_paths(RunConfig& config, const PathGrid& grid);

}  // namespace tributary
