// DiPaCo's routers (arXiv 2403.10616 §2.3): each routing unit's feature z is the mean last-block hidden state of a
// dense "feature model" over the unit's first 32 tokens; a router scores every path for z.
//   kmeans          one k-means with P = prod K_l centroids; score = -|z - c_p|^2
//   product         z is cut into L interleaved slices of its principal components, one k-means of K_l centroids per
//   level on its slice; path
//                   (m_0, .., m_L-1) scores -sum_l |z_l - c_{l,m_l}|^2 (k^2 paths from two k-means of k)
//   discriminative  a P-class logistic regression on z, trained to predict the path with the lowest loss on a
//                   router split, with a bias that keeps each path's share near 1/P
// Features are standardised (per-dimension mean/std of the routed training units) and rotated onto their principal
// axes before any of them.
// A routes directory (written by `tributary route`) holds:
//   router.safetensors   the router (tensors + metadata: method, grid, context)
//   features/            the feature model as a checkpoint (load_model works on it)
//   path-{p}/            one dataset per path: train = units routed to p (top-k overlap), val = top-1 units
//   report.json          shard sizes, purity and the domain x path confusion table
//   route.json           written last: a directory without it is incomplete
#pragma once

#include <fmt/format.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tributary/core/fs.h"
#include "tributary/core/progress.h"
#include "tributary/model/path_grid.h"
#include "tributary/model/transformer.h"

namespace tributary {

struct Router {
  std::string method;  // kmeans | product | discriminative
  std::vector<int64_t> modules_per_level;
  int64_t context = 0;                   // units are context + 1 tokens
  torch::Tensor mean, std;               // (C)
  torch::Tensor rotation;                // (C, C): principal axes, largest variance first (decorrelates the
                                         // product router's slices, which would otherwise pick correlated pairs)
  std::vector<torch::Tensor> centroids;  // kmeans: {(P, C)}; product: one (K_l, C_l) per level
  torch::Tensor weight, bias;            // discriminative: (P, C), (P)

  int64_t num_paths() const;
  torch::Tensor standardise(const torch::Tensor& features) const;
  torch::Tensor scores(const torch::Tensor& features) const;              // (N, P): higher is better
  torch::Tensor route(const torch::Tensor& features, int64_t top) const;  // (N, top) path ids, best first

  void save(const fs::path& file) const;
  static Router load(const fs::path& file);  // Error naming the file when it is not a router
};

// Columns of the product router's slice for level l: principal components l, l + L, l + 2L, ... (interleaved, so
// every level gets a share of the high-variance directions).
torch::Tensor product_slice(int64_t width, int64_t levels, int64_t level);

// Routing features of units (N, L) int64: mean of model.hidden() over the first min(L, kRoutingPrefix) tokens (N, C).
// `progress` (optional) advances by the units of each batch.
torch::Tensor routing_features(Transformer& model, const torch::Tensor& units, const torch::Device& device,
                               int64_t batch = 128, Progress* progress = nullptr);

}  // namespace tributary
