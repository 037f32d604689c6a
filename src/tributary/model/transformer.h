// Decoder-only transformer built as levels of modules (shared/design/ARCHITECTURE.md): level l holds one module (a run
// of consecutive blocks) chosen by the path; a dense model is the path {0, 0, ..., 0}. Parameter names are stable keys
// that say which module they belong to, e.g. "levels.1.modules.0.blocks.2.attn.qkv.weight", so each module can be
// averaged, checkpointed and shipped on its own.
//
// Shape legend: B batch, T time (<= context), C width, H heads, D head dim (C/H), F MLP hidden, V vocab.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "tributary/model/config.h"

namespace tributary {

class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t width, double eps);
  torch::Tensor forward(const torch::Tensor& x);  // (..., C) -> (..., C)
  torch::Tensor weight;                           // (C)

 private:
  double eps_;
};

// RoPE's inverse frequencies theta^(-2i/D), i < D/2 (float64), rescaled as model.rope_scaling says.
torch::Tensor rope_frequencies(const ModelConfig& config);

class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const ModelConfig& config);
  // x: (B, T, C); rope_cos/sin: (>= T, D) or undefined. Attention is causal.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& rope_cos, const torch::Tensor& rope_sin);
  torch::nn::Linear qkv{nullptr};   // ((H + 2 KV) D, C): rows [q | k | v]; KV = H but with grouped-query attention
  torch::nn::Linear proj{nullptr};  // (C, C)

 private:
  int64_t num_heads_, num_kv_heads_, head_dim_;
};

class MLPImpl : public torch::nn::Module {
 public:
  explicit MLPImpl(const ModelConfig& config);
  torch::Tensor forward(const torch::Tensor& x);  // (B, T, C) -> (B, T, C)
  torch::nn::Linear fc{nullptr};                  // swiglu: (2F, C) = [gate; up], gelu: (F, C)
  torch::nn::Linear proj{nullptr};                // (C, F)

 private:
  bool swiglu_;
};

class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const ModelConfig& config);
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& rope_cos, const torch::Tensor& rope_sin);
  std::shared_ptr<RMSNormImpl> attn_norm, mlp_norm;
  std::shared_ptr<AttentionImpl> attn;
  std::shared_ptr<MLPImpl> mlp;
};

// N(0, std) for the matrices, N(0, residual_std) for the residual output projections, norms at 1.
void init_block(BlockImpl& block, double std, double residual_std);

// One module of one level: blocks_per_level consecutive blocks.
class LevelModuleImpl : public torch::nn::Module {
 public:
  explicit LevelModuleImpl(const ModelConfig& config);
  std::vector<std::shared_ptr<BlockImpl>> blocks;
};

class Transformer : public torch::nn::Module {
 public:
  // path[l] = index of the module used at level l (empty: all zeros, the dense model).
  explicit Transformer(const ModelConfig& config, std::vector<int64_t> path = {});

  torch::Tensor forward(const torch::Tensor& tokens);  // (B, T) int64 -> logits (B, T, V)
  // The last block's output before the final norm (B, T, C): DiPaCo's routing feature is its mean over a prefix.
  torch::Tensor hidden(const torch::Tensor& tokens);
  // The same computation in pieces, for pipeline stages: forward = logits(blocks(embed(tokens), 0, num_layers)).
  torch::Tensor embed(const torch::Tensor& tokens);                   // (B, T) -> (B, T, C)
  torch::Tensor blocks(torch::Tensor x, int64_t begin, int64_t end);  // blocks [begin, end) in model order
  torch::Tensor logits(const torch::Tensor& x);                       // final norm + head: (B, T, C) -> (B, T, V)
  // Mean next-token cross-entropy; targets (B, T) int64.
  static torch::Tensor loss(const torch::Tensor& logits, const torch::Tensor& targets);

  // Deterministic initialisation from the current torch seed: N(0, init_std) for matrices and embeddings,
  // scaled by 1/sqrt(2 * num_layers) for the residual output projections; norms at 1.
  void reset_parameters();

  const ModelConfig& config() const { return config_; }
  // RoPE tables (context, D), undefined with learned positions: blocks outside the model (auxiliary heads) use them.
  const torch::Tensor& rope_cos() const { return rope_cos_; }
  const torch::Tensor& rope_sin() const { return rope_sin_; }
  const std::vector<int64_t>& path() const { return path_; }
  int64_t num_parameters() const;
  // Parameters that take part in matrix multiplies (everything except norms, and the token embedding when untied).
  int64_t num_matmul_parameters() const;

 private:
  ModelConfig config_;
  std::vector<int64_t> path_;
  torch::nn::Embedding tok_embed{nullptr};                 // (V, C)
  torch::nn::Embedding pos_embed{nullptr};                 // (context, C), learned positions only
  std::vector<std::shared_ptr<LevelModuleImpl>> modules_;  // one per level, from the path
  std::shared_ptr<RMSNormImpl> final_norm;
  torch::nn::Linear head{nullptr};     // (V, C), untied only
  torch::Tensor rope_cos_, rope_sin_;  // (context, D) buffers
};

}  // namespace tributary
