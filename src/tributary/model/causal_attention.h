// Causal self-attention that computes only the lower triangle: y = softmax(mask(q k^T)) v, forward and backward as one
// autograd function.
//
// Why: the composite path (bmm(q, k^T), a masked softmax over the full (T, T) matrix, bmm(att, v)) multiplies the
// masked upper half too: half of the score and output products, and of their four backward products, is work on
// zeros. Here the queries are cut into blocks of `block` rows; block b multiplies only against the keys it can see
// (columns < its last row + 1), so the products cover (nb + 1) / (2 nb) of the square for nb blocks, and the masked
// softmax runs fused on each block's scores. The probabilities are kept per block for the backward (about half of the
// composite path's (T, T) matrix).
//
// Determinism: every product is a batched matrix multiply over whole blocks and every accumulation (dK, dV over the
// query blocks) runs in a fixed block order, so results are bit-identical for a given thread count, as the other
// fused ops are (resume determinism relies on it).
//
// Shapes: q, k, v (N, T, D) with N = batch x heads; q already carries the 1/sqrt(D) scale. Rows attend to columns
// j <= i (queries and keys of the same length). Anything other than float32 on the CPU, or a disabled fused path
// (tests), takes the composite formula, which is the reference semantics.
#pragma once

#include <torch/torch.h>

namespace tributary {

// block: query rows per block; 0 picks causal_attention_block(T). A block >= T is the composite path's work (one
// block, the full square) with the fused softmax.
torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                               int64_t block = 0);

// The query-block height the fused path uses for a sequence of length T (exposed for the benchmark and tests).
int64_t causal_attention_block(int64_t T);

}  // namespace tributary
