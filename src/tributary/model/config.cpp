#include "tributary/model/config.h"

namespace tributary {

int64_t ModelConfig::resolved_mlp_hidden() const {
  if (mlp_hidden > 0) return mlp_hidden;
  if (mlp == "gelu") return 4 * width;
  int64_t h = (8 * width + 2) / 3;
  return (h + 63) / 64 * 64;
}

int64_t ModelConfig::num_parameters(int64_t vocab) const {
  const int64_t C = width, F = resolved_mlp_hidden(), KV = kv_heads() * head_dim(), Q = num_heads * head_dim();
  const int64_t block = 2 * C                                       // attention and MLP RMSNorm gains
                        + C * (Q + 2 * KV) + Q * C                  // qkv + output projection
                        + (qkv_bias ? Q + 2 * KV : 0)               // their biases
                        + C * (mlp == "gelu" ? F : 2 * F) + F * C;  // fc (gate and up for SwiGLU) + projection
  return vocab * C + (positions == "learned" ? context * C : 0) + num_layers * block + C  // final norm
         + (tie_embeddings ? 0 : vocab * C);
}

}  // namespace tributary
