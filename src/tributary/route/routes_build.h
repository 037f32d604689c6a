// `tributary route`: builds a routes directory (router.h describes its layout) from a dense feature model and a
// dataset. Every unit of the train split goes to its top-`overlap` paths (overlapping shards, training only); every
// validation unit to its best path. The directory is assembled under a temp name and renamed when complete.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "tributary/core/fs.h"
#include "tributary/routing/router.h"
#include "tributary/routing/units.h"

namespace tributary {

struct RouteOptions {
  std::string model;               // dense checkpoint (or run directory) whose hidden states are the features
  std::string data;                // dataset directory
  std::string modules = "2x2";     // grid: modules per level
  std::string method = "product";  // kmeans | product
  bool balanced = true;            // size-balanced k-means
  int64_t overlap = 1;             // top-k paths per training unit
  uint64_t seed = 0;
  int64_t iterations = 30;
  int64_t context = 0;        // unit length - 1; 0: the feature model's context
  int64_t fit_units = 20000;  // k-means is fitted on at most this many training units (all are routed)
  fs::path out;
  bool overwrite = false;
  std::string device = "cpu";
};

// Returns the report (also written to OUT/report.json).
nlohmann::json build_routes(const RouteOptions& options);

// Writes the per-path datasets, report.json and route.json into `out` (atomically) for an already fitted router.
// `features_dir`: the checkpoint copied as the feature model. `routes_train`: (N, overlap), `routes_val`: (M, 1).
nlohmann::json write_routes(const fs::path& out, const Router& router, const fs::path& features_dir,
                            const Dataset& dataset, const Units& train, const torch::Tensor& routes_train,
                            const Units& val, const torch::Tensor& routes_val, nlohmann::json info, bool overwrite);

// How units of each source domain spread over the paths: table[domain][path] = units.
using Confusion = std::vector<std::vector<int64_t>>;
Confusion confusion_table(const std::vector<uint32_t>& domain, const torch::Tensor& path_of_unit, int64_t num_paths,
                          int64_t num_domains);
// Purity against the source domains: sum over paths of the largest domain count / all units.
double purity(const Confusion& table);

}  // namespace tributary
