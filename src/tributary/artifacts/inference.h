// Loading a model (config + weights + tokenizer) from a checkpoint, and the device of a run. Evaluation and
// sampling are model/eval.h.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>

#include "tributary/config/run_config.h"
#include "tributary/core/fs.h"
#include "tributary/core/progress.h"
#include "tributary/data/loader.h"
#include "tributary/data/tokenizer.h"
#include "tributary/model/eval.h"
#include "tributary/model/transformer.h"

namespace tributary {

struct EvalResult {
  double loss = 0;  // mean next-token cross-entropy (nats)
  int64_t num_tokens = 0;
};
// Mean loss over `num_batches` batches of `loader` (no gradients); `progress` (optional) advances by one per batch.
EvalResult evaluate(Transformer& model, BatchLoader& loader, int64_t num_batches, const torch::Device& device,
                    Progress* progress = nullptr);

torch::Device parse_device(const std::string& spec);  // Error naming train.device when invalid or unavailable

struct LoadedModel {
  RunConfig config;
  std::shared_ptr<Transformer> model;
  std::unique_ptr<Tokenizer> tokenizer;
  int64_t step = 0;
  fs::path dir;  // the checkpoint directory it came from
};
// `path`: a checkpoint directory or a run directory (its latest checkpoint).
LoadedModel load_model(const std::string& path, const torch::Device& device);

}  // namespace tributary
