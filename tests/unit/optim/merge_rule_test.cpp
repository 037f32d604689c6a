// The merge rules (optim/merge_rule.h): each against a vector worked out by hand, the sorting network against torch's
// sort, and the fixed-order norm whatever the thread count.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "tributary/optim/merge_rule.h"

using namespace tributary;

namespace {

torch::Tensor vec(std::vector<float> v) { return torch::tensor(v, torch::kFloat32); }

torch::Tensor apply_rule(const std::vector<torch::Tensor>& xs, const AggregateOptions& o) {
  return make_merge_rule(o)->merge(xs);
}

// Five participants, coordinate by coordinate: one outlier each column (100 in the first, -50 in the third).
std::vector<torch::Tensor> five() {
  return {vec({1, 2, 3}), vec({2, 4, 6}), vec({3, 6, 9}), vec({4, 8, 12}), vec({100, 10, -50})};
}

}  // namespace

TEST(MergeRule, EachRuleAgainstAKnownVector) {
  const auto xs = five();
  auto mean = apply_rule(xs, AggregateOptions{.rule = "mean"});
  EXPECT_TRUE(torch::allclose(mean, vec({22, 6, -4}))) << mean;
  // Sorted columns: {1,2,3,4,100}, {2,4,6,8,10}, {-50,3,6,9,12}.
  auto median = apply_rule(xs, AggregateOptions{.rule = "median"});
  EXPECT_TRUE(torch::equal(median, vec({3, 6, 6}))) << median;
  auto trimmed = apply_rule(xs, AggregateOptions{.rule = "trimmed_mean"});  // 0.2 x 5: one off each end
  EXPECT_TRUE(torch::allclose(trimmed, vec({3, 6, 6}))) << trimmed;
  auto even = apply_rule({vec({1}), vec({2}), vec({10}), vec({4})}, AggregateOptions{.rule = "median"});
  EXPECT_FLOAT_EQ(even[0].item<float>(), 3.0f);  // the two middle values' mean

  // Centered clip with tau = 1 from the median m = (3,6,6): the outlier's pull is at most tau / n per iteration.
  AggregateOptions clip{.rule = "centered_clip"};
  clip.clip_radius = 1;
  clip.clip_iterations = 1;
  auto v = apply_rule(xs, clip);
  auto m = vec({3, 6, 6});
  auto expected = torch::zeros({3});
  for (const auto& x : xs) {
    auto d = x - m;
    const double n = d.norm().item<double>();
    expected += d * (n > 1 ? 1 / n : 1.0);
  }
  expected = m + expected / 5;
  EXPECT_TRUE(torch::allclose(v, expected, 1e-6, 1e-6)) << v << expected;
  EXPECT_LT((v - m).norm().item<double>(), 1.0) << "one iteration moves the median by at most tau";
  // Large tau: every difference kept, one iteration lands on the mean.
  clip.clip_radius = 1e9;
  EXPECT_TRUE(torch::allclose(apply_rule(xs, clip), mean, 1e-5, 1e-5));
}

// The rules sort a few participants' values with a network of min/max and many with torch's sort: both give every
// coordinate's sorted values, so the same bits as sorting the stacked updates and summing the kept rows.
TEST(MergeRule, TheRulesSortFewAndManyUpdatesAlike) {
  for (int n : {2, 3, 4, 5, 7, 12, 13, 20}) {
    std::vector<torch::Tensor> xs;
    for (int i = 0; i < n; ++i) xs.push_back(at::randn({30001}, at::detail::createCPUGenerator(uint64_t(900 + i))));
    xs[0][5] = 1e30;  // an outlier and ties
    xs[n - 1][7] = xs[0][7];
    AggregateOptions trimmed{.rule = "trimmed_mean"}, median{.rule = "median"};
    trimmed.chunk = median.chunk = 10000;
    const auto sorted = std::get<0>(torch::stack(xs).sort(0));
    const int64_t trim = int64_t(std::floor(0.2 * n));  // below half of n
    const auto kept = sorted.narrow(0, trim, n - 2 * trim);
    auto expected = kept[0].clone();
    for (int64_t k = 1; k < kept.size(0); ++k) expected.add_(kept[k]);
    expected.div_(double(n - 2 * trim));
    EXPECT_TRUE(torch::equal(apply_rule(xs, trimmed), expected)) << n;
    const auto middle = n % 2 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) * 0.5;
    EXPECT_TRUE(torch::equal(apply_rule(xs, median), middle)) << n;
  }
}

TEST(MergeRule, NormsAreTheSameWhateverTheThreads) {
  auto x = at::randn({300001}, at::detail::createCPUGenerator(3));
  const int before = at::get_num_threads();
  at::set_num_threads(1);
  const double one = norm_of(x);
  at::set_num_threads(std::max(2, before));
  EXPECT_EQ(one, norm_of(x));
  at::set_num_threads(before);
  EXPECT_NEAR(one, x.to(torch::kFloat64).norm().item<double>(), 1e-9 * one);
}
