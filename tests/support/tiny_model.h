// A model small enough for a unit test's step in milliseconds: the shape fields tests vary, ModelConfig's defaults for
// the rest.
#pragma once

#include <cstdint>

#include "tributary/model/config.h"

namespace test_support {

struct TinyShape {
  int64_t vocab = 61, layers = 2, levels = 1, width = 32, heads = 2, context = 12;
};

inline tributary::ModelConfig tiny_model(const TinyShape& shape = {}) {
  tributary::ModelConfig c;
  c.vocab_size = shape.vocab;
  c.num_layers = shape.layers;
  c.num_levels = shape.levels;
  c.width = shape.width;
  c.num_heads = shape.heads;
  c.context = shape.context;
  return c;
}

}  // namespace test_support
