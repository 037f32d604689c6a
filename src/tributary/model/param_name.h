// Where a parameter sits in the model, read from its stable name (transformer.h): "embed_tok.weight",
// "embed_pos.weight", "levels.L.modules.M.blocks.B.<rest>", "final_norm.weight", "head.weight". One parser for the
// outer loop's fragments, DiPaCo's modules and pipeline stages instead of a regular expression in each.
// Torch-free.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace tributary {

struct ParamPlace {
  enum class Part { Embedding, Block, Final } part = Part::Embedding;
  int64_t level = -1, module = -1, block = -1;  // Part::Block only; block within its module
  std::string rest;                             // after "blocks.B." (Part::Block)

  // The block's index in model order (level * blocks_per_level + block); -1 outside the blocks.
  int64_t model_block(int64_t blocks_per_level) const {
    return part == Part::Block ? level * blocks_per_level + block : -1;
  }
};

// nullopt for a name that is none of the above.
std::optional<ParamPlace> parse_param_name(const std::string& name);

// "levels.L.modules.M.<rest>" with M replaced by `to` (DiPaCo: a module's tensors under another module id); other
// names unchanged.
std::string with_module_index(const std::string& name, int64_t to);

}  // namespace tributary
