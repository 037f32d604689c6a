// DiPaCo's evaluation: one path serves each input, chosen by the router from the input's first 32 tokens.
#pragma once

#include <torch/torch.h>

#include <vector>

#include "tributary/core/fs.h"

namespace tributary {

struct RoutedEval {
  double loss = 0;
  int64_t num_tokens = 0;
  std::vector<int64_t> units_per_path;
  std::vector<double> loss_per_path;
};
// Routes every validation unit of the routes' source dataset to one path by its first 32 tokens and evaluates it on
// the tokens after them. max_units > 0 evaluates only the first max_units units.
// reroute_every = W > 0: re-route every W tokens after the prefix (the paper's option): the path for tokens
// [b, b + W) is chosen by the router from the 32 tokens before b, and scores them with the whole unit as context
// (a switch of path recomputes the context, as a new KV cache would).
RoutedEval evaluate_routed(const fs::path& run_dir, bool early_stopped, int64_t max_units, const torch::Device& device,
                           int64_t reroute_every = 0);

}  // namespace tributary
