#include "tributary/runtime/world/replica_world.h"

namespace tributary::detail {

ReplicaWorld::ReplicaWorld(const Session& session)
    : replicas_(session), rank_(session.env().rank), world_(session.env().world_size) {}

std::optional<PendingHeal> ReplicaWorld::start(const StartState& s) {
  if (s.joining)  // its data is re-sharded over the members when it becomes one (MembershipFollower)
    return join_run(*replicas_.quorum(), s.trained, s.optimizer, s.loader, s.progress, s.total_steps);
  if (!s.ckpt) {
    replicas_.sync().start(s.trained);
    return std::nullopt;
  }
  const ReplicaResume resume = replica_resume(*s.ckpt);
  replicas_.sync().start(s.trained, s.progress.step, resume.outer ? &*resume.outer : nullptr, resume.progress);
  return std::nullopt;
}

StopAgreement::Vote ReplicaWorld::stop_vote() {
  return [this](bool local) { return replicas_.stop_agreed(local); };
}

AfterStep ReplicaWorld::after_step(int64_t step, double lr, NamedTensors& trained, bool last) {
  return replicas_.sync().step_ended(step, lr, trained, last);  // DiLoCo: an outer step every H inner steps
}

bool ReplicaWorld::stage_state(const fs::path& run_dir, int64_t step, const RankState& mine,
                               CheckpointContents& contents) {
  return stage_replica_state(replicas_, run_dir, step, mine.params, mine.optim_state, mine.position, contents);
}

}  // namespace tributary::detail
