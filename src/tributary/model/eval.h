// Evaluation and sampling on a model: DiPaCo's per-unit and per-token losses, generation (the mean loss over a
// data loader is artifacts/inference.h: model/ does not depend on data/).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "tributary/model/transformer.h"

namespace tributary {

// DiPaCo's evaluation protocol: units (N, T+1) int64; the loss counts only the tokens after the first `prefix` ones
// (the routing context), so routed and dense models are scored on the same tokens.
struct UnitLoss {
  double loss_sum = 0;  // nats
  int64_t num_tokens = 0;
  double mean() const { return num_tokens > 0 ? loss_sum / double(num_tokens) : 0.0; }
};
UnitLoss evaluate_units(Transformer& model, const torch::Tensor& units, int64_t prefix, const torch::Device& device,
                        int64_t batch = 32);
// Loss of every token from index `prefix` on: (N, T + 1 - prefix), column c = token prefix + c (CPU, float32).
torch::Tensor per_token_loss(Transformer& model, const torch::Tensor& units, int64_t prefix,
                             const torch::Device& device, int64_t batch = 32);

struct GenerateOptions {
  int64_t max_new_tokens = 200;
  double temperature = 0.8;  // 0: greedy
  int64_t top_k = 40;        // 0: full distribution
  uint64_t seed = 0;
  bool stop_at_eot = true;
};
// Samples a continuation of `prompt_ids` (the context window slides when it fills). Returns only the new ids.
std::vector<int32_t> generate(Transformer& model, const std::vector<int32_t>& prompt_ids, int32_t eot_id,
                              const GenerateOptions& options, const torch::Device& device);

}  // namespace tributary
