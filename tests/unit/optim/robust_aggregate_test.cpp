// Robust aggregation (optim/robust_aggregate.h): the checks refuse
// what they name (non-finite, too large, too small, a replay, a copy); and on the real engine (ranks as threads, Gloo
// over one store) every rank applies the same aggregate from the all-gathered updates, one of them lying.
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <cmath>

#include "support/averaging_rank.h"
#include "support/thread_ranks.h"
#include "tributary/optim/adversary.h"
#include "tributary/optim/robust_aggregate.h"

using namespace tributary;

namespace {

torch::Tensor vec(std::vector<float> v) { return torch::tensor(v, torch::kFloat32); }

AggregateOptions rule(const std::string& name) {
  AggregateOptions o;
  o.rule = name;
  o.memory = 0;
  return o;
}

// The median with loss scores: refused below a rating of 0.2, evicted after 2 exchanges in a row.
AggregateOptions loss_scored() {
  AggregateOptions o = rule("median");
  o.loss_scores = true;
  o.min_score = 0.2;
  o.evict_after = 2;
  return o;
}

}  // namespace

TEST(RobustAggregate, ChecksRefuseWhatTheyNameAndTheRuleTakesTheRest) {
  AggregateOptions o;
  o.rule = "mean";
  o.norm_factor = 10;
  RobustAggregate agg(o);
  auto g = at::detail::createCPUGenerator(7);
  std::vector<torch::Tensor> honest;
  for (int i = 0; i < 4; ++i) honest.push_back(at::randn({5000}, g));
  auto nan = honest[0].clone();
  nan[3] = NAN;
  std::vector<torch::Tensor> round1 = {honest[0], honest[1], honest[2], honest[3] * 100, nan};
  Aggregated a = agg.combine(round1, {0, 1, 2, 3, 4});
  ASSERT_EQ(a.refused.size(), 2u);
  EXPECT_EQ(a.refused[0].participant, 3);
  EXPECT_NE(a.refused[0].reason.find("above 10 x the round's median"), std::string::npos) << a.refused[0].reason;
  EXPECT_EQ(a.refused[1].participant, 4);
  EXPECT_EQ(a.refused[1].reason, "non-finite values");
  EXPECT_EQ(a.accepted, 3);
  EXPECT_TRUE(torch::allclose(a.value, (honest[0] + honest[1] + honest[2]) / 3, 1e-6, 1e-6));

  // Round 2: a free rider's zeros, a replay of participant 1's round-1 update, a copy of participant 0's.
  std::vector<torch::Tensor> fresh;
  for (int i = 0; i < 2; ++i) fresh.push_back(at::randn({5000}, g));
  Aggregated b =
      agg.combine({fresh[0], honest[1].clone(), torch::zeros({5000}), fresh[1], honest[0].clone()}, {0, 1, 2, 3, 4});
  ASSERT_EQ(b.refused.size(), 3u);
  EXPECT_EQ(b.refused[0].participant, 1);
  EXPECT_NE(b.refused[0].reason.find("participant 1's update of 1 round(s) before"), std::string::npos)
      << b.refused[0].reason;
  EXPECT_EQ(b.refused[1].participant, 2);
  EXPECT_NE(b.refused[1].reason.find("below the round's median"), std::string::npos) << b.refused[1].reason;
  EXPECT_EQ(b.refused[2].participant, 4);
  EXPECT_NE(b.refused[2].reason.find("participant 0's update"), std::string::npos) << b.refused[2].reason;
  EXPECT_TRUE(torch::allclose(b.value, (fresh[0] + fresh[1]) / 2, 1e-6, 1e-6));
}

// Loss scores (dist.score = "loss"): each round moves a participant's rating a quarter of the way to its improvement /
// the round's (upper) median improvement; a rating below min_score refuses the update before the rule, and
// evict_after such rounds in a row evict. A round whose median does not improve rates nobody.
TEST(RobustAggregate, LossRatingsRefuseAndEvictAnUpdateThatDoesNotLowerTheLoss) {
  const AggregateOptions o = loss_scored();
  RobustAggregate agg(o);
  auto g = at::detail::createCPUGenerator(11);
  auto round = [&] {
    std::vector<torch::Tensor> xs;
    for (int i = 0; i < 4; ++i) xs.push_back(at::randn({64}, g));
    return xs;
  };
  const std::vector<int> ids = {0, 1, 2, 3};
  std::vector<double> none = {-0.1, -0.2, -0.3, -0.4};  // nobody lowered the loss: no information
  Aggregated a = agg.combine(round(), ids, &none);
  EXPECT_EQ(a.scores, (std::vector<double>{1, 1, 1, 1}));
  EXPECT_TRUE(a.refused.empty());

  std::vector<double> first = {1.0, 1.2, 0.8, -0.5};  // median (upper) 1.0
  a = agg.combine(round(), ids, &first);
  EXPECT_TRUE(a.refused.empty()) << a.refused[0].reason;
  ASSERT_EQ(a.scores.size(), 4u);
  EXPECT_DOUBLE_EQ(a.scores[1], 1.05);
  EXPECT_DOUBLE_EQ(a.scores[3], 0.625);  // a quarter of the way from 1 to -0.5

  std::vector<double> second = {1.0, 1.0, 1.0, -1.0};
  a = agg.combine(round(), ids, &second);
  EXPECT_TRUE(a.refused.empty()) << "one more bad round leaves it at 0.22";
  EXPECT_DOUBLE_EQ(a.scores[3], 0.21875);
  const auto xs = round();
  a = agg.combine(xs, ids, &second);
  ASSERT_EQ(a.refused.size(), 1u);
  EXPECT_EQ(a.refused[0].participant, 3);
  EXPECT_NE(a.refused[0].reason.find("a loss rating of -0.09 below dist.min_score = 0.2"), std::string::npos)
      << a.refused[0].reason;
  EXPECT_EQ(a.scores[3], -1);
  EXPECT_TRUE(torch::allclose(a.value, make_merge_rule(o)->merge({xs[0], xs[1], xs[2]}))) << "the rule without it";
  EXPECT_TRUE(a.evicted.empty());

  a = agg.combine(round(), ids, &second);
  EXPECT_EQ(a.evicted, std::vector<int>{3});
  a = agg.combine(round(), ids, &first);  // from now on refused whatever it brings
  ASSERT_EQ(a.refused.size(), 1u);
  EXPECT_NE(a.refused[0].reason.find("rated by the loss it brings on a probe batch"), std::string::npos)
      << a.refused[0].reason;
  for (int i = 0; i < 3; ++i) EXPECT_GE(a.scores[size_t(i)], 0.9) << i;
}

// The replay sends again what it sent two exchanges before (so it cycles through its first two); the stale one sends
// its honest update of two exchanges before, which nobody has seen. An exchange of other shapes on the same stream
// (a warm-up's gradients, then DiLoCo's pseudo-gradients) starts their memory afresh instead of failing.
TEST(Adversary, AReplayRepeatsWhatItSentAndAStaleOneSendsItsOldHonestUpdate) {
  auto sent = [](Adversary& a, std::vector<torch::Tensor> u) {
    a.corrupt(u, 0);
    return u.front()[0].item<float>();
  };
  Adversary replay("replay", 1), stale("stale", 1);
  std::vector<float> replayed, delayed;
  for (float x : {1.f, 2.f, 3.f, 4.f, 5.f}) {
    replayed.push_back(sent(replay, {vec({x, x})}));
    delayed.push_back(sent(stale, {vec({x, x})}));
  }
  EXPECT_EQ(replayed, (std::vector<float>{1, 2, 1, 2, 1}));
  EXPECT_EQ(delayed, (std::vector<float>{1, 2, 1, 2, 3}));
  EXPECT_EQ(sent(replay, {vec({7}), vec({8})}), 7.f);  // new shapes: honest twice, then the replay again
  EXPECT_EQ(sent(replay, {vec({9}), vec({8})}), 9.f);
  EXPECT_EQ(sent(replay, {vec({6}), vec({8})}), 7.f);
  Adversary copy("copy", 1);
  copy.saw(vec({4, 4, 4}), 0);
  EXPECT_EQ(sent(copy, {vec({1, 1})}), 1.f);  // what it saw is not this exchange's length: honest
  copy.saw(vec({4, 5}), 0);
  EXPECT_EQ(sent(copy, {vec({1, 1})}), 4.f);
}

// With loss scores an update that lowers the probe's loss as much as the others (rated 1) but points nowhere near the
// round's aggregate (Gaussian noise lowers the loss by a sliver either way) strikes by its cosine: evicted at the
// evict_after-th exchange, the reason naming the cosine.
TEST(RobustAggregate, WithLossScoresAnUpdateFarFromTheAggregateStrikesByItsCosine) {
  const AggregateOptions o = loss_scored();
  RobustAggregate agg(o);
  auto g = at::detail::createCPUGenerator(12);
  const auto direction = at::randn({4096}, g);
  const std::vector<int> ids = {0, 1, 2, 3};
  const std::vector<double> alike = {1.0, 1.0, 1.0, 1.0};
  Aggregated a;
  for (int exchange = 0; exchange < 2; ++exchange) {
    std::vector<torch::Tensor> xs;
    for (int i = 0; i < 3; ++i) xs.push_back(direction + 0.3 * at::randn({4096}, g));
    xs.push_back(at::randn({4096}, g) * direction.norm() / 64.0);  // the honest norm, no direction
    a = agg.combine(xs, ids, &alike);
    EXPECT_TRUE(a.refused.empty());
    EXPECT_EQ(a.scores, (std::vector<double>{1, 1, 1, 1})) << "the loss ratings say nothing against it";
  }
  ASSERT_EQ(a.evicted, std::vector<int>{3});
  std::vector<torch::Tensor> xs(4, direction);
  a = agg.combine(xs, ids, &alike);
  ASSERT_EQ(a.refused.size(), 1u);
  EXPECT_NE(a.refused[0].reason.find("the last at a cosine of"), std::string::npos) << a.refused[0].reason;
}

// Four ranks as threads on Gloo, int8 on the wire: rank 3 sends its update x -100 (a scaled sign flip). With the
// mean on the ring the lie moves every rank's result; with the median every rank applies the same value, within
// the honest updates' range, and the scaled one is refused by name.
TEST(RobustAggregate, EveryRankAppliesTheSameRobustAggregateOfTheGatheredUpdates) {
  auto update_of = [](int r) {
    return std::vector<torch::Tensor>{at::randn({4000}, at::detail::createCPUGenerator(50 + r)) + 1.0};
  };
  for (const std::string name : {"mean", "median"}) {
    AggregateOptions o;
    o.rule = name;
    o.norm_factor = name == "median" ? 10 : 0;
    auto store = c10::make_intrusive<c10d::HashStore>();
    std::vector<torch::Tensor> results(4);
    std::vector<int64_t> refused(4);
    test_support::run_threads(4, [&](int r) {
      test_support::AveragingRank rank(store, r, 4, o, comm::ExchangeOptions{.codec = "int8"});
      if (r == 3) rank.average.set_adversary(std::make_unique<Adversary>("scaled", 1));
      auto mine = update_of(r);
      if (r == 3) mine[0].neg_();
      results[size_t(r)] = rank.average.wait(rank.average.start(mine))[0];
      refused[size_t(r)] = rank.average.take_rejected();
    });
    for (int r = 1; r < 4; ++r) EXPECT_TRUE(torch::equal(results[0], results[size_t(r)])) << name << " rank " << r;
    const double mean_value = results[0].mean().item<double>();
    if (name == "mean") {
      EXPECT_LT(mean_value, -20) << "the ring's mean follows the liar: (3 x 1 - 100) / 4";
    } else {
      EXPECT_NEAR(mean_value, 1.0, 0.1) << "the median of the three honest updates, about 1";
      EXPECT_EQ(refused[0], 1);
    }
  }
}
