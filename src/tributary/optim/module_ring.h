// DiPaCo's reduction with the owners' ring (an OwnerReducer, optim/owner_reducer.h). Every worker holds a replica of
// every module; one ring per round (Exchange::reduce_update_gather) leaves each owner with the full shard-weighted
// sums of its modules (reduce-scatter), the owner takes the modules' outer steps, and an all-gather brings every
// change to every worker's replicas (an all-reduce's bytes). Weights and path counts go through an exact fp64
// all-reduce first.
#pragma once

#include <vector>

#include "tributary/comm/exchange.h"
#include "tributary/comm/group.h"
#include "tributary/optim/owner_reducer.h"

namespace tributary {

class OwnerRing : public OwnerReducer {
 public:
  // `replicas[u]`: this worker's copy of unit u (updated in place); all three outlive the ring.
  OwnerRing(comm::Group& group, comm::Exchange& exchange, std::vector<NamedTensors*> replicas)
      : group_(group), exchange_(exchange), replicas_(std::move(replicas)) {}
  void reduce(const OwnedRound& round) override;

 private:
  comm::Group& group_;
  comm::Exchange& exchange_;
  std::vector<NamedTensors*> replicas_;
};

}  // namespace tributary
