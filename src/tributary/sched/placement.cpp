#include "tributary/sched/placement.h"

#include <nlohmann/json.hpp>

namespace tributary::sched {

std::string placement_json(const Cluster& cluster, const Evaluation& e, int d_dp, int d_pp,
                           const std::vector<int>& cluster_device) {
  nlohmann::json ranks = nlohmann::json::array();
  std::vector<nlohmann::json> by_rank(static_cast<size_t>(cluster.size()));
  for (int pipeline = 0; pipeline < d_dp; ++pipeline)
    for (int stage = 0; stage < d_pp; ++stage) {
      int rank = e.pipelines[pipeline][stage];
      by_rank[rank] = {{"rank", rank},
                       {"stage", stage},
                       {"pipeline", pipeline},
                       {"cluster_device", cluster_device.empty() ? rank : cluster_device[rank]},
                       {"region", cluster.devices[rank].region}};
    }
  for (auto& r : by_rank) ranks.push_back(r);
  nlohmann::json out = {{"format", "tributary-placement"},
                        {"version", 1},
                        {"cluster", cluster.name},
                        {"d_dp", d_dp},
                        {"d_pp", d_pp},
                        {"stage_order", e.stage_order},
                        {"pipelines", e.pipelines},
                        {"ranks", ranks},
                        {"cost_s", {{"dp", e.dp}, {"pp", e.pp}, {"total", e.total}}}};
  return out.dump(2) + "\n";
}

}  // namespace tributary::sched
