// Local parallelism's chunk protocol in one process (parallel/local/chunks.h): which parameters each chunk's loss
// reaches. chunked/greedy: chunk k+1's loss leaves chunk k's blocks and head untouched; overlapping: it reaches exactly
// the last overlap_blocks blocks of chunk k. One chunk is global backprop, bit for bit.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "tributary/optim/adamw.h"
#include "tributary/parallel/local/chunks.h"

using namespace tributary;
using namespace tributary::local;

namespace {

ModelConfig tiny(bool tied) {
  ModelConfig c;
  c.vocab_size = 53;
  c.num_layers = 4;
  c.num_levels = 2;
  c.width = 32;
  c.num_heads = 2;
  c.context = 10;
  c.tie_embeddings = tied;
  return c;
}

struct Model {
  std::shared_ptr<Transformer> model;
  std::shared_ptr<AuxHeads> heads;
  torch::Tensor tokens, targets;
};

Model make(const ModelConfig& c, int64_t chunks, int64_t head_blocks) {
  torch::manual_seed(11);
  Model s{std::make_shared<Transformer>(c), std::make_shared<AuxHeads>(c, chunks, head_blocks), {}, {}};
  auto batch = torch::randint(c.vocab_size, {3, c.context + 1}, torch::kInt64);
  s.tokens = batch.narrow(1, 0, c.context);
  s.targets = batch.narrow(1, 1, c.context);
  return s;
}

bool has_gradient(const torch::Tensor& p) { return p.grad().defined() && p.grad().abs().max().item<double>() > 0; }

// Which of blocks 0..3 and aux heads received a non-zero gradient from the loss of chunk `only` alone.
struct Reached {
  std::vector<bool> blocks;
  std::vector<bool> heads;
  bool embedding = false;
};

Reached reached(const ModelConfig& c, const ChunkPlan& plan, int64_t head_blocks, int64_t only) {
  Model s = make(c, plan.chunks(), head_blocks);
  std::vector<double> weights(size_t(plan.chunks()), 0.0);
  weights[size_t(only)] = 1.0;
  local_forward_backward(*s.model, *s.heads, plan, s.tokens, s.targets, weights, 1);
  Reached r{std::vector<bool>(4, false), std::vector<bool>(size_t(s.heads->size()), false)};
  for (const auto& [name, p] : named_parameters_of(*s.model)) {
    if (!has_gradient(p)) continue;
    if (name.rfind("embed_tok", 0) == 0) r.embedding = true;
    for (int64_t b = 0; b < 4; ++b)  // levels.L.modules.0.blocks.i: model block 2L + i
      if (name.rfind(fmt::format("levels.{}.modules.0.blocks.{}.", b / 2, b % 2), 0) == 0) r.blocks[size_t(b)] = true;
  }
  for (const auto& [name, p] : named_parameters_of(*s.heads))
    if (has_gradient(p)) r.heads[size_t(std::stoi(name.substr(4)))] = true;
  return r;
}

}  // namespace

TEST(LocalChunks, ChunkedLossesReachOnlyTheirOwnChunk) {
  const auto c = tiny(/*tied=*/false);
  const auto plan = ChunkPlan::make(4, 2, "chunked", 1);
  const Reached first = reached(c, plan, 1, 0);
  EXPECT_EQ(first.blocks, (std::vector<bool>{true, true, false, false}));
  EXPECT_EQ(first.heads, (std::vector<bool>{true}));
  EXPECT_TRUE(first.embedding);
  const Reached second = reached(c, plan, 1, 1);
  EXPECT_EQ(second.blocks, (std::vector<bool>{false, false, true, true}));
  EXPECT_EQ(second.heads, (std::vector<bool>{false}));
  EXPECT_FALSE(second.embedding) << "chunk 1's loss reached the embedding of chunk 0 (untied model)";
}

TEST(LocalChunks, GreedyChunksTrainOneBlockEach) {
  const auto c = tiny(/*tied=*/false);
  const auto plan = ChunkPlan::make(4, 4, "greedy", 1);
  for (int64_t k = 0; k < 4; ++k) {
    const Reached r = reached(c, plan, 0, k);
    std::vector<bool> blocks(4, false), heads(3, false);
    blocks[size_t(k)] = true;
    if (k < 3) heads[size_t(k)] = true;
    EXPECT_EQ(r.blocks, blocks) << "chunk " << k;
    EXPECT_EQ(r.heads, heads) << "chunk " << k;
  }
}

TEST(LocalChunks, OverlappingLossesAlsoTrainTheLastBlocksOfThePreviousChunk) {
  const auto c = tiny(/*tied=*/false);
  const auto plan = ChunkPlan::make(4, 2, "overlapping", 1);
  const Reached second = reached(c, plan, 0, 1);
  EXPECT_EQ(second.blocks, (std::vector<bool>{false, true, true, true}));
  EXPECT_EQ(second.heads, (std::vector<bool>{false}));
  EXPECT_FALSE(second.embedding);
  const Reached first = reached(c, plan, 0, 0);  // a chunk's own loss still trains all of it
  EXPECT_EQ(first.blocks, (std::vector<bool>{true, true, false, false}));
  EXPECT_EQ(first.heads, (std::vector<bool>{true}));
}

TEST(LocalChunks, OverlapGradientsAddTheNextChunksLossOnTheOverlapOnly) {
  // Both losses together: the overlap block's gradient is L_0's plus L_1's (each measured alone), the others one.
  const auto c = tiny(/*tied=*/false);
  const auto plan = ChunkPlan::make(4, 2, "overlapping", 1);
  auto grads = [&](std::vector<double> weights) {
    Model s = make(c, 2, 1);
    local_forward_backward(*s.model, *s.heads, plan, s.tokens, s.targets, weights, 1);
    std::map<std::string, torch::Tensor> out;
    for (const auto& [name, p] : named_parameters_of(*s.model))
      out[name] = p.grad().defined() ? p.grad().clone() : torch::zeros_like(p);
    return out;
  };
  auto both = grads({1, 1}), first = grads({1, 0}), second = grads({0, 1});
  for (const auto& [name, g] : both) EXPECT_TRUE(torch::allclose(g, first[name] + second[name], 1e-5, 1e-7)) << name;
}

TEST(LocalChunks, OneChunkIsGlobalBackpropBitForBit) {
  const auto c = tiny(/*tied=*/true);
  Model local = make(c, 1, 0), global = make(c, 1, 0);
  const auto losses = local_forward_backward(*local.model, *local.heads, ChunkPlan::make(4, 1, "chunked", 1),
                                             local.tokens, local.targets, {1.0}, 1);
  auto loss = Transformer::loss(global.model->forward(global.tokens), global.targets);
  loss.backward();
  EXPECT_EQ(losses[0], loss.item<double>());
  auto a = named_parameters_of(*local.model), b = named_parameters_of(*global.model);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i].second.grad(), b[i].second.grad())) << a[i].first;
}

TEST(LocalChunks, ClipGroupsHoldEveryParameterOnceAndTheTiedEmbeddingAlone) {
  const auto c = tiny(/*tied=*/true);
  Model s = make(c, 2, 1);
  const auto params = named_parameters_of(*s.model), aux = named_parameters_of(*s.heads);
  const auto groups = clip_groups(params, aux, ChunkPlan::make(4, 2, "chunked", 1), c.blocks_per_level(), true);
  ASSERT_EQ(groups.size(), 3u);
  std::map<std::string, int> seen;
  for (const auto& g : groups)
    for (const auto& [name, t] : g) seen[name] += 1;
  EXPECT_EQ(seen.size(), params.size() + aux.size());
  for (const auto& [name, n] : seen) EXPECT_EQ(n, 1) << name;
  ASSERT_EQ(groups[2].size(), 1u);
  EXPECT_EQ(groups[2][0].first, "embed_tok.weight");
}

// local.lr_scale: chunk 1 at a quarter of the learning rate moves exactly a quarter as far in its first AdamW step
// (the step is linear in lr); chunk 0 and the tied embedding (chunk 0's rate) move as with no scales, bit for bit.
TEST(LocalChunks, PerChunkLearningRatesScaleOnlyTheirChunksStep) {
  const auto c = tiny(/*tied=*/true);
  const auto plan = ChunkPlan::make(4, 2, "chunked", 1);
  struct Stepped {
    std::vector<NamedTensors> groups;
    std::vector<std::vector<torch::Tensor>> before;
  };
  Model models[2] = {make(c, 2, 1), make(c, 2, 1)};
  Stepped stepped[2];
  const std::vector<double> scales[2] = {{1.0, 1.0}, {1.0, 0.25}};
  for (int i = 0; i < 2; ++i) {
    Model& s = models[i];
    auto params = named_parameters_of(*s.model);
    for (auto& p : named_parameters_of(*s.heads)) params.push_back(p);
    AdamW optimizer(params, {});
    auto& st = stepped[i];
    st.groups = clip_groups(*s.model, *s.heads, plan);
    ASSERT_EQ(st.groups.size(), 3u);  // chunk 0, chunk 1, the tied embedding
    set_chunk_lr_scales(optimizer, st.groups, {0, 1, 0}, scales[i]);
    for (const auto& g : st.groups) {
      st.before.emplace_back();
      for (const auto& [name, p] : g) st.before.back().push_back(p.detach().clone());
    }
    local_forward_backward(*s.model, *s.heads, plan, s.tokens, s.targets, {1.0, 1.0}, 1);
    optimizer.step(1e-2);
  }
  for (size_t g = 0; g < 3; ++g)
    for (size_t j = 0; j < stepped[0].groups[g].size(); ++j) {
      const auto& name = stepped[0].groups[g][j].first;
      auto full = stepped[0].groups[g][j].second.detach() - stepped[0].before[g][j];
      auto scaled = stepped[1].groups[g][j].second.detach() - stepped[1].before[g][j];
      ASSERT_GT(full.abs().max().item<double>(), 0) << name;
      if (g == 1)
        EXPECT_TRUE(torch::allclose(scaled, 0.25 * full, 1e-4, 1e-9)) << name;
      else
        EXPECT_TRUE(torch::equal(stepped[0].groups[g][j].second, stepped[1].groups[g][j].second)) << name;
    }
}
