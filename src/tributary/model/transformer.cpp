#include "tributary/model/transformer.h"

#include <cmath>

#include "tributary/core/error.h"
#include "tributary/model/causal_attention.h"
#include "tributary/model/fused_ops.h"

namespace tributary {

RMSNormImpl::RMSNormImpl(int64_t width, double eps) : eps_(eps) {
  weight = register_parameter("weight", torch::ones({width}));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) { return rms_norm(x, weight, eps_); }

torch::Tensor rope_frequencies(const ModelConfig& config) {
  const int64_t D = config.head_dim();
  auto inv_freq = torch::pow(config.rope_theta, -torch::arange(0, D, 2, torch::kFloat64) / double(D));
  if (config.rope_scaling == "linear") return inv_freq / config.rope_factor;
  if (config.rope_scaling != "llama3") return inv_freq;
  // transformers' _compute_llama3_parameters: wavelengths beyond the original context's low band are stretched by the
  // factor, those within its high band kept, those between blended linearly in original_context / wavelength.
  const double factor = config.rope_factor, low = config.rope_low_freq_factor, high = config.rope_high_freq_factor;
  const double original = double(config.rope_original_context);
  const auto wavelength = 2 * M_PI / inv_freq;
  auto scaled = torch::where(wavelength > original / low, inv_freq / factor, inv_freq);
  const auto smooth = (original / wavelength - low) / (high - low);
  const auto blended = (1 - smooth) * scaled / factor + smooth * scaled;
  const auto medium = (wavelength >= original / high).logical_and(wavelength <= original / low);
  return torch::where(medium, blended, scaled);
}

AttentionImpl::AttentionImpl(const ModelConfig& config)
    : num_heads_(config.num_heads), num_kv_heads_(config.kv_heads()), head_dim_(config.head_dim()) {
  const int64_t rows = (num_heads_ + 2 * num_kv_heads_) * head_dim_;  // [q | k | v]
  qkv = register_module("qkv", torch::nn::Linear(torch::nn::LinearOptions(config.width, rows).bias(config.qkv_bias)));
  proj = register_module("proj",
                         torch::nn::Linear(torch::nn::LinearOptions(num_heads_ * head_dim_, config.width).bias(false)));
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& rope_cos,
                                     const torch::Tensor& rope_sin) {
  const int64_t B = x.size(0), T = x.size(1), H = num_heads_, KV = num_kv_heads_, D = head_dim_;
  // q comes out pre-scaled by 1/sqrt(D); the attention computes only the causal (lower) triangle.
  auto [q, k, v] = split_heads_rope(qkv->forward(x), H, rope_cos, rope_sin, 1.0 / std::sqrt(double(D)), KV);
  auto y = grouped_causal_attention(q, k, v, B).view({B, H, T, D}).transpose(1, 2).reshape({B, T, H * D});
  return proj->forward(y);
}

MLPImpl::MLPImpl(const ModelConfig& config) : swiglu_(config.mlp == "swiglu") {
  const int64_t F = config.resolved_mlp_hidden();
  fc =
      register_module("fc", torch::nn::Linear(torch::nn::LinearOptions(config.width, swiglu_ ? 2 * F : F).bias(false)));
  proj = register_module("proj", torch::nn::Linear(torch::nn::LinearOptions(F, config.width).bias(false)));
}

torch::Tensor MLPImpl::forward(const torch::Tensor& x) {
  auto h = fc->forward(x);
  if (swiglu_) {
    h = swiglu(h);  // silu(gate) * up: (B, T, F)
  } else {
    h = torch::gelu(h);
  }
  return proj->forward(h);
}

BlockImpl::BlockImpl(const ModelConfig& config) {
  attn_norm = register_module("attn_norm", std::make_shared<RMSNormImpl>(config.width, config.norm_eps));
  attn = register_module("attn", std::make_shared<AttentionImpl>(config));
  mlp_norm = register_module("mlp_norm", std::make_shared<RMSNormImpl>(config.width, config.norm_eps));
  mlp = register_module("mlp", std::make_shared<MLPImpl>(config));
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x, const torch::Tensor& rope_cos, const torch::Tensor& rope_sin) {
  auto h = x + attn->forward(attn_norm->forward(x), rope_cos, rope_sin);
  return h + mlp->forward(mlp_norm->forward(h));
}

void init_block(BlockImpl& block, double std, double residual_std) {
  torch::NoGradGuard no_grad;
  block.attn->qkv->weight.normal_(0.0, std);
  if (block.attn->qkv->bias.defined()) block.attn->qkv->bias.zero_();
  block.attn->proj->weight.normal_(0.0, residual_std);
  block.mlp->fc->weight.normal_(0.0, std);
  block.mlp->proj->weight.normal_(0.0, residual_std);
  block.attn_norm->weight.fill_(1.0);
  block.mlp_norm->weight.fill_(1.0);
}

LevelModuleImpl::LevelModuleImpl(const ModelConfig& config) {
  auto list = register_module("blocks", std::make_shared<torch::nn::Module>());
  for (int64_t b = 0; b < config.blocks_per_level(); ++b)
    blocks.push_back(list->register_module(std::to_string(b), std::make_shared<BlockImpl>(config)));
}

Transformer::Transformer(const ModelConfig& config, std::vector<int64_t> path)
    : config_(config), path_(std::move(path)) {
  TRIB_CHECK(config.vocab_size > 0, "(resolve model.vocab_size from the dataset before building the model)");
  if (path_.empty()) path_.assign(static_cast<size_t>(config.num_levels), 0);
  if (static_cast<int64_t>(path_.size()) != config.num_levels)
    fail("path has {} entries but model.num_levels is {}", path_.size(), config.num_levels);
  const int64_t V = config.vocab_size, C = config.width, T = config.context;

  tok_embed = register_module("embed_tok", torch::nn::Embedding(V, C));
  if (config.positions == "learned") pos_embed = register_module("embed_pos", torch::nn::Embedding(T, C));
  auto levels = register_module("levels", std::make_shared<torch::nn::Module>());
  for (int64_t l = 0; l < config.num_levels; ++l) {
    auto level = levels->register_module(std::to_string(l), std::make_shared<torch::nn::Module>());
    auto modules = level->register_module("modules", std::make_shared<torch::nn::Module>());
    modules_.push_back(modules->register_module(std::to_string(path_[l]), std::make_shared<LevelModuleImpl>(config)));
  }
  final_norm = register_module("final_norm", std::make_shared<RMSNormImpl>(C, config.norm_eps));
  if (!config.tie_embeddings)
    head = register_module("head", torch::nn::Linear(torch::nn::LinearOptions(C, V).bias(false)));

  if (config.positions == "rope") {
    // inv_freq_i = theta^(-2i/D), angles (T, D/2), duplicated to (T, D) for the rotate-half form.
    auto inv_freq = rope_frequencies(config);
    auto angles = torch::outer(torch::arange(T, torch::kFloat64), inv_freq);
    auto full = torch::cat({angles, angles}, -1);
    rope_cos_ = register_buffer("rope_cos", full.cos().to(torch::kFloat32));
    rope_sin_ = register_buffer("rope_sin", full.sin().to(torch::kFloat32));
  }
  reset_parameters();
}

void Transformer::reset_parameters() {
  torch::NoGradGuard no_grad;
  const double std = config_.init_std;
  const double residual_std = std / std::sqrt(2.0 * double(config_.num_layers));
  tok_embed->weight.normal_(0.0, std);
  if (pos_embed) pos_embed->weight.normal_(0.0, std);
  for (auto& module : modules_)
    for (auto& block : module->blocks) init_block(*block, std, residual_std);
  final_norm->weight.fill_(1.0);
  if (head) head->weight.normal_(0.0, std);
}

torch::Tensor Transformer::embed(const torch::Tensor& tokens) {
  const int64_t T = tokens.size(1);
  if (T > config_.context) fail("sequence of {} tokens is longer than model.context = {}", T, config_.context);
  auto x = tok_embed->forward(tokens);  // (B, T, C)
  if (pos_embed) x = x + pos_embed->weight.narrow(0, 0, T);
  return x;
}

torch::Tensor Transformer::blocks(torch::Tensor x, int64_t begin, int64_t end) {
  int64_t index = 0;
  for (auto& module : modules_)
    for (auto& block : module->blocks) {
      if (index >= begin && index < end) x = block->forward(x, rope_cos_, rope_sin_);
      ++index;
    }
  return x;
}

torch::Tensor Transformer::logits(const torch::Tensor& x) {
  return torch::nn::functional::linear(final_norm->forward(x), head ? head->weight : tok_embed->weight);
}

torch::Tensor Transformer::hidden(const torch::Tensor& tokens) { return blocks(embed(tokens), 0, config_.num_layers); }

torch::Tensor Transformer::forward(const torch::Tensor& tokens) {
  return logits(hidden(tokens));  // (B, T, V)
}

torch::Tensor Transformer::loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
}

int64_t Transformer::num_parameters() const {
  int64_t n = 0;
  for (const auto& p : parameters()) n += p.numel();
  return n;
}

int64_t Transformer::num_matmul_parameters() const {
  int64_t n = 0;
  for (const auto& item : named_parameters()) {
    const auto& name = item.key();
    if (item.value().dim() < 2) continue;                                      // norms
    if (name.rfind("embed_pos", 0) == 0) continue;                             // added, not multiplied
    if (name.rfind("embed_tok", 0) == 0 && !config_.tie_embeddings) continue;  // a lookup, unless it is the head too
    n += item.value().numel();
  }
  return n;
}

}  // namespace tributary
