// Causal self-attention that computes only the lower triangle: y = softmax(mask(q k^T)) v, forward and backward as one
// autograd function.
//
// Why: the composite path (bmm(q, k^T), a masked softmax over the full (T, T) matrix, bmm(att, v)) multiplies the
// masked upper half too: half of the score and output products, and of their four backward products, is work on
// zeros, and OpenBLAS runs these inner-dimension-64 products at about a third of its peak. Here each head is one
// task (heads split over threads whole); its queries are cut into blocks of `block` rows, and block b multiplies only
// against the keys it can see, with the masked softmax fused on its scores; the products are simd_kernels'
// register-blocked multiply. The probabilities are kept for the backward (T x T per head, upper triangle untouched),
// which computes dS for every row and then dK, dV per 16-key block over all the query rows that see it.
//
// Determinism: a head's work never depends on how heads are split over threads and every sum runs in a fixed order,
// so results are bit-identical for any thread count (resume determinism relies on it).
//
// Shapes: q, k, v (N, T, D) with N = batch x heads; q already carries the 1/sqrt(D) scale. Rows attend to columns
// j <= i (queries and keys of the same length). The kernel needs float32 on a CPU with AVX2 + FMA and D a multiple
// of 16; otherwise (or with the fused path disabled, in tests): on CUDA PyTorch's fused attention,
// elsewhere the composite formula, which is the reference semantics. From kCpuSdpaFromLength on, the CPU too takes
// LibTorch's own at::scaled_dot_product_attention, which is faster there (its flash kernel; measured per length).
#pragma once

#include <torch/torch.h>

namespace tributary {

// block: query rows per block, a multiple of 16; 0 picks kCausalAttentionBlock.
torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                               int64_t block = 0);

// Grouped-query attention over `batch` sequences: q (batch x H, T, D), k and v (batch x KV, T, D), KV dividing H;
// query head h reads key/value head h / (H / KV). On a GPU SDPA reads the shared heads in place (enable_gqa); elsewhere
// k and v are repeated to H heads for causal_attention (autograd sums the copies back). KV == H is causal_attention.
torch::Tensor grouped_causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                       int64_t batch);

// The query-block height the fused path uses: 16, 48 and 96 measured within noise of each other at T 128-1024
// (docs/benchmarks.md §16); 16 wastes least of the diagonal blocks.
inline constexpr int64_t kCausalAttentionBlock = 16;

// The sequence length from which at::scaled_dot_product_attention beats the lower-triangle kernel on the CPU
// (PyTorch 2.13, head dim 64, 2 threads, forward + backward: ours 2.9x / 2.4x / 1.6x faster at T 128 / 256 / 512,
// SDPA 1.1x faster at 1024; docs/benchmarks.md §0, `build/bench_attention`).
inline constexpr int64_t kCpuSdpaFromLength = 1024;

}  // namespace tributary
