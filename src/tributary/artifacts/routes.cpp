#include "tributary/artifacts/routes.h"

#include "tributary/artifacts/inference.h"
#include "tributary/artifacts/json_file.h"
#include "tributary/core/error.h"

namespace tributary {

int64_t Routes::route_sequence(std::vector<int32_t> ids, int32_t eot_id, const torch::Device& device) const {
  if (ids.empty()) ids.push_back(eot_id);
  auto units = torch::tensor(std::vector<int64_t>(ids.begin(), ids.end()), torch::kInt64).unsqueeze(0);
  return router.route(routing_features(*feature_model, units, device), 1).item<int64_t>();
}

RouteInfo read_route_info(const fs::path& dir) {
  const fs::path file = dir / "route.json";
  if (!fs::exists(file))
    fail("'{}' is not a complete routes directory (no route.json); write one with `tributary route`", dir.string());
  const std::string remedy = "write the routes again with `tributary route`";
  return with_json_file(file, remedy, [&](const nlohmann::json& j) {
    if (!j.is_object()) fail("'{}' is not a JSON object; {}", file.string(), remedy);
    if (j.contains("format") && j.at("format") != "tributary-routes")
      fail("'{}' has format {} (expected \"tributary-routes\"); {}", file.string(), j.at("format").dump(), remedy);
    RouteInfo info{j.at("method").get<std::string>(), j.at("modules").get<std::string>(),
                   j.at("context").get<int64_t>(), j.at("data").get<std::string>(), j};
    if (!j.at("context").is_number_integer() || info.context < 1 || info.context > (1 << 20))
      fail("'{}': context {} is not a unit length (1 to 1048576 tokens); {}", file.string(), j.at("context").dump(),
           remedy);
    if (info.modules.empty() || info.data.empty())
      fail("'{}': 'modules' and 'data' must not be empty; {}", file.string(), remedy);
    return info;
  });
}

Routes load_routes(const fs::path& dir, const torch::Device& device) {
  Routes r;
  r.dir = dir;
  r.info = read_route_info(dir);
  r.router = Router::load(dir / "router.safetensors");
  auto loaded = load_model((dir / "features").string(), device);
  r.feature_model = loaded.model;
  r.feature_model->eval();
  return r;
}

}  // namespace tributary
