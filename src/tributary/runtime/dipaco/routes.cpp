#include "tributary/runtime/dipaco/routes.h"

#include "tributary/core/error.h"
#include "tributary/runtime/inference.h"
#include "tributary/runtime/json_file.h"

namespace tributary {

int64_t Routes::route_sequence(std::vector<int32_t> ids, int32_t eot_id, const torch::Device& device) const {
  if (ids.empty()) ids.push_back(eot_id);
  auto units = torch::tensor(std::vector<int64_t>(ids.begin(), ids.end()), torch::kInt64).unsqueeze(0);
  return router.route(routing_features(*feature_model, units, device), 1).item<int64_t>();
}

Routes load_routes(const fs::path& dir, const torch::Device& device) {
  if (!fs::exists(dir / "route.json"))
    fail("'{}' is not a complete routes directory (no route.json); write one with `tributary route`", dir.string());
  Routes r;
  r.dir = dir;
  r.info = with_json_file(dir / "route.json", "write the routes again with `tributary route`",
                          [](nlohmann::json j) { return j; });
  r.router = Router::load(dir / "router.safetensors");
  auto loaded = load_model((dir / "features").string(), device);
  r.feature_model = loaded.model;
  r.feature_model->eval();
  return r;
}

}  // namespace tributary
