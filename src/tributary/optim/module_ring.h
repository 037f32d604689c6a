// DiPaCo's reduction: the weighted owner ring. Where DiLoCo averages a sync unit across replicas and every replica
// steps the same outer optimizer, a DiPaCo module has one owner (modules dealt over the workers) that holds its
// outer state; one ring per round (Exchange::reduce_update_gather) leaves each owner with the full shard-weighted
// sums of its modules (reduce-scatter), the owner takes the modules' Nesterov steps (optim/module_outer.h), and an
// all-gather brings every change to every worker (an all-reduce's bytes). Weights and path counts go through an
// exact fp64 all-reduce first.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tributary/comm/exchange.h"
#include "tributary/comm/group.h"
#include "tributary/model/tensor_io.h"
#include "tributary/optim/module_outer.h"
#include "tributary/optim/outer.h"

namespace tributary {

struct ModuleRing {
  const std::vector<std::string>& module_ids;                  // every module, in a fixed order
  std::map<std::string, NamedTensors>& global;                 // every module's global parameters (updated)
  const std::map<std::string, ModuleAccumulator>& accumulated;  // this worker's contributions this round
  std::map<std::string, std::unique_ptr<OuterOptimizer>>& owned;  // master copy + momentum of the owned modules
  std::vector<int> owner;                                      // group rank owning each module
  std::string norm_rescale;                                    // dipaco.norm_rescale
};

// One round's reduction and outer steps; every group member calls it with the same modules and owners.
void reduce_and_step(ModuleRing& ring, comm::Group& group, comm::Exchange& exchange);

}  // namespace tributary
