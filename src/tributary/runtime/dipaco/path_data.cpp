#include "tributary/runtime/dipaco/path_data.h"

#include "tributary/artifacts/routes.h"
#include "tributary/core/error.h"
#include "tributary/data/dataset.h"

namespace tributary {

PathData load_path_data(const fs::path& routes, int64_t path, const RunConfig& config) {
  const fs::path dir = routes / fmt::format("path-{}", path);
  Dataset ds = Dataset::open(dir);
  const int64_t row = config.model.context + 1;
  auto tokens = ds.load_tokens("train");
  const int64_t units = static_cast<int64_t>(tokens.size()) / row;
  const int64_t held =
      config.dipaco.holdout_permille > 0 ? std::max<int64_t>(1, units * config.dipaco.holdout_permille / 1000) : 0;
  const int64_t b = config.train.batch_size;
  if (units - held < b)
    fail(
        "path {}'s shard '{}' has {} training units of {} tokens ({} held out), fewer than one batch of {}: route "
        "with fewer modules, --overlap 2 or balanced k-means, or lower train.batch_size",
        path, dir.string(), units - held, row, held, b);
  PathData d;
  d.vocab_size = ds.vocab_size();
  std::vector<int64_t> h(tokens.end() - held * row, tokens.end());
  d.holdout = held > 0 ? torch::tensor(h, torch::kInt64).reshape({held, row}) : torch::Tensor();
  tokens.resize(static_cast<size_t>((units - held) * row));
  d.weight = double(tokens.size());
  d.train = std::make_shared<const std::vector<uint32_t>>(std::move(tokens));
  return d;
}

std::vector<PathData> load_routed_paths(RunConfig& config, const PathGrid& grid) {
  const fs::path routes = config.dipaco.routes;
  const RouteInfo route_info = read_route_info(routes);
  if (route_info.modules != grid.describe())
    fail("dipaco.routes = '{}' was routed for a {} grid but dipaco.modules = '{}'; route again with --modules {}",
         routes.string(), route_info.modules, grid.describe(), grid.describe());
  if (route_info.context != config.model.context)
    fail("dipaco.routes = '{}' holds units of {} tokens but model.context = {}; route with --context {}",
         routes.string(), route_info.context + 1, config.model.context, config.model.context);
  std::vector<PathData> data;
  for (int64_t p = 0; p < grid.num_paths(); ++p) data.push_back(load_path_data(routes, p, config));
  if (config.model.vocab_size == 0) config.model.vocab_size = data.front().vocab_size;
  return data;
}

}  // namespace tributary
