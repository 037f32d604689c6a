#include <gtest/gtest.h>

#include "support/tiny_model.h"
#include "tributary/core/error.h"
#include "tributary/model/tensor_io.h"
#include "tributary/model/transformer.h"

using namespace tributary;

namespace {
ModelConfig small() {
  return test_support::tiny_model({.vocab = 50, .layers = 4, .levels = 2, .width = 32, .heads = 4, .context = 12});
}
}  // namespace

TEST(Transformer, ParametersAreKeyedByLevelModuleBlock) {
  Transformer m(small(), {0, 3});
  std::set<std::string> names;
  for (const auto& p : m.named_parameters()) names.insert(p.key());
  EXPECT_TRUE(names.count("embed_tok.weight"));
  EXPECT_TRUE(names.count("levels.0.modules.0.blocks.1.attn.qkv.weight"));
  EXPECT_TRUE(names.count("levels.1.modules.3.blocks.0.mlp.fc.weight"));
  EXPECT_TRUE(names.count("levels.1.modules.3.blocks.1.mlp_norm.weight"));
  EXPECT_TRUE(names.count("final_norm.weight"));
  EXPECT_FALSE(names.count("head.weight")) << "tied by default";
  EXPECT_EQ(names.size(), 1u + 2 * 2 * 6 + 1);
}

TEST(Transformer, SameSeedSameWeightsAndCausal) {
  torch::manual_seed(3);
  Transformer a(small());
  torch::manual_seed(3);
  Transformer b(small());
  for (size_t i = 0; i < a.parameters().size(); ++i) EXPECT_TRUE(a.parameters()[i].equal(b.parameters()[i]));
  // Changing a later token must not change earlier logits.
  auto x = torch::randint(0, 50, {2, 12}, torch::kInt64);
  auto y = x.clone();
  y.index_put_({0, 7}, (x.index({0, 7}) + 1) % 50);
  auto la = a.forward(x), lb = a.forward(y);
  EXPECT_TRUE(torch::allclose(la.narrow(1, 0, 7), lb.narrow(1, 0, 7)));
  EXPECT_FALSE(torch::allclose(la.narrow(1, 7, 1), lb.narrow(1, 7, 1)));
}

TEST(Transformer, SequenceLongerThanContextIsRefused) {
  Transformer m(small());
  EXPECT_THROW(m.forward(torch::zeros({1, 13}, torch::kInt64)), Error);
}

TEST(Transformer, LoadRefusesMismatchedCheckpoint) {
  Transformer m(small());
  auto bytes = tensors_to_safetensors(named_parameters_of(m));
  ModelConfig wider = small();
  wider.width = 64;
  Transformer other(wider);
  try {
    load_parameters(other, safetensors::File::parse(bytes, "ckpt/model.safetensors"));
    FAIL();
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("ckpt/model.safetensors"), std::string::npos) << msg;
    EXPECT_NE(msg.find("shape"), std::string::npos) << msg;
  }
  Transformer same(small());
  load_parameters(same, safetensors::File::parse(bytes, "ok"));
  EXPECT_TRUE(same.parameters()[1].equal(m.parameters()[1]));
}

// The scheduler prices a model from its shape alone (ModelConfig::num_parameters): it must count what the model holds.
TEST(Transformer, ShapeAloneCountsItsParameters) {
  for (const char* mlp : {"swiglu", "gelu"})
    for (const char* positions : {"rope", "learned"})
      for (bool tied : {true, false}) {
        ModelConfig c = small();
        c.mlp = mlp;
        c.positions = positions;
        c.tie_embeddings = tied;
        EXPECT_EQ(c.num_parameters(c.vocab_size), Transformer(c).num_parameters())
            << mlp << " " << positions << " tied " << tied;
      }
}
