// What the replicas' rounds (runtime/sync/replica_rounds.h) and their admission (admission.h) act through. The
// replicas' sync (runtime/sync/replica_sync.h) owns the pieces; these are references to them. Every collective runs on
// the communication thread, so that all ranks issue them in the same order (its FIFO).
#pragma once

#include "tributary/comm/comm_thread.h"
#include "tributary/comm/exchange.h"
#include "tributary/comm/group.h"
#include "tributary/optim/resilient_average.h"
#include "tributary/parallel/replica_check.h"

namespace tributary {

struct ReplicaChannel {
  comm::Group& group;
  comm::Exchange& exchange;  // compression, accounting, WAN emulation
  comm::CommThread& thread;
  ResilientAverage& reducer;  // the exchange's average, committed or redone whole under fault tolerance
  ReplicaCheck& check;        // replicas verified identical where they must be
};

}  // namespace tributary
