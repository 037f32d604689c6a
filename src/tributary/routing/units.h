// Routing units: DiPaCo routes each sequence by its first tokens. A split's token stream is cut into disjoint units
// of T+1 tokens (stream[i(T+1), (i+1)(T+1)), the last partial one dropped), so every token belongs to exactly one
// unit; a routed shard is the concatenation of its units and is read with LoaderOptions::stride = T+1.
// Each unit carries the source domain of the document its first token comes from (for the purity report).
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "tributary/data/dataset.h"

namespace tributary {

constexpr int64_t kRoutingPrefix = 32;  // tokens a router reads (the paper's 32-token prefix)

struct Units {
  torch::Tensor tokens;          // (N, T+1) int64
  std::vector<uint32_t> domain;  // N source-domain ids (Dataset::domains())
  int64_t size() const { return tokens.defined() ? tokens.size(0) : 0; }
};

Units cut_units(const Dataset& dataset, const std::string& split, int64_t context);

}  // namespace tributary
