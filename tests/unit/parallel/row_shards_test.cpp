// Row shards (parallel/row_shards.h) and ZeRO-1's sharded AdamW (optim/adamw.h keep_rows): ranks as threads over an
// in-memory store.
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "support/averaging_rank.h"
#include "support/thread_ranks.h"
#include "tributary/core/row_split.h"
#include "tributary/optim/adamw.h"
#include "tributary/optim/resilient_average.h"
#include "tributary/parallel/row_shards.h"

using namespace tributary;

TEST(RowShards, SplitsAsTorchChunkDoes) {
  for (int64_t rows : {1, 2, 5, 7, 64}) {
    for (int64_t count : {1, 2, 3, 4}) {
      const auto chunks = torch::arange(rows).chunk(count, 0);
      for (int64_t i = 0; i < count; ++i) {
        const RowRange r = row_split(rows, i, count);
        if (size_t(i) < chunks.size()) {
          EXPECT_EQ(r.rows, chunks[size_t(i)].size(0)) << rows << " rows, shard " << i << " of " << count;
          if (r.rows > 0) {
            EXPECT_EQ(r.begin, chunks[size_t(i)][0].item<int64_t>());
          }
        } else {
          EXPECT_EQ(r.rows, 0);
        }
      }
    }
  }
  auto t = torch::arange(10).reshape({5, 2});
  RowShards(1, 2).mine(t).fill_(-1);  // a view: rows 3..4
  EXPECT_EQ(t[3][0].item<int64_t>(), -1);
  EXPECT_EQ(t[2][0].item<int64_t>(), 4);
}

TEST(RowShards, AllGatherMakesEveryRanksTensorsWhole) {
  // Three ranks, two shards: rank 2 holds none and only receives.
  auto store = c10::make_intrusive<c10d::HashStore>();
  const auto want_a = torch::arange(14, torch::kFloat32).reshape({7, 2}), want_b = torch::arange(3, torch::kFloat32);
  test_support::run_threads(3, [&](int r) {
    comm::Group g(store, r, 3);
    auto a = torch::full({7, 2}, -5.0f), b = torch::full({3}, -5.0f);
    if (r < 2) {
      const RowShards mine(r, 2);
      mine.mine(a).copy_(mine.mine(want_a));
      mine.mine(b).copy_(mine.mine(want_b));
    }
    RowShards(0, 2).all_gather(g, {a, b});
    EXPECT_TRUE(torch::equal(a, want_a)) << "rank " << r;
    EXPECT_TRUE(torch::equal(b, want_b)) << "rank " << r;
  });
}

TEST(ZeroOne, ASharedAdamWStepEqualsTheWholeOneBitForBit) {
  // The same parameters and gradients on every rank (data parallel has averaged them): two ranks stepping half the
  // rows each and all-gathering end where one AdamW over all rows does, moments included.
  // Drawn here, not in the ranks' threads: the generator is global.
  torch::manual_seed(3);
  const NamedTensors init = {{"w", torch::randn({5, 4})}, {"g", torch::randn({3})}, {"e", torch::randn({1, 6})}};
  std::vector<std::vector<torch::Tensor>> grads(3);
  for (auto& step : grads)
    for (const auto& [name, t] : init) step.push_back(torch::randn(t.sizes()));
  auto make = [&] {
    NamedTensors p;
    for (const auto& [name, t] : init) p.emplace_back(name, t.clone().set_requires_grad(true));
    return p;
  };
  auto set_grads = [&](NamedTensors& p, int step) {
    for (size_t i = 0; i < p.size(); ++i) p[i].second.mutable_grad() = grads[size_t(step)][i].clone();
  };
  NamedTensors whole = make();
  AdamW reference(whole, AdamWOptions{});
  for (int step = 0; step < 3; ++step) {
    set_grads(whole, step);
    reference.step(1e-2);
  }
  auto store = c10::make_intrusive<c10d::HashStore>();
  test_support::run_threads(2, [&](int r) {
    comm::Group g(store, r, 2);
    NamedTensors p = make();
    AdamW sharded(p, AdamWOptions{});
    sharded.keep_rows(r, 2, [&g](const std::vector<torch::Tensor>& t) { RowShards(0, 2).all_gather(g, t); });
    for (int step = 0; step < 3; ++step) {
      set_grads(p, step);
      sharded.step(1e-2);
    }
    for (size_t i = 0; i < p.size(); ++i)
      EXPECT_TRUE(torch::equal(p[i].second, whole[i].second)) << p[i].first << " on rank " << r;
    const NamedTensors state = sharded.state(), want = reference.state();  // whole again: collective
    ASSERT_EQ(state.size(), want.size());
    for (size_t i = 0; i < state.size(); ++i)
      EXPECT_TRUE(torch::equal(state[i].second, want[i].second)) << state[i].first << " on rank " << r;
  });
}

TEST(WeightedAverage, IslandsOfUnlikeSizeWeighTheirUpdatesByTheirRanks) {
  // Islands of 2 and 1 ranks (3 in all, 2 islands): weights 2 * 2 / 3 and 1 * 2 / 3; the average is then the
  // token-weighted mean (2 * a + b) / 3.
  auto store = c10::make_intrusive<c10d::HashStore>();
  test_support::run_threads(2, [&](int r) {
    test_support::AveragingRank rank(store, r, 2);
    ResilientAverage& average = rank.average;
    average.set_weight(r == 0 ? 4.0 / 3.0 : 2.0 / 3.0);
    std::vector<torch::Tensor> update = {torch::full({3}, r == 0 ? 1.0f : 4.0f)};
    auto result = average.wait(average.start(update));
    EXPECT_TRUE(torch::allclose(result[0], torch::full({3}, 2.0f), 0, 1e-6)) << result[0];
  });
}
