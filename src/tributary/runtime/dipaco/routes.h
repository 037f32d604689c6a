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

// A loaded routes directory: the router plus its feature model.
struct Routes {
  fs::path dir;
  Router router;
  std::shared_ptr<Transformer> feature_model;
  nlohmann::json info;  // route.json
  // The path for one sequence (a prompt), routed by its first 32 tokens; an empty one as a fresh document.
  int64_t route_sequence(std::vector<int32_t> ids, int32_t eot_id, const torch::Device& device) const;
};
Routes load_routes(const fs::path& dir, const torch::Device& device);

}  // namespace tributary
