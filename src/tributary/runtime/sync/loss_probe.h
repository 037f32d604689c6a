// dist.score = "loss": the model a robust exchange judges DiLoCo's updates with (optim/update_probe.h). It holds its
// own instance of the model's architecture, since the training model belongs to the training thread, and the
// training split's tokens: a probe batch is `windows` windows drawn anywhere in the split by the round's seed, which
// depends on every update of the round (optim/resilient_average.h), so no sender could have trained for it.
//
// Cost per evaluating rank and round: 1 + dist.probe_evaluators forward passes of `windows` windows, and one copy of
// the model's parameters (plus its activations for `windows` windows).
#pragma once

#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tributary/model/config.h"
#include "tributary/model/tensor_io.h"
#include "tributary/model/transformer.h"
#include "tributary/optim/update_probe.h"

namespace tributary {

class LossProbe : public UpdateProbe {
 public:
  // `globals`: the round's start model (the outer loop's global parameters, in the order its pseudo-gradient is
  // flattened), read on the communication thread while the training thread waits for the round; empty outside
  // DiLoCo's phase. Parameters it names that the model lacks (auxiliary heads) are skipped.
  // `strata`: the token streams the windows are drawn from, one after another (the whole training split; with
  // data.shards = "domains" one stream per domain, so that every domain's replicas are judged on a batch that holds
  // their kind of text as much as any other's: max(windows, strata) windows then).
  LossProbe(const ModelConfig& model, const torch::Device& device,
            std::vector<std::shared_ptr<const std::vector<uint32_t>>> strata, int64_t windows,
            std::function<NamedTensors()> globals);

  bool applies(int64_t numel) const override;
  std::vector<double> losses(const std::vector<const torch::Tensor*>& updates, double step, uint64_t seed) override;

 private:
  torch::Tensor windows_of(uint64_t seed) const;  // (windows, context + 1) int64 token ids

  torch::Device device_;
  std::vector<std::shared_ptr<const std::vector<uint32_t>>> strata_;
  int64_t windows_;
  int64_t context_;
  std::function<NamedTensors()> globals_;
  std::shared_ptr<Transformer> model_;
  std::map<std::string, torch::Tensor> params_;  // model_'s, by name
};

}  // namespace tributary
