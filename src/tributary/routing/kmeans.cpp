#include "tributary/routing/kmeans.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "tributary/core/error.h"
#include "tributary/core/rng.h"

namespace tributary {

torch::Tensor squared_distances(const torch::Tensor& x, const torch::Tensor& centroids) {
  // |x - c|^2 = |x|^2 - 2 x.c + |c|^2, clamped at 0 against rounding.
  auto xx = x.pow(2).sum(1, true);
  auto cc = centroids.pow(2).sum(1).unsqueeze(0);
  return (xx - 2 * x.mm(centroids.t()) + cc).clamp_min(0);
}

torch::Tensor balanced_assignment(const torch::Tensor& distances, int64_t capacity) {
  const int64_t n = distances.size(0), k = distances.size(1);
  if (capacity * k < n) fail("balanced k-means: capacity {} x {} clusters cannot hold {} points", capacity, k, n);
  auto d = distances.contiguous().to(torch::kFloat64);
  const double* dp = d.data_ptr<double>();
  std::vector<int64_t> order(static_cast<size_t>(n * k));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return dp[a] < dp[b]; });
  std::vector<int64_t> count(static_cast<size_t>(k), 0);
  auto out = torch::full({n}, -1, torch::kInt64);
  auto* op = out.data_ptr<int64_t>();
  int64_t assigned = 0;
  for (int64_t idx : order) {
    const int64_t i = idx / k, c = idx % k;
    if (op[i] >= 0 || count[c] >= capacity) continue;
    op[i] = c;
    count[c] += 1;
    if (++assigned == n) break;
  }
  return out;
}

KMeansResult kmeans(const torch::Tensor& x_in, const KMeansOptions& o) {
  torch::NoGradGuard no_grad;
  auto x = x_in.to(torch::kFloat32).contiguous();
  const int64_t n = x.size(0), k = o.k;
  if (k < 1 || n < k) fail("k-means: {} points cannot form {} clusters; route more data or use fewer modules", n, k);
  SplitMix64 rng(o.seed * 0x9E3779B97F4A7C15ULL + 17);
  // k-means++: the first centre uniformly, each next one with probability proportional to D(x)^2.
  std::vector<int64_t> chosen{static_cast<int64_t>(rng.below(static_cast<uint64_t>(n)))};
  auto best = squared_distances(x, x.index({torch::tensor(chosen)})).select(1, 0).to(torch::kFloat64).contiguous();
  while (static_cast<int64_t>(chosen.size()) < k) {
    const double* bp = best.data_ptr<double>();
    double total = 0;
    for (int64_t i = 0; i < n; ++i) total += bp[i];
    int64_t pick = n - 1;
    if (total > 0) {
      double r = double(rng.next() >> 11) * 0x1.0p-53 * total;
      for (int64_t i = 0; i < n; ++i) {
        r -= bp[i];
        if (r < 0) {
          pick = i;
          break;
        }
      }
    } else {
      pick = static_cast<int64_t>(rng.below(static_cast<uint64_t>(n)));
    }
    chosen.push_back(pick);
    auto d =
        squared_distances(x, x.index({torch::tensor(std::vector<int64_t>{pick})})).select(1, 0).to(torch::kFloat64);
    best = torch::minimum(best, d).contiguous();
  }
  auto centroids = x.index({torch::tensor(chosen)}).clone();
  const int64_t capacity = static_cast<int64_t>(std::ceil(double(n) / double(k) * (1.0 + o.slack)));
  torch::Tensor assignment;
  for (int64_t it = 0; it < o.iterations; ++it) {
    auto d = squared_distances(x, centroids);
    auto next = o.balanced ? balanced_assignment(d, capacity) : d.argmin(1);
    if (assignment.defined() && next.equal(assignment)) break;
    assignment = next;
    auto sums = torch::zeros_like(centroids).index_add_(0, assignment, x);
    auto counts = torch::zeros({k}, torch::kFloat32).index_add_(0, assignment, torch::ones({n}, torch::kFloat32));
    auto empty = counts == 0;
    // An empty cluster keeps its centre (only possible without balancing).
    centroids = torch::where(empty.unsqueeze(1), centroids, sums / counts.clamp_min(1).unsqueeze(1));
  }
  auto d = squared_distances(x, centroids);
  if (!assignment.defined()) assignment = o.balanced ? balanced_assignment(d, capacity) : d.argmin(1);
  const double inertia = d.gather(1, assignment.unsqueeze(1)).mean().item<double>();
  return {centroids, assignment, inertia};
}

}  // namespace tributary
