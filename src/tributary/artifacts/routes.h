// A routes directory loaded for use (routing/router.h describes its layout): the router plus its feature model,
// which is a checkpoint and therefore loaded by the runtime.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "tributary/core/fs.h"
#include "tributary/model/transformer.h"
#include "tributary/routing/router.h"

namespace tributary {

// route.json, the marker of a complete routes directory, with every field checked.
struct RouteInfo {
  std::string method;   // product | kmeans | discriminative ...
  std::string modules;  // the grid it was routed for, e.g. "2x2"
  int64_t context = 0;  // tokens per routed unit, minus one
  std::string data;     // the dataset the units were cut from
  nlohmann::json raw;   // the whole file (a derived route.json starts from it)
};
// An Error naming the file when it is missing, not JSON, or a field is absent, of another type or out of range.
RouteInfo read_route_info(const fs::path& routes_dir);

// A loaded routes directory: the router plus its feature model.
struct Routes {
  fs::path dir;
  Router router;
  std::shared_ptr<Transformer> feature_model;
  RouteInfo info;  // route.json
  // The path for one sequence (a prompt), routed by its first 32 tokens; an empty one as a fresh document.
  int64_t route_sequence(std::vector<int32_t> ids, int32_t eot_id, const torch::Device& device) const;
};
Routes load_routes(const fs::path& dir, const torch::Device& device);

}  // namespace tributary
