// The model's shape: plain values, no LibTorch (the config tree, the scheduler's workload and the model share it).
// Bound to TOML keys in config/run_config.cpp.
#pragma once

#include <cstdint>
#include <string>

namespace tributary {

struct ModelConfig {
  int64_t vocab_size = 0;  // 0: take it from the dataset's tokenizer
  int64_t num_layers = 4;
  int64_t num_levels = 1;  // blocks are grouped into this many consecutive levels (DiPaCo modules, pipeline stages)
  int64_t width = 256;
  int64_t num_heads = 4;
  int64_t num_kv_heads = 0;  // 0: num_heads; fewer: grouped-query attention, each key/value head serves
                             // num_heads / num_kv_heads consecutive query heads (Llama's num_key_value_heads)
  int64_t context = 256;
  std::string mlp = "swiglu";      // swiglu | gelu
  int64_t mlp_hidden = 0;          // 0: 4*width for gelu, 8/3*width rounded up to 64 for swiglu
  std::string positions = "rope";  // rope | learned
  bool tie_embeddings = true;
  double rope_theta = 10000.0;
  // RoPE's frequencies rescaled for a longer context, as transformers' rope_type: none | linear (every frequency
  // divided by rope_factor) | llama3 (Llama 3.1: low frequencies divided by rope_factor, high ones kept, a smooth blend
  // between, the bands set by rope_low_freq_factor, rope_high_freq_factor and rope_original_context).
  std::string rope_scaling = "none";
  double rope_factor = 1.0;
  double rope_low_freq_factor = 1.0;
  double rope_high_freq_factor = 4.0;
  int64_t rope_original_context = 8192;
  int64_t fixed_head_dim = 0;  // model.head_dim: 0 = width / num_heads; a model may set its own (Qwen 3, Gemma)
  bool qkv_bias = false;       // biases on the query, key and value projections (Qwen 2 / 2.5)
  double norm_eps = 1e-5;
  double init_std = 0.02;

  int64_t head_dim() const { return fixed_head_dim > 0 ? fixed_head_dim : width / num_heads; }
  int64_t kv_heads() const { return num_kv_heads > 0 ? num_kv_heads : num_heads; }
  int64_t resolved_mlp_hidden() const;
  int64_t blocks_per_level() const { return num_layers / num_levels; }
  // Parameters of the dense model (Transformer::num_parameters) for a vocabulary of `vocab` tokens, computed from the
  // shape alone (the scheduler's workload needs it without building the model).
  int64_t num_parameters(int64_t vocab) const;
};

}  // namespace tributary
