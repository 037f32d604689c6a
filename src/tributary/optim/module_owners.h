// Path-local DiPaCo's reduction (dipaco.path_local; the paper's data flow): a worker sends the pseudo-gradient sums of
// the modules its paths touched this round, and only those, each to the module's owner over point-to-point messages;
// the owner adds them to its own, takes the module's Nesterov step (optim/module_outer.h) on its master copy, and
// nobody else learns the result until it fetches the module (runtime/dipaco/module_depot.h). What a worker sends is
// its paths' modules minus the ones it owns, encoded once by `codec` (the owner decodes; nothing is re-encoded on the
// way, unlike a ring). Which worker touched which module is agreed first by an all-gather of one byte per module.
// Sums are added in group-rank order, so the result does not depend on which worker owns a module.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tributary/comm/codec.h"
#include "tributary/comm/group.h"
#include "tributary/optim/module_outer.h"
#include "tributary/optim/outer.h"

namespace tributary {

struct OwnerReduce {
  const std::vector<std::string>& module_ids;                     // every module, in a fixed order
  const std::map<std::string, ModuleAccumulator>& accumulated;     // this worker's contributions this round
  std::map<std::string, std::unique_ptr<OuterOptimizer>>& owned;   // master copy + momentum of the owned modules
  std::vector<int> owner;                                         // group rank owning each module
  std::string norm_rescale;                                       // dipaco.norm_rescale
  const comm::Codec& codec;                                       // on the wire (stateless codecs only)
};

struct OwnerReduceBytes {
  double sent = 0, recv = 0;  // pseudo-gradient payloads (encoded) and their weights: what the round's upload costs
  double control = 0;         // the touched-module mask this worker contributed to the all-gather
};

// One round's upload and the owners' outer steps; every group member calls it with the same modules and owners.
// A module no path touched keeps its parameters. A dead or silent peer gives the group's NetworkError.
OwnerReduceBytes reduce_to_owners(const OwnerReduce& r, comm::Group& group);

}  // namespace tributary
