// How the accepted updates of one exchange or merge become one (dist.aggregate): the seam a robust rule implements.
// RobustAggregate (optim/robust_aggregate.h) decides which updates are accepted and scores them; the rule only
// combines what it is handed.
//   mean           the average
//   trimmed_mean   coordinate by coordinate: drop the floor(trim_fraction x n) largest and smallest values, average the
//                  rest (Yin et al., 2018)
//   median         coordinate by coordinate: the median (the mean of the two middle values for an even count)
//   centered_clip  v = the coordinate-wise median; `clip_iterations` times: v += mean_i of (x_i - v) scaled to
//                  norm <= tau (Karimireddy et al., 2021; hivemind's Byzantine-tolerant averaging); tau = clip_radius,
//                  or the median of ||x_i - median|| when 0
// Every rank that merges the same updates in the same order gets the same bits, whatever its thread count.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "tributary/optim/aggregate_options.h"

namespace tributary {

class MergeRule {
 public:
  virtual ~MergeRule() = default;
  virtual std::string name() const = 0;
  // `accepted`: n >= 1 updates, fp32, one dimension, all of one length. One update is its own merge.
  torch::Tensor merge(const std::vector<torch::Tensor>& accepted) const;

 protected:
  virtual torch::Tensor merge_many(const std::vector<torch::Tensor>& accepted) const = 0;  // n >= 2
};

// The rule options.rule names, with its settings (trim_fraction, clip_radius, clip_iterations, chunk: the coordinates
// sorted at once, which bounds the memory of the coordinate-wise rules).
std::unique_ptr<MergeRule> make_merge_rule(const AggregateOptions& options);

// sqrt(sum x^2) in fp64 summed in a fixed order: the same bits whatever the thread count.
double norm_of(const torch::Tensor& x);
double dot_of(const torch::Tensor& x, const torch::Tensor& y);  // the same, of x . y

}  // namespace tributary
