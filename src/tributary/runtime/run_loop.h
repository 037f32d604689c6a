// The one run loop (docs/architecture.md, "The run loop"): every kind of run is a source of work that the same loop
// drives, unit by unit, until the run's last step or an agreed stop:
//   unit of work -> stop vote -> what is due (evaluate, checkpoint) -> between units (admit joiners, heal).
// The trainer's unit is one step and its sync (batch -> step -> sync -> commit; training_run.h); DiPaCo's is one
// round of claimed path tasks and its exchange (dipaco/worker.h). Neither has a loop of its own: the stop agreement,
// the order of evaluation, checkpoint and stop, and the end of the run are decided here once.
#pragma once

#include <cstdint>

#include "tributary/runtime/stop.h"
#include "tributary/runtime/train_summary.h"

namespace tributary {

// What one unit of work left: the inner steps done so far (all of the run's, resumed included), whether nothing is
// in flight (the run may stop here), whether an outer step landed and whether a round of the replicas ended (an outer
// step or a data-parallel step: the members may change there), the run's clock at its end, and whether the run's work
// is over before its last step.
struct UnitDone {
  int64_t step = 0;
  bool quiescent = true;
  bool synced = false;
  bool round = false;
  double elapsed_s = 0;
  bool over = false;  // the sync ended the run's work at this unit (asynchronous rounds, which end by tokens)
};

// What is due after a unit: the last, an agreed stop, an evaluation, a checkpoint. Every rank of a multi-process run
// takes part in one.
struct Due {
  bool last = false, stop = false, eval = false, checkpoint = false;
};

class WorkSource {
 public:
  virtual ~WorkSource() = default;
  // The agreement's vote across this run's processes (empty for one process) and whether this rank leads.
  virtual StopAgreement::Vote stop_vote() = 0;
  virtual bool lead() const = 0;
  virtual bool done() const = 0;  // every step of the run has been trained (a resumed run may start done)
  virtual UnitDone next() = 0;    // trains one unit
  // What the source's own schedule asks after `unit` (last, eval, checkpoint), given whether a stop was agreed now.
  virtual Due due_after(const UnitDone& unit, bool stop) = 0;
  virtual void when_due(const UnitDone& unit, const Due& due) = 0;  // evaluates and checkpoints
  virtual void between_units(const UnitDone& unit) = 0;             // admissions, heals: the run goes on
  virtual TrainSummary finish(bool stopped_early) = 0;              // the summary, written by the lead
};

// Drives `work` to its end; `stop_after_step` > 0 stops after the unit that reaches it (as a signal does).
TrainSummary run_loop(WorkSource& work, int64_t stop_after_step);

}  // namespace tributary
