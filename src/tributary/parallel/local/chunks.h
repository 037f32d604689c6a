// How local parallelism cuts the model (Laskin, Metz et al., arXiv 2012.03837; shared/reference/pipeline-and-local.md
// §2.5): K chunks of consecutive blocks, chunk k ending in auxiliary head k (the last chunk in the model's head), and
// the protocol of one micro-batch through them:
//   chunk k runs forward on the detached output of chunk k-1 (the embeddings for chunk 0), its head gives L_k, and
//   L_k's gradient stops at the chunk's input: no gradient crosses a chunk boundary (`chunked`, and `greedy`, one
//   block per chunk).
//   `overlapping`: L_{k+1} also trains the last o blocks of chunk k. Chunk k computes those blocks from a leaf `split`
//   (the detached output of its earlier blocks); L_k's gradient at `split` is carried on through the earlier blocks,
//   while the gradient of L_{k+1} at chunk k's output (what a stage would send back) is backpropagated through the o
//   blocks only and stops at `split`.
// The in-process step (local_step.h) and a pipeline stage across processes run the same protocol.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "tributary/model/aux_head.h"
#include "tributary/model/tensor_io.h"
#include "tributary/model/transformer.h"
#include "tributary/parallel/pipeline/stage.h"

namespace tributary {
class AdamW;
}

namespace tributary::local {

struct ChunkPlan {
  pipeline::StageLayout layout;  // chunk k owns blocks [layout.begin(k), layout.end(k))
  int64_t overlap = 0;           // overlapping: blocks at the end of each chunk that the next chunk's loss trains

  int64_t chunks() const { return layout.stages(); }
  // mode: chunked | greedy | overlapping (validated in run_config.cpp: K divides the blocks, o < blocks per chunk).
  static ChunkPlan make(int64_t num_blocks, int64_t chunks, const std::string& mode, int64_t overlap_blocks);
};

// One chunk's forward from its input x: y, and with an overlap the leaf `split` and the tensor `below` it was
// detached from (the output of the chunk's earlier blocks).
struct ChunkForward {
  torch::Tensor y, split, below;
};
ChunkForward chunk_forward(Transformer& model, const ChunkPlan& plan, int64_t chunk, const torch::Tensor& x);

// loss(head_k(y), targets): the model's head for the last chunk.
torch::Tensor chunk_loss(Transformer& model, AuxHeads& heads, const ChunkPlan& plan, int64_t chunk,
                         const torch::Tensor& y, const torch::Tensor& targets);

// backward of weight * loss / divisor (each factor applied only when it is not 1, so one chunk is bit-identical to
// the plain trainer); with an overlap, L_k's gradient at `split` continues through the chunk's earlier blocks, and
// the graph above `split` is kept for the next chunk's gradient.
void chunk_backward(const torch::Tensor& loss, const ChunkForward& f, double weight, int64_t divisor);

// Every chunk on one micro-batch, in order, in one process: accumulates the gradients of weights[k] * L_k / divisor
// and returns each chunk's loss.
std::vector<double> local_forward_backward(Transformer& model, AuxHeads& heads, const ChunkPlan& plan,
                                           const torch::Tensor& tokens, const torch::Tensor& targets,
                                           const std::vector<double>& weights, int64_t divisor);

// The parameters each chunk's optimizer step clips together: chunk k's blocks and aux head, the embeddings with
// chunk 0, the final norm (and untied head) with the last chunk. A tied embedding (trained by chunk 0's lookup and
// the last chunk's head) is a group of its own, so two stages holding copies of it clip them alike. One chunk: one
// group, every parameter in model order (the plain trainer's global clipping).
std::vector<NamedTensors> clip_groups(const NamedTensors& model_params, const NamedTensors& aux_params,
                                      const ChunkPlan& plan, int64_t blocks_per_level, bool tied_embeddings);
// The same, everything read from the model (its parameters, levels, tied or not) and the heads.
std::vector<NamedTensors> clip_groups(const Transformer& model, const AuxHeads& heads, const ChunkPlan& plan);
// Gives each chunk's group of `groups` (clip_groups' output, or some of its groups, `chunk_of[g]` naming group g's
// chunk) its learning-rate multiplier in `optimizer`: per-chunk learning rates. Empty `scales`: nothing changes.
void set_chunk_lr_scales(AdamW& optimizer, const std::vector<NamedTensors>& groups,
                         const std::vector<int64_t>& chunk_of, const std::vector<double>& scales);
// Clips each group to max_norm on its own; returns the norm of all gradients together, before clipping.
double clip_chunks(const std::vector<NamedTensors>& groups, double max_norm);

}  // namespace tributary::local
