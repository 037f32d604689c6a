// A fault-tolerant run's changing membership, seen from the loop (dist.fault_tolerant; the rounds themselves are
// optim/resilient_average.h's, the heal runtime/ft/quorum.h's). After every round — a DiLoCo outer step, or a
// data-parallel step — the members may be fewer (a worker died in it) or, after an admission, more:
//   - the lowest surviving worker leads (metrics, evaluation, summary; checkpoints follow the group's rank 0); the lead
//     records each change of lead and of the members' count in metrics.jsonl ("event" lines);
//   - a step's tokens are the members';
//   - a joiner the lead healed mid-round takes the members' data position when it becomes one;
//   - the data is re-sharded over the members (BatchLoader::reshard), so no window of the epoch is skipped: the
//     windows a dead worker had read in the round it died in were trained on by nobody (its update was lost with
//     it); the survivors go on from the members' common position.
#include "tributary/core/log.h"
#include "tributary/runtime/training_run.h"

namespace tributary::detail {

void TrainingRun::follow_membership(int64_t step) {
  Quorum* quorum = replicas_ ? replicas_->quorum() : nullptr;
  if (!quorum) return;
  if (pending_heal_) {
    if (quorum->pending()) return;
    // Healed mid-round, a member now: the members' position, then the common re-shard below.
    data_.loader->set_position(data_.loader->advanced(pending_heal_->position, step - pending_heal_->step));
    pending_heal_.reset();
  }
  tokens_per_step_ = tc_.batch_size * tc_.grad_accum * config_.model.context * replicas_->size();
  summary_.reformations = quorum->reformations();
  const int64_t members_before = data_.loader->world_size();
  reshard_data();
  if (lead_.follow(quorum->members())) {
    report_->take_lead(step);
    log::warn("worker {} leads the run from step {} on (metrics, evaluation, summary)", options_.dist.rank, step);
    report_->write({{"step", step}, {"event", "lead"}, {"lead_worker", options_.dist.rank}});
  }
  if (lead_.is() && replicas_->size() != members_before)  // `tributary report` lists these as faults and joins
    report_->write(
        {{"step", step}, {"event", "membership"}, {"members", replicas_->size()}, {"members_before", members_before}});
}

void TrainingRun::reshard_data() {
  if (data_.loader->rank() == replicas_->rank() && data_.loader->world_size() == replicas_->size()) return;
  const auto before = data_.loader->position();
  const int64_t world_before = data_.loader->world_size();
  data_.loader->reshard(replicas_->rank(), replicas_->size());
  if (replicas_->rank() == 0)
    log::info("data re-sharded over {} worker(s) (was {}): epoch {} cursor {} -> {}", replicas_->size(), world_before,
              before.epoch, before.cursor, data_.loader->position().cursor);
}

// At any step of DiLoCo's phase with nothing in flight, the lead heals the workers that asked to join since; they
// become members before the next round's collective (Quorum::offer_heal).
void TrainingRun::offer_heals(int64_t step, double now) {
  Quorum* quorum = replicas_ ? replicas_->quorum() : nullptr;
  if (!quorum || !quorum->heal_wanted()) return;
  quorum->offer_heal(heal_state(parts_.trained, *parts_.optimizer, *data_.loader, {step, progress_.tokens, now}));
}

// Right after a round (and its checkpoint): workers that asked to join in it are admitted and healed from the lead.
void TrainingRun::admit_joiners(int64_t step, double now) {
  Quorum* quorum = replicas_ ? replicas_->quorum() : nullptr;
  if (!quorum || !quorum->joiners_waiting()) return;
  quorum->admit(heal_state(parts_.trained, *parts_.optimizer, *data_.loader, {step, progress_.tokens, now}));
  follow_membership(step);
}

}  // namespace tributary::detail
