#include "tributary/runtime/run_loop.h"

namespace tributary {

TrainSummary run_loop(WorkSource& work, int64_t stop_after_step) {
  StopAgreement stop(work.stop_vote(), stop_after_step, work.lead());
  while (!work.done()) {
    const UnitDone unit = work.next();
    const Due due = work.due_after(unit, stop.after_step(unit.step, unit.quiescent));
    work.when_due(unit, due);
    if (due.last || due.stop) return work.finish(due.stop && !due.last);
    work.between_units(unit);
  }
  return work.finish(false);
}

}  // namespace tributary
