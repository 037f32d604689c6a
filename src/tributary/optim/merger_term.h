// Who merges in asynchronous DiLoCo (optim/async_merger.h): the merging role is a term held by one rank, recorded on
// the update board (async/merger/{t}: the first proposal written wins, as every decision of the run's fault-tolerance
// home, comm/membership.h). The last rank proposes itself for term 0, so that the lead's evaluations do not delay
// merges; if it has not started within a heartbeat deadline, anyone may take term 0. When the holder's heartbeat goes
// stale, the candidates race for the next term. Each candidate beats its own heartbeat from construction on.
#pragma once

#include <chrono>
#include <vector>

#include "tributary/comm/heartbeat.h"
#include "tributary/optim/update_board.h"

namespace tributary {

class MergerTerm {
 public:
  // `board`: the merger's board (outlives this); `heartbeat`: a store connection for this candidate's heartbeat.
  // `dead_after_s`: a candidate whose heartbeat is stale this long holds no term and is no live replica.
  MergerTerm(UpdateBoard& board, comm::Store heartbeat, int self, int replicas, double dead_after_s);

  // One look at the newest term; a stale or missing holder's next term is raced for. True when this candidate holds
  // the newest term.
  bool held();
  int64_t term() const { return term_; }
  // The replicas whose heartbeat is fresh (this one always).
  std::vector<int> alive();

 private:
  UpdateBoard& board_;
  comm::Heartbeat heartbeat_;
  comm::Liveness liveness_;
  int self_, replicas_;
  double dead_after_s_;
  const std::chrono::steady_clock::time_point born_ = std::chrono::steady_clock::now();
  int64_t term_ = -1;  // the newest term seen
};

}  // namespace tributary
