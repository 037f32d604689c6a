// The average check (comm/average_check.h) on the real engine: two ranks as threads, Gloo groups over one store, the
// ResilientAverage the replicas use. An honest round passes with the plain average; a change of one rank's update
// after the check saw it — what a stranger on the path would do — fails the round on both ranks, naming it; a change
// below the collective's rounding passes. Only the run's key draws the projection.
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <string>

#include "support/averaging_rank.h"
#include "support/thread_ranks.h"
#include "tributary/comm/average_check.h"
#include "tributary/core/error.h"

using namespace tributary;
using namespace std::chrono_literals;

namespace {

std::vector<torch::Tensor> update_of(int rank) {  // a private generator: the ranks are threads of one process
  auto generator = at::detail::createCPUGenerator(uint64_t(100 + rank));
  return {at::randn({1000}, generator), at::randn({7, 3}, generator)};
}

}  // namespace

TEST(AverageCheck, AChangeInFlightFailsTheRoundOnEveryRankAndRoundingPasses) {
  const auto key = comm::random_run_key();
  const auto tolerance = comm::AverageCheck::tolerance_of("fp32", 2);
  ASSERT_TRUE(tolerance.has_value());
  std::vector<torch::Tensor> mean;
  {
    const auto a = update_of(0), b = update_of(1);
    for (size_t i = 0; i < a.size(); ++i) mean.push_back((a[i] + b[i]) / 2);
  }
  auto store = c10::make_intrusive<c10d::HashStore>();
  test_support::run_threads(2, [&](int r) {
    test_support::AveragingRank rank(store, r, 2);
    ResilientAverage& average = rank.average;
    average.check_averages(std::make_unique<comm::AverageCheck>(key, *tolerance, 20s));

    auto honest = average.wait(average.start(update_of(r)));
    for (size_t i = 0; i < honest.size(); ++i)
      EXPECT_TRUE(torch::allclose(honest[i], mean[i], 1e-6, 1e-7)) << "rank " << r << " tensor " << i;

    if (r == 1) average.set_wire_tamper([](std::vector<torch::Tensor>& t) { t[0][5] += 1e-12; });
    EXPECT_NO_THROW(average.wait(average.start(update_of(r)))) << "a change below rounding is no change";

    if (r == 1) average.set_wire_tamper([](std::vector<torch::Tensor>& t) { t[0][5] += 0.05; });
    try {
      average.wait(average.start(update_of(r)));
      ADD_FAILURE() << "rank " << r << " applied an average whose traffic was changed in flight";
    } catch (const NetworkError& e) {
      EXPECT_NE(std::string(e.what()).find("changed in flight"), std::string::npos) << e.what();
    }
  });
}

TEST(AverageCheck, OnlyTheRunsKeyDrawsTheProjectionAndOnlyLinearCodecsAreChecked) {
  const std::vector<torch::Tensor> t = update_of(0);
  const comm::AverageCheck ours(comm::random_run_key(), 1e-6, 1s), theirs(comm::random_run_key(), 1e-6, 1s);
  EXPECT_NE(ours.project(t, "a0"), theirs.project(t, "a0"));
  EXPECT_NE(ours.project(t, "a0"), ours.project(t, "a1")) << "every round draws its own vector";
  EXPECT_EQ(ours.project(t, "a0"), ours.project(t, "a0"));
  for (const std::string codec : {"fp32", "fp16", "bf16"}) EXPECT_TRUE(comm::AverageCheck::tolerance_of(codec, 4));
  for (const std::string codec : {"int8", "fp4", "terngrad", "topk", "sparseloco", "powersgd"})
    EXPECT_FALSE(comm::AverageCheck::tolerance_of(codec, 4)) << codec;
}
