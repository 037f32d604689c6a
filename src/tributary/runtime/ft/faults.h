// Faults injected on purpose (tests and chaos runs, like torchft's): the one seam through which a run is made to fail.
// The run loops call a Faults at their fault points; nothing inside them reads the environment. The CLI reads the
// plan once from the environment (fault_plan_from_environment); a test that calls train() in-process installs its own
// in TrainOptions::faults.
//   TRIBUTARY_FAIL_RANK=R (or R1,R2,...: a whole machine lost) with
//     TRIBUTARY_FAIL_STEP=S      the rank fails when it reports step S (the trainer's optimizer steps; DiPaCo: a
//                                worker's inner steps over all its tasks), as TRIBUTARY_FAIL_MODE says:
//                                kill (SIGKILL, a pre-empted machine; default) | error (it refuses with an Error) |
//                                stop (SIGSTOP, a hung machine) | term (SIGTERM: the user asks that one process to
//                                stop; it goes on until the run agreed)
//     TRIBUTARY_FAIL_EXCHANGE=N  DiPaCo: the rank is killed in round N's exchange (1-based), half a second after it
//                                reached it, when the others wait in the exchange's collectives
//     TRIBUTARY_FAIL_CHECKPOINT=S the trainer's rank is killed at step S's evaluation or checkpoint, after the step's
//                                round (the worst moment of a fault-tolerant run's last step)
//     TRIBUTARY_FAIL_IN_CHECKPOINT=S the trainer's rank is killed as step S's checkpoint begins, once the members
//                                agreed who takes it: the others meet its death inside the checkpoint's collectives
//   TRIBUTARY_BAD_UPDATE_RANK=R TRIBUTARY_BAD_UPDATE=nan|scale100: rank R's every pseudo-gradient is corrupted (one
//                                value NaN, or x100), for dist.reject_norm_factor; the flag `train --adversary R:KIND`
//                                installs any of optim/adversary.h's kinds (a participant that lies)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tributary {

struct FaultPlan {
  enum class Mode { kKill, kError, kStop, kTerm };
  std::vector<int> ranks;      // the ranks that fail at at_step / at_exchange
  int64_t at_step = -1;        // -1: none
  int64_t at_exchange = -1;    // -1: none
  int64_t at_checkpoint = -1;  // -1: none
  int64_t in_checkpoint = -1;  // -1: none
  Mode mode = Mode::kKill;
  int adversary_rank = -1;  // -1: none
  std::string adversary;    // optim/adversary.h's kinds
};

// The plan the environment describes (empty without the variables); an Error naming the variable on a bad value.
FaultPlan fault_plan_from_environment();
// `train --adversary RANK:KIND` into `plan`; an Error naming the flag and the kinds on a bad value.
void parse_adversary(const std::string& flag, FaultPlan& plan);

// One rank's faults.
class Faults {
 public:
  Faults() = default;
  Faults(FaultPlan plan, int rank) : plan_(std::move(plan)), rank_(rank) {}

  void after_step(int64_t step) const;    // fails here when the plan says so
  void in_exchange(int64_t round) const;  // DiPaCo: round is 1-based
  void before_checkpoint(int64_t step) const;
  void inside_checkpoint(int64_t step) const;
  // The kind of adversary this rank plays (optim/adversary.h), "" when it is honest.
  std::string adversary() const { return plan_.adversary_rank == rank_ ? plan_.adversary : ""; }

 private:
  bool mine() const;
  FaultPlan plan_;
  int rank_ = 0;
};

}  // namespace tributary
