// A fault-tolerant trainer's side of its replicas' changing membership (dist.fault_tolerant; the rounds themselves are
// optim/resilient_average.h's, the heal ft/admission.h's). After every round — a DiLoCo outer step, or a data-parallel
// step — the members may be fewer (a worker died in it) or, after an admission, more:
//   - the lowest surviving worker leads (metrics, evaluation, summary; checkpoints follow the group's rank 0); the lead
//     records each change of lead and of the members' count in metrics.jsonl ("event" lines);
//   - a step's tokens are the members';
//   - a joiner the lead healed mid-round takes the members' data position when it becomes one;
//   - the data is re-sharded over the members (BatchLoader::reshard), so no window of the epoch is skipped: the
//     windows a dead worker had read in the round it died in were trained on by nobody (its update was lost with
//     it); the survivors go on from the members' common position.
// Between rounds the members admit the workers that asked to join in the round just ended, and at any quiet step the
// lead heals those that asked since (they become members before the next round's collective).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>

#include "tributary/data/loader.h"
#include "tributary/runtime/ft/admission.h"
#include "tributary/runtime/ft/lead.h"
#include "tributary/runtime/run_report.h"

namespace tributary {

class MembershipFollower {
 public:
  // The replicas' admission (its members, their number and this process's place among them) and the run's loader,
  // lead and report, which outlive this. `tokens_per_replica`: one step's
  // tokens on one replica. `pending`: this worker joined and was healed mid-round (join_run), not a member yet;
  // otherwise its data is re-sharded over the members now (a joiner admitted at a round boundary).
  // `ranks_per_member`: a member is an island of that many ranks (this process its rank 0, runtime/sync/island_sync.h),
  // each reading its own of the members' shards: this one reads shard member x ranks_per_member.
  MembershipFollower(Admission& admission, BatchLoader& loader, Lead& lead, RunReport& report,
                     int64_t tokens_per_replica, std::optional<PendingHeal> pending, int64_t ranks_per_member = 1);

  // A step's tokens, all members together (a worker healed mid-round: the members' count until it is one).
  int64_t tokens_per_step() const { return tokens_per_step_; }
  int64_t reformations() const { return admission_.reformations(); }

  // After a round that ends at `step`: the members may have changed.
  void after_round(int64_t step);
  // Before an evaluation or a checkpoint at `step` (every member alike, nothing in flight): the members settle who is
  // alive (Admission::settle), and follow a change as after a round — so that the lead who evaluates and the group that
  // checkpoints are the living ones even when a worker died after the last round. `attempt` > 0: the checkpoint failed
  // that many times (a member died during it). True when the members changed.
  bool before_checkpoint(int64_t step, int attempt = 0);
  // Between two steps (`round`: a round ended at `step`): admissions after a round, heals at any quiet step.
  // `state` makes what a joiner receives, only when one is waiting.
  void between_units(int64_t step, bool round, const std::function<HealState()>& state) {
    carry_out(step, heals_due(round), state);
  }
  // The same in two halves, for a member whose state is made by a collective (an island's sharded AdamW state, made
  // by the island's ranks together): what is due now (the lead's request flag is taken), then doing it.
  struct Heals {
    bool admit = false;  // the workers that asked in the round that just ended (every member takes part)
    bool offer = false;  // the lead heals one mid-round
    bool any() const { return admit || offer; }
  };
  Heals heals_due(bool round);
  void carry_out(int64_t step, const Heals& heals, const std::function<HealState()>& state);

 private:
  void reshard_data();

  Admission& admission_;
  BatchLoader& loader_;
  Lead& lead_;
  RunReport& report_;
  int64_t tokens_per_replica_;
  std::optional<PendingHeal> pending_;
  int64_t ranks_per_member_;
  int64_t tokens_per_step_;  // as of the last change of members
};

}  // namespace tributary
