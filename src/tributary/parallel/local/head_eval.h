// `tributary eval --all-heads`: the validation loss of every chunk's head of a local-parallel checkpoint (the
// auxiliary heads' and the model's), each chunk's head reading that chunk's output of the trained model: how much
// of the final loss each depth of the model already reaches (early exit).
#pragma once

#include <torch/torch.h>

#include <vector>

#include "tributary/data/loader.h"
#include "tributary/model/aux_head.h"
#include "tributary/model/transformer.h"
#include "tributary/parallel/local/chunks.h"

namespace tributary::local {

// Mean next-token loss of each chunk's head over `num_batches` batches of `loader` (no gradients); [K].
std::vector<double> evaluate_heads(Transformer& model, AuxHeads& heads, const ChunkPlan& plan, BatchLoader& loader,
                                   int64_t num_batches, const torch::Device& device);

}  // namespace tributary::local
