#include "tributary/parallel/pipeline/stage.h"

#include <fmt/format.h>

#include <cmath>

#include "tributary/core/error.h"
#include "tributary/core/number_list.h"
#include "tributary/model/param_name.h"

namespace tributary::pipeline {

StageLayout StageLayout::balanced(int64_t num_blocks, int64_t stages) {
  if (stages < 1 || stages > num_blocks)
    fail("parallel.pipeline_stages = {} must be from 1 to model.num_layers ({}): every stage owns at least one block",
         stages, num_blocks);
  StageLayout out{{0}};
  for (int64_t s = 0; s < stages; ++s)
    out.first_block.push_back(out.first_block.back() + num_blocks / stages + (s < num_blocks % stages ? 1 : 0));
  return out;
}

StageLayout StageLayout::parse(const std::string& text, int64_t num_blocks, int64_t stages, const std::string& key) {
  if (text.empty()) return balanced(num_blocks, stages);
  StageLayout out{{0}};
  for (double v : parse_number_list(text, key, "blocks per stage, e.g. \"3,5\"")) {
    if (v < 1 || v != std::floor(v) || v > 1e9)
      fail("{} = '{}': every stage needs a whole number of blocks, at least one", key, text);
    const auto n = static_cast<int64_t>(v);
    out.first_block.push_back(out.first_block.back() + n);
  }
  if (out.stages() != stages)
    fail("{} = '{}' names {} stages but parallel.pipeline_stages = {}", key, text, out.stages(), stages);
  if (out.first_block.back() != num_blocks)
    fail("{} = '{}' holds {} blocks but model.num_layers = {}", key, text, out.first_block.back(), num_blocks);
  return out;
}

NamedTensors stage_params(const NamedTensors& all, const StageLayout& layout, int64_t stage, int64_t blocks_per_level,
                          bool tied_embeddings) {
  const bool first = stage == 0, last = stage == layout.stages() - 1;
  NamedTensors out;
  for (const auto& [name, tensor] : all) {
    const auto place = parse_param_name(name);
    TRIB_CHECK(place.has_value(), "parameter '{}' has no place in the model", name);
    bool mine = false;
    switch (place->part) {
      case ParamPlace::Part::Embedding:
        mine = first || (last && tied_embeddings && name == kTiedEmbedding);
        break;
      case ParamPlace::Part::Final:
        mine = last;
        break;
      case ParamPlace::Part::Block: {
        const int64_t b = place->model_block(blocks_per_level);
        mine = b >= layout.begin(stage) && b < layout.end(stage);
        break;
      }
    }
    if (mine) out.emplace_back(name, tensor);
  }
  return out;
}

}  // namespace tributary::pipeline
