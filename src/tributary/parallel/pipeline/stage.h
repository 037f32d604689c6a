// Which part of the model a pipeline stage owns (shared/reference/pipeline-and-local.md §2.2): consecutive blocks,
// balanced by count unless parallel.stage_layers names them ("3,5"); the first stage also owns the embeddings, the last
// the final norm and the head. With tied embeddings the last stage holds a copy of the token embedding as its head: the
// two copies start equal (same seed), their gradients are summed between the first and last stage, and they take
// identical AdamW steps, so they stay bit-identical.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tributary/model/tensor_io.h"

namespace tributary::pipeline {

struct StageLayout {
  std::vector<int64_t> first_block;  // stages + 1 entries: stage s owns blocks [first_block[s], first_block[s+1])

  int64_t stages() const { return static_cast<int64_t>(first_block.size()) - 1; }
  int64_t begin(int64_t stage) const { return first_block[size_t(stage)]; }
  int64_t end(int64_t stage) const { return first_block[size_t(stage) + 1]; }

  // Blocks dealt as evenly as possible (the earlier stages take the remainder; the last one also runs the head).
  static StageLayout balanced(int64_t num_blocks, int64_t stages);
  // "3,5": blocks per stage, summing to num_blocks; an Error naming `key` otherwise.
  static StageLayout parse(const std::string& text, int64_t num_blocks, int64_t stages, const std::string& key);
};

inline const std::string kTiedEmbedding = "embed_tok.weight";

// The parameters stage `stage` computes with (and updates), in model order.
NamedTensors stage_params(const NamedTensors& all, const StageLayout& layout, int64_t stage, int64_t blocks_per_level,
                          bool tied_embeddings);

}  // namespace tributary::pipeline
