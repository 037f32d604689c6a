// placement.json: what the pipeline runtime consumes. Rank r runs on device r of the cluster file (after
// --shuffle-ids, of the shuffled labelling; "cluster_device" gives the device index in the file as given).
//   {"d_dp": 8, "d_pp": 8, "stage_order": [...group ids...],
//    "ranks": [{"rank": 0, "stage": 3, "pipeline": 5, "cluster_device": 17, "region": "Ohio"}, ...],
//    "pipelines": [[rank at stage 0, rank at stage 1, ...], ...],
//    "cost_s": {"dp": .., "pp": .., "total": ..}}
#pragma once

#include <string>
#include <vector>

#include "tributary/sched/cluster.h"
#include "tributary/sched/cost_model.h"

namespace tributary::sched {

std::string placement_json(const Cluster& cluster, const Evaluation& evaluation, int d_dp, int d_pp,
                           const std::vector<int>& cluster_device);

// What the runtime reads back: pipelines[i][j] = the rank that runs stage j of pipeline i. Every rank 0..d_dp*d_pp-1
// appears exactly once; anything else (syntax, types, shape, a rank missing or twice) is an Error naming the file.
// cluster_device[rank] = the device of the cluster file as given that the rank emulates (rank itself when the file
// has no "ranks" list or the plan did not shuffle ids).
struct Placement {
  int d_dp = 0, d_pp = 0;
  std::vector<std::vector<int>> pipelines;
  std::vector<int> cluster_device;
};
Placement read_placement(const std::string& path);

}  // namespace tributary::sched
