// k-means for DiPaCo's generative routing: k-means++ initialisation from a seeded SplitMix64 (the same seed gives the
// same centroids on any machine), Lloyd iterations, and optional size balancing: the assignment then fills clusters
// greedily by distance up to ceil(N / k * (1 + slack)) members each, so no path is starved of data.
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace tributary {

struct KMeansOptions {
  int64_t k = 2;
  int64_t iterations = 30;
  uint64_t seed = 0;
  bool balanced = false;
  double slack = 0.1;  // balanced: clusters may hold up to (1 + slack) N / k points
};

struct KMeansResult {
  torch::Tensor centroids;   // (k, C) float32
  torch::Tensor assignment;  // (N) int64
  double inertia = 0;        // mean squared distance to the assigned centroid
};

KMeansResult kmeans(const torch::Tensor& x, const KMeansOptions& options);                // x: (N, C) float32, N >= k
torch::Tensor squared_distances(const torch::Tensor& x, const torch::Tensor& centroids);  // (N, k)
// Greedy capacity-constrained assignment: points take their nearest cluster that still has room.
torch::Tensor balanced_assignment(const torch::Tensor& distances, int64_t capacity);

}  // namespace tributary
