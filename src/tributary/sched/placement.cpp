#include "tributary/sched/placement.h"

#include <nlohmann/json.hpp>

#include "tributary/core/error.h"
#include "tributary/core/fs.h"

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

Placement read_placement(const std::string& path) {
  const std::string remedy = "write it with `tributary plan <cluster> <workload> --out " + path + "`";
  Placement p;
  try {
    const auto j = nlohmann::json::parse(read_file(path));
    p.d_dp = j.at("d_dp").get<int>();
    p.d_pp = j.at("d_pp").get<int>();
    p.pipelines = j.at("pipelines").get<std::vector<std::vector<int>>>();
    if (p.d_dp > 0 && p.d_pp > 0 && int64_t(p.d_dp) * p.d_pp <= 4096) {
      p.cluster_device.resize(size_t(p.d_dp * p.d_pp));
      for (size_t r = 0; r < p.cluster_device.size(); ++r) p.cluster_device[r] = int(r);
    }
    if (j.contains("ranks"))
      for (const auto& r : j.at("ranks")) {
        const int rank = r.at("rank").get<int>(), device = r.at("cluster_device").get<int>();
        if (rank < 0 || rank >= int(p.cluster_device.size()) || device < 0)
          fail("'{}': ranks lists rank {} on cluster device {}, outside the placement; {}", path, rank, device, remedy);
        p.cluster_device[size_t(rank)] = device;
      }
  } catch (const nlohmann::json::exception& e) {
    fail("'{}' is not a placement file ({}); {}", path, e.what(), remedy);
  }
  if (p.d_dp < 1 || p.d_pp < 1 || p.d_dp > 4096 || p.d_pp > 4096 || int64_t(p.d_dp) * p.d_pp > 4096)
    fail("'{}': d_dp = {} and d_pp = {} are not a placement's shape; {}", path, p.d_dp, p.d_pp, remedy);
  if (int(p.pipelines.size()) != p.d_dp)
    fail("'{}' lists {} pipelines but d_dp = {}; {}", path, p.pipelines.size(), p.d_dp, remedy);
  std::vector<int> seen(size_t(p.d_dp * p.d_pp), 0);
  for (const auto& pipeline : p.pipelines) {
    if (int(pipeline.size()) != p.d_pp)
      fail("'{}': a pipeline lists {} stages but d_pp = {}; {}", path, pipeline.size(), p.d_pp, remedy);
    for (int rank : pipeline) {
      if (rank < 0 || rank >= int(seen.size()) || seen[size_t(rank)]++)
        fail("'{}': rank {} is out of range or placed twice (ranks 0..{} each once); {}", path, rank, seen.size() - 1,
             remedy);
    }
  }
  return p;
}

}  // namespace tributary::sched
