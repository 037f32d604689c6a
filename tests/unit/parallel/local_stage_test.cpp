// Local parallelism across processes (parallel/local/local_stage.h) against the same chunks in one process
// (local/chunks.h, detaching at the same boundaries): ranks as threads, each with its own Gloo groups over loopback
// TCP. After three optimizer steps (clipping on, two micro-batches) the chunks' losses, the gradient norm and every
// parameter agree at PyTorch's pipelining tolerance, for `chunked`, `greedy` and synchronous `overlapping`, tied and
// untied embeddings, with and without per-chunk learning rates; in `chunked` mode no gradient message is sent at all.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <map>
#include <mutex>

#include "support/lcg_tokens.h"
#include "support/thread_ranks.h"
#include "tributary/comm/group.h"
#include "tributary/comm/lagged_reduce.h"
#include "tributary/comm/store.h"
#include "tributary/parallel/local/local_stage.h"

using namespace tributary;
using namespace tributary::local;

namespace {

constexpr int64_t kBatch = 8, kMicro = 2, kSeed = 9, kSteps = 3;
constexpr double kClip = 0.5, kAuxWeight = 0.7;
const AdamWOptions kAdam{.weight_decay = 0.1};
double lr(int64_t step) { return 3e-3 * double(step + 1); }

ModelConfig tiny(bool tied) {
  ModelConfig c;
  c.vocab_size = 47;
  c.num_layers = 4;
  c.num_levels = 2;
  c.width = 32;
  c.num_heads = 2;
  c.context = 12;
  c.tie_embeddings = tied;
  return c;
}

std::shared_ptr<const std::vector<uint32_t>> tokens() {
  static auto t = test_support::lcg_tokens(3000, 47, 3);
  return t;
}
BatchLoader loader() { return BatchLoader(tokens(), {.batch_size = kBatch, .context = 12, .seed = 4}, "test"); }

struct Case {
  int64_t chunks;
  std::string mode;
  int64_t head_blocks;
  bool tied;
  int queue_steps;
  std::vector<double> lr_scale = {};  // per chunk (local.lr_scale); {} = all 1
};

struct Result {
  std::vector<std::vector<double>> losses;  // [step][chunk]
  std::vector<double> norms;
  std::map<std::string, torch::Tensor> params;  // model and heads after kSteps
};

struct Built {
  std::shared_ptr<Transformer> model;
  std::shared_ptr<AuxHeads> heads;
};
Built build(const Case& c) {
  torch::manual_seed(kSeed);
  auto model = std::make_shared<Transformer>(tiny(c.tied));
  return {model, std::make_shared<AuxHeads>(tiny(c.tied), c.chunks, c.head_blocks)};
}

Result in_process(const Case& c, const ChunkPlan& plan) {
  Built b = build(c);
  auto params = named_parameters_of(*b.model), aux = named_parameters_of(*b.heads);
  NamedTensors all = params;
  all.insert(all.end(), aux.begin(), aux.end());
  AdamW adam(all, kAdam);
  auto data = loader();
  auto batch = torch::empty({kBatch, 13}, torch::kInt64);
  const auto groups = clip_groups(params, aux, plan, tiny(c.tied).blocks_per_level(), c.tied);
  std::vector<double> weights(size_t(c.chunks), kAuxWeight);
  weights.back() = 1.0;
  std::vector<int64_t> chunk_of(groups.size(), 0);  // chunk k's group, then the tied embedding's (chunk 0's rate)
  for (int64_t k = 0; k < c.chunks; ++k) chunk_of[size_t(k)] = k;
  set_chunk_lr_scales(adam, groups, chunk_of, c.lr_scale);
  Result r;
  for (int64_t s = 0; s < kSteps; ++s) {
    adam.zero_grad();
    data.next(batch.data_ptr<int64_t>());
    std::vector<double> losses(size_t(c.chunks), 0.0);
    for (int64_t mb = 0; mb < kMicro; ++mb) {
      auto rows = batch.narrow(0, mb * kBatch / kMicro, kBatch / kMicro);
      auto l = local_forward_backward(*b.model, *b.heads, plan, rows.narrow(1, 0, 12), rows.narrow(1, 1, 12), weights,
                                      kMicro);
      for (size_t k = 0; k < l.size(); ++k) losses[k] += l[k] / double(kMicro);
    }
    r.losses.push_back(losses);
    r.norms.push_back(clip_chunks(groups, kClip));
    adam.step(lr(s));
  }
  for (auto& [n, t] : all) r.params[n] = t.detach().clone();
  return r;
}

}  // namespace

TEST(LocalStages, EqualTheChunksInOneProcess) {
  // queue_steps = 0: every step's messages and numbers complete within the step; 2: a stage runs up to two steps
  // ahead, its numbers arrive two steps late (drained at the end), and nothing computed changes.
  torch::set_num_threads(1);
  for (const Case& c : std::vector<Case>{{2, "chunked", 0, true, 0},
                                         {2, "chunked", 0, false, 2},
                                         {2, "overlapping", 1, true, 0},
                                         {2, "overlapping", 0, false, 2, {1.0, 0.5}},
                                         {4, "greedy", 1, true, 2, {0.5, 1.0, 2.0, 1.0}}}) {
    SCOPED_TRACE(testing::Message() << "K=" << c.chunks << " " << c.mode << " head blocks " << c.head_blocks << " tied "
                                    << c.tied << " queue " << c.queue_steps << " lr scales " << c.lr_scale.size());
    const auto plan = ChunkPlan::make(4, c.chunks, c.mode, 1);
    const Result ref = in_process(c, plan);
    std::vector<Built> ranks;
    for (int64_t s = 0; s < c.chunks; ++s) ranks.push_back(build(c));  // in turn: threads share no RNG
    auto store = c10::make_intrusive<c10d::HashStore>();
    std::mutex mu;
    test_support::run_threads(int(c.chunks), [&](int s) {
      const int p = int(c.chunks);
      comm::Group pipe(store, s, p, {}, "pipe");
      comm::LaggedReduce report(comm::Store(store), s, p, {}, "report", c.queue_steps);
      std::unique_ptr<comm::Group> tie;
      if (c.tied && (s == 0 || s == p - 1))
        tie = std::make_unique<comm::Group>(store, s == 0 ? 0 : 1, 2, comm::GroupOptions{}, "tie");
      Built& b = ranks[size_t(s)];
      auto params = pipeline::stage_params(named_parameters_of(*b.model), plan.layout, s,
                                           tiny(c.tied).blocks_per_level(), c.tied);
      for (auto& [n, t] : named_parameters_of(*b.heads))
        if (n.rfind(fmt::format("aux.{}.", s), 0) == 0) params.emplace_back(n, t);
      AdamW adam(params, kAdam);
      auto data = loader();
      LocalStage stage({.model = *b.model,
                        .heads = *b.heads,
                        .params = params,
                        .optimizer = adam,
                        .loader = data,
                        .groups = {&pipe, tie.get(), nullptr},
                        .report = &report,
                        .plan = plan,
                        .stage = s,
                        .micro_batches = kMicro,
                        .aux_weight = kAuxWeight,
                        .grad_clip = kClip,
                        .lr_scale = c.lr_scale});
      std::vector<StepResult> results;
      for (int64_t step = 0; step < kSteps; ++step) {
        StepResult r = stage.run(step, lr(step));
        EXPECT_EQ(r.reported, step >= c.queue_steps) << "step " << step;
        if (r.reported) results.push_back(std::move(r));
      }
      for (auto& r : stage.drain()) results.push_back(std::move(r));
      ASSERT_EQ(results.size(), size_t(kSteps));
      for (size_t step = 0; step < results.size(); ++step) {
        const StepResult& r = results[step];
        for (int64_t k = 0; k < c.chunks; ++k)
          EXPECT_NEAR(r.chunk_losses[size_t(k)], ref.losses[step][size_t(k)], 1e-6) << "step " << step;
        EXPECT_NEAR(r.grad_norm, ref.norms[step], 1e-5 * ref.norms[step]) << "step " << step;
        EXPECT_EQ(r.stage_bytes_forward.back(), 0.0);  // the last stage sends nothing on
        EXPECT_EQ(r.stage_bytes_forward[0], double(kBatch * 12 * 32 * 4)) << "one fp32 batch";
      }
      const auto stats = stage.take_stats();
      std::lock_guard<std::mutex> lock(mu);
      if (c.mode != "overlapping") {
        EXPECT_EQ(stats.gradient_bytes, 0) << "stage " << s << " sent gradients back";
      } else if (s > 0) {
        EXPECT_GT(stats.gradient_bytes, 0) << "stage " << s;
      }
      for (auto& [n, t] : params)
        EXPECT_TRUE(torch::allclose(t, ref.params.at(n), 1e-5, 4e-5))
            << "stage " << s << " " << n << " max diff " << (t - ref.params.at(n)).abs().max().item<double>();
    });
  }
}
