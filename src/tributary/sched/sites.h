// Sites for islands (runtime/sync/island_sync.h): a cluster file's regions, in device order, as the islands a replica
// run would use (parallel.islands): devices of one region are joined by its fast links, regions by the slow ones. A
// launch numbers each machine's ranks consecutively, so a region's devices must be consecutive in the file. No
// LibTorch.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tributary/sched/cluster.h"

namespace tributary::sched {

struct Site {
  std::string region;
  int first_device = 0, devices = 0;
};

// The regions in order of their first device. An Error naming the region and two of its devices when a region's
// devices are not consecutive, or when the file names no regions.
std::vector<Site> sites_of(const Cluster& cluster, const std::string& origin);

// "4,4,2": the sizes as parallel.islands takes them.
std::string islands_key(const std::vector<Site>& sites);

// placement.json for islands (`tributary plan --sites --out`), read back through parallel.placement:
//   {"kind": "islands", "islands": [4, 4], "regions": ["Ohio", "Seoul"],
//    "ranks": [{"rank": 0, "island": 0, "region": "Ohio"}, ...]}
std::string island_placement_json(const std::vector<Site>& sites);
// The island sizes of an islands placement file, as parallel.islands takes them ("4,4"); nullopt for a pipeline
// placement (no "kind": "islands"). An Error naming the file when it is not JSON or its islands are not sizes >= 1
// of at most 4,096 ranks in all.
std::optional<std::string> read_island_placement(const std::string& path);

}  // namespace tributary::sched
