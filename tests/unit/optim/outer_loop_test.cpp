// The outer loop without processes: a fake reducer (one replica: the average is the input) records which unit
// sends at which step, so fragment timing, the warm-up offset, QSR, overlap landing and the commit gate are checked
// directly.
#include <gtest/gtest.h>

#include <future>

#include "tributary/optim/outer_loop.h"

using namespace tributary;

namespace {

// One replica: the average of the pseudo-gradients is themselves. Records (step, tensors) of every reduction.
struct OneReplica : Reducer {
  const int64_t* step = nullptr;
  std::vector<std::pair<int64_t, size_t>> sends;
  std::future<std::vector<torch::Tensor>> start(std::vector<torch::Tensor> t, int /*stream*/) override {
    sends.emplace_back(*step, t.size());
    std::promise<std::vector<torch::Tensor>> p;
    p.set_value(std::move(t));
    return p.get_future();
  }
};

struct Fixture {
  NamedTensors params = {{"embed", torch::zeros({2})},
                         {"levels.0.modules.0.blocks.0.w", torch::zeros({3})},
                         {"levels.0.modules.0.blocks.1.w", torch::zeros({4})}};
  int64_t step = 0;
  OneReplica reducer;
  std::vector<std::pair<int64_t, size_t>>& sends = reducer.sends;  // (step, tensors sent)

  Fixture() { reducer.step = &step; }
  OuterLoop make(OuterLoopOptions o) {
    o.blocks_per_level = 2;
    o.num_layers = 2;
    return OuterLoop(o, reducer);
  }
  void run(OuterLoop& loop, int64_t from, int64_t to, double lr = 1e-3) {
    for (step = from; step <= to; ++step) loop.after_step(step, lr, params);
  }
};

}  // namespace

TEST(OuterLoop, FragmentsSyncStaggeredFromTheWarmUpOffset) {
  Fixture f;
  auto loop = f.make({.inner_steps = 4, .fragments = 2});
  loop.start(f.params, /*offset=*/10);  // a 10-step data-parallel warm-up came first
  ASSERT_EQ(loop.units().size(), 2u);
  EXPECT_EQ(loop.units()[0].params, (std::vector<size_t>{0, 1}));  // embed + block 0
  EXPECT_EQ(loop.units()[1].params, (std::vector<size_t>{2}));     // block 1
  f.run(loop, 11, 22);
  using P = std::pair<int64_t, size_t>;
  EXPECT_EQ(f.sends, (std::vector<P>{{14, 2}, {16, 1}, {18, 2}, {20, 1}, {22, 2}}));
  EXPECT_EQ(loop.outer_steps(), 5);
  EXPECT_TRUE(loop.quiescent());
}

TEST(OuterLoop, QsrSyncsLessOftenAsTheLearningRateDecays) {
  Fixture f;
  auto loop = f.make({.inner_steps = 4, .qsr_alpha = 0.004});
  loop.start(f.params, 0);
  loop.after_step(1, 2e-3, f.params);
  EXPECT_EQ(loop.inner_steps_now(), 4);  // (0.004 / 0.002)^2 = 4
  loop.after_step(2, 1e-3, f.params);
  EXPECT_EQ(loop.inner_steps_now(), 16);
  f.run(loop, 3, 15);
  EXPECT_TRUE(f.sends.empty());
  f.run(loop, 16, 16);
  EXPECT_EQ(f.sends.size(), 1u);
}

TEST(OuterLoop, OverlappedExchangesLandTauStepsLaterAndMerge) {
  Fixture f;
  auto loop = f.make({.inner_steps = 4, .overlap_steps = 1, .merge_alpha = 0.5, .outer = {1.0, 0.0}});
  loop.start(f.params, 0);
  f.run(loop, 1, 3);
  for (auto& [name, p] : f.params) p.fill_(1.0);  // trained to 1 by the time of the send at step 4
  f.step = 4;
  loop.after_step(4, 1e-3, f.params);
  EXPECT_FALSE(loop.quiescent());
  for (auto& [name, p] : f.params) p.fill_(3.0);  // one more step of training while in flight
  EXPECT_TRUE(loop.after_step(5, 1e-3, f.params));
  EXPECT_TRUE(loop.quiescent());
  // lr 1, momentum 0, one replica: the new global is the sent local (1); merged 0.5 * 3 + 0.5 * 1
  for (auto& [name, p] : f.params) EXPECT_TRUE(torch::allclose(p, torch::full_like(p, 2.0))) << name;
  for (auto& [name, g] : loop.globals()) EXPECT_TRUE(torch::allclose(g, torch::ones_like(g))) << name;
}

TEST(OuterLoop, FinishSyncsPendingInnerSteps) {
  Fixture f;
  auto loop = f.make({.inner_steps = 4, .fragments = 2});
  loop.start(f.params, 0);
  f.run(loop, 1, 5);  // unit 0 at 4; unit 1 (offset 2) due at 6
  f.step = 5;
  EXPECT_TRUE(loop.finish(5, f.params));
  using P = std::pair<int64_t, size_t>;
  EXPECT_EQ(f.sends, (std::vector<P>{{4, 2}, {5, 2}, {5, 1}}));
}

TEST(OuterLoop, TheRampSyncsOftenFirstAndReachesHAtRampSteps) {
  Fixture f;
  auto loop = f.make({.inner_steps = 8, .ramp_steps = 16});
  loop.start(f.params, /*offset=*/4);  // after a 4-step warm-up: the ramp counts from there
  f.run(loop, 5, 40);
  std::vector<int64_t> at;
  for (const auto& s : f.sends) at.push_back(s.first);
  // Round lengths max(1, round(8 * s / 16)) for rounds beginning s steps in: 1, 1, 1, 2, 3, 4, 6, then 8 (s >= 16).
  EXPECT_EQ(at, (std::vector<int64_t>{5, 6, 7, 9, 12, 16, 22, 30, 38}));
  EXPECT_EQ(loop.inner_steps_now(), 8);
}
