// The outer loop's other reduction: units that each have one owner (DiPaCo's modules). Where the average (reducer.h)
// leaves every replica with the same averaged pseudo-gradient and every replica steps its own copy of the unit's
// outer optimizer, an owner reduction brings a round's weighted sums of unit u to u's owner only, which takes u's outer
// step (`step`, the outer loop's: norm rescale, Nesterov); what happens to the new global parameters
// next is the reduction's business:
//   OwnerRing   (optim/module_ring.h)    one ring for all units: reduce-scatter to the owners, the owners' steps,
//                                         all-gather of the changes into every worker's replica of every unit;
//   OwnerUpload (optim/module_owners.h)  path-local: each touched unit's sum point to point to its owner; the new
//                                         values stay with the owner (other workers fetch them later).
// Every group member calls reduce() with the same owners.
#pragma once

#include <functional>
#include <vector>

#include "tributary/model/tensor_io.h"
#include "tributary/optim/module_outer.h"

namespace tributary {

struct OwnedRound {
  // This worker's contributions to each unit this round (nullptr: none; ModuleAccumulator holds sum_p w_p delta_p).
  std::vector<const ModuleAccumulator*> contributions;
  std::vector<int> owner;                  // group rank owning each unit
  std::vector<const NamedTensors*> owned;  // the owner's global parameters of each unit it owns (else nullptr)
  // The owner's step of `unit` once it holds the unit's full sums (weight = sum_p w_p, count = contributing paths;
  // count 0: nobody touched the unit, it keeps its parameters). Returns the unit's global parameters after the step.
  std::function<const NamedTensors&(size_t unit, const std::vector<torch::Tensor>& sum, double weight, int64_t count)>
      step;
};

class OwnerReducer {
 public:
  virtual ~OwnerReducer() = default;
  virtual void reduce(const OwnedRound& round) = 0;  // a dead or silent peer gives the group's NetworkError
};

}  // namespace tributary
