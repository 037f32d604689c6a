#include "tributary/runtime/ft/membership_follower.h"

#include <fmt/format.h>

#include "tributary/core/log.h"

namespace tributary {

MembershipFollower::MembershipFollower(Admission& admission, BatchLoader& loader, Lead& lead, RunReport& report,
                                       int64_t tokens_per_replica, std::optional<PendingHeal> pending,
                                       int64_t ranks_per_member)
    : admission_(admission),
      loader_(loader),
      lead_(lead),
      report_(report),
      tokens_per_replica_(tokens_per_replica),
      pending_(std::move(pending)),
      ranks_per_member_(ranks_per_member),
      tokens_per_step_(tokens_per_replica * (pending_ ? pending_->members_world : admission.size())) {
  if (!pending_) reshard_data();  // a joiner admitted at a round boundary reads the members' shard from here on
}

void MembershipFollower::after_round(int64_t step) {
  if (pending_) {
    if (admission_.pending()) return;
    // Healed mid-round, a member now: the members' position, then the common re-shard below.
    loader_.set_position(loader_.advanced(pending_->position, step - pending_->step));
    pending_.reset();
  }
  const int64_t members_before = loader_.world_size() / ranks_per_member_;
  tokens_per_step_ = tokens_per_replica_ * admission_.size();
  reshard_data();
  if (lead_.follow(admission_.members())) {
    report_.take_lead(step);
    log::warn("{} {} leads the run from step {} on (metrics, evaluation, summary)", admission_.noun(),
              admission_.members().front(), step);
    report_.write({{"step", step}, {"event", "lead"}, {"lead_worker", admission_.members().front()}});
  }
  if (lead_.is() && admission_.size() != members_before)  // `tributary report` lists these as faults and joins
    report_.write(
        {{"step", step}, {"event", "membership"}, {"members", admission_.size()}, {"members_before", members_before}});
}

bool MembershipFollower::before_checkpoint(int64_t step, int attempt) {
  if (!admission_.settle(attempt == 0 ? fmt::format("ckpt{}", step) : fmt::format("ckpt{}.{}", step, attempt)))
    return false;
  after_round(step);
  return true;
}

MembershipFollower::Heals MembershipFollower::heals_due(bool round) {
  Heals heals;
  heals.admit = round && admission_.joiners_waiting();
  // An admission changes nothing the lead's heal looks at: deciding both first is deciding them in order.
  heals.offer = admission_.heal_wanted();
  return heals;
}

void MembershipFollower::carry_out(int64_t step, const Heals& heals, const std::function<HealState()>& state) {
  if (heals.admit) {
    admission_.admit(state());
    after_round(step);
  }
  if (!heals.offer) return;
  // A death whose replacement is healed within the same round changes no round's members: the lead's event line is
  // what the report lists it by.
  const std::vector<int> healed = admission_.offer_heal(state());
  if (lead_.is() && !healed.empty())
    report_.write({{"step", step}, {"event", "heal"}, {"healed", healed}, {"noun", admission_.noun()}});
}

void MembershipFollower::reshard_data() {
  const int64_t rank = admission_.rank() * ranks_per_member_, world = admission_.size() * ranks_per_member_;
  if (loader_.rank() == rank && loader_.world_size() == world) return;
  const auto before = loader_.position();
  const int64_t world_before = loader_.world_size();
  loader_.reshard(rank, world);
  if (admission_.rank() == 0)
    log::info("data re-sharded over {} worker(s) (was {}): epoch {} cursor {} -> {}", world, world_before, before.epoch,
              before.cursor, loader_.position().cursor);
}

}  // namespace tributary
