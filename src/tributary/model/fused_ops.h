// Fused CPU kernels for the transformer's memory-bound pieces, each a torch autograd Function with a hand-written
// backward. On 2 CPU cores the element-wise work of eager PyTorch (RoPE's cat/neg/mul chain, RMSNorm's pow/mean/rsqrt,
// SwiGLU's chunk/silu/mul and their backward graphs) costs about as much as the matrix multiplies; one pass per
// kernel instead of several is where the C++ trainer beats PyTorch eager.
//
// Each function takes the fused path for contiguous-able float32 CPU tensors and otherwise falls back to the
// composite ATen formula (the reference semantics, used for other dtypes; on CUDA ATen's fused ops where they exist);
// tests compare the two.
//
// Shape legend: B batch, T time, C width, H heads, D head dim, F MLP hidden.
#pragma once

#include <torch/torch.h>

#include <array>

namespace tributary {

// y = x * rsqrt(mean(x^2, -1) + eps) * weight.   x: (..., C), weight: (C)
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);

// silu(h[..., :F]) * h[..., F:].   h: (..., 2F) -> (..., F)
torch::Tensor swiglu(const torch::Tensor& h);

// Splits the fused projection qkv (B, T, (H + 2 KV) D) = [q | k | v] into per-head q (B*H, T, D) and k, v
// (B*KV, T, D), contiguous, applying the rotary embedding ("rotate half" form, cos/sin: (>=T, D)) to q and k when cos
// is defined, and multiplying q by q_scale (the attention's 1/sqrt(D), folded in here so the score matmul needs no
// extra pass). num_kv_heads 0 means num_heads (plain multi-head attention, qkv (B, T, 3C)).
std::array<torch::Tensor, 3> split_heads_rope(const torch::Tensor& qkv, int64_t num_heads, const torch::Tensor& cos,
                                              const torch::Tensor& sin, double q_scale = 1.0, int64_t num_kv_heads = 0);

// Softmax over the last dimension of scores (..., Tq, T) where query row i sees columns j <= i + (T - Tq); masked
// entries come out 0. The causal mask and the softmax in one pass.
torch::Tensor causal_softmax(const torch::Tensor& scores);

// Whether the fused kernels may be used for this tensor (CPU, float32). Exposed for tests.
bool fused_kernels_apply(const torch::Tensor& t);
// Tests switch the fused path off to compare against the composite reference.
void set_fused_kernels_enabled(bool enabled);
bool fused_kernels_enabled();

}  // namespace tributary
