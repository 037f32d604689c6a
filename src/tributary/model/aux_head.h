// Auxiliary heads of local parallelism (parallel/local/): chunk k < K-1 of the model ends in a private head that turns
// its output into next-token logits, so the chunk can learn from its own loss. A head is an RMSNorm and a projection
// to the vocabulary (shared/reference/pipeline-and-local.md §2.5 option a), optionally after 1-2 private transformer
// blocks (option b, reported to close most of the gap for language models). Heads never share the vocabulary matrix
// with the model or each other: keeping copies equal would add cross-chunk traffic. The last chunk uses the model's own
// head. Parameter names: "aux.<chunk>.blocks.<b>...", "aux.<chunk>.norm.weight", "aux.<chunk>.proj.weight".
#pragma once

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "tributary/model/config.h"
#include "tributary/model/transformer.h"

namespace tributary {

class AuxHeadImpl : public torch::nn::Module {
 public:
  AuxHeadImpl(const ModelConfig& config, int64_t num_blocks);
  // x: (B, T, C) -> logits (B, T, V); rope_cos/sin as the model's (Transformer::rope_cos()).
  torch::Tensor forward(torch::Tensor x, const torch::Tensor& rope_cos, const torch::Tensor& rope_sin);
  std::vector<std::shared_ptr<BlockImpl>> blocks;
  std::shared_ptr<RMSNormImpl> norm;
  torch::nn::Linear proj{nullptr};  // (V, C)
};

// The heads of chunks 0 .. chunks-2 (none for one chunk), initialised from the current torch seed like the model's
// blocks and head (draw them after the model, so the model's initialisation does not depend on them).
class AuxHeads : public torch::nn::Module {
 public:
  AuxHeads(const ModelConfig& config, int64_t chunks, int64_t blocks_per_head);
  AuxHeadImpl& head(int64_t chunk) { return *heads_.at(static_cast<size_t>(chunk)); }
  int64_t size() const { return static_cast<int64_t>(heads_.size()); }
  // Parameters in matmuls (for FLOPs) and the private blocks in all heads (their attention FLOPs).
  int64_t num_matmul_parameters() const;
  int64_t num_blocks() const;

 private:
  std::vector<std::shared_ptr<AuxHeadImpl>> heads_;
};

}  // namespace tributary
