// Stopping a run: the CLI's signals (SIGINT/SIGTERM while training) and --stop-after-step, agreed across ranks.
// A stop must happen at the same step on every rank: a signal is agreed on by a lagged vote every step
// (comm/lagged_vote.h), so DiLoCo stops within a few steps instead of at its next outer step (which may be minutes
// away). The stop itself waits until no exchange is in flight (the caller passes `quiescent`).
#pragma once

#include <cstdint>
#include <functional>

namespace tributary {

// Installs the handlers for its lifetime and restores the previous ones.
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  bool requested() const;
};

class StopAgreement {
 public:
  // vote: every rank's lagged stop vote (Sync::peers().stop), empty for a single process;
  // stop_after_step > 0: a planned stop after that step.
  using Vote = std::function<bool(bool local_stop)>;
  StopAgreement(Vote vote, int64_t stop_after_step, bool lead)
      : vote_(std::move(vote)), stop_after_step_(stop_after_step), lead_(lead) {}
  // Called after every step on every rank; true once the run should stop now (pending and quiescent).
  bool after_step(int64_t step, bool quiescent);

 private:
  StopSignals signals_;
  Vote vote_;
  int64_t stop_after_step_;
  bool lead_;
  bool pending_ = false;
};

}  // namespace tributary
