#include "tributary/runtime/world/island_world.h"

#include <fmt/format.h>

#include <algorithm>

#include "tributary/config/run_layout.h"
#include "tributary/core/error.h"
#include "tributary/core/log.h"

namespace tributary::detail {

IslandWorld::IslandWorld(const Session& session, const Layout& layout)
    : config_(session.config()), env_(session.env()), layout_(layout), islands_(session, layout) {}

Share IslandWorld::share() const {
  const IslandShape& shape = layout_.islands();
  return {.data = {env_.rank, env_.world_size},
          .batches_per_step = shape.batches_per_tick(),
          .steps_per_tick = shape.steps_per_tick(),
          .ranks_per_member = shape.size(shape.island()),
          .replicas_of = " (islands) of each outer shard"};
}

// parallel.island_steps = "auto" (runtime/island_pace.h): the pace measured now, or the resumed checkpoint's.
void IslandWorld::pace(const LoadedCheckpoint* ckpt, const std::function<double()>& step_seconds, bool lead) {
  const IslandShape& shape = layout_.islands();
  if (!shape.measured_pace()) return;
  std::vector<int64_t> steps;
  if (ckpt && ckpt->state.contains("island_steps")) {
    const auto& saved = ckpt->state["island_steps"];
    const bool valid =
        saved.is_array() && int64_t(saved.size()) == shape.count() &&
        std::all_of(saved.begin(), saved.end(), [](const nlohmann::json& n) {
          return n.is_number_integer() && n.get<int64_t>() >= 1 && n.get<int64_t>() <= IslandShape::kMaxPacedSteps;
        });
    if (!valid)
      fail("'{}': island_steps is not one step count (1..{}) per island; use another checkpoint",
           (ckpt->dir / "state.json").string(), IslandShape::kMaxPacedSteps);
    steps = saved.get<std::vector<int64_t>>();
  } else {
    const std::vector<double> seconds = islands_.all_seconds(step_seconds());
    steps = shape.paced_steps(seconds);
    if (lead)
      log::info(
          "parallel.island_steps = auto: a step takes {:.3f} s on the ranks ({}); the islands take {} optimizer "
          "step(s) per tick (set parallel.island_steps = '{}' to replay this pace)",
          *std::max_element(seconds.begin(), seconds.end()), fmt::format("{:.3f}", fmt::join(seconds, ", ")),
          fmt::join(steps, ", "), fmt::join(steps, ","));
  }
  RunConfig paced = config_;  // the config keeps "auto" (a resume compares it); the checkpoints keep the steps
  paced.parallel.island_steps = fmt::format("{}", fmt::join(steps, ","));
  layout_ = run_layout(paced, env_);
  islands_.set_pace(layout_);
}

std::optional<PendingHeal> IslandWorld::start(const StartState& s) {
  pace(s.ckpt, s.step_seconds, s.lead);
  if (s.joining) return islands_.join(s.trained, s.optimizer, s.loader, s.progress, s.total_steps);
  const ReplicaResume resume = s.ckpt ? replica_resume(*s.ckpt) : ReplicaResume{};
  if (s.ckpt && !resume.outer)
    fail("the checkpoint at step {} has no DiLoCo outer state ({}): resume from an earlier one", s.progress.step,
         kOuterFile);
  islands_.start(s.trained, s.optimizer, s.progress.step, resume.outer ? &*resume.outer : nullptr, resume.progress);
  return std::nullopt;
}

StopAgreement::Vote IslandWorld::stop_vote() {
  return [this](bool local) { return islands_.stop_agreed(local); };
}

void IslandWorld::describe() {
  if (!islands_.across()) return;  // the replicas' line follows only where a rank syncs
  log::info("{} islands: data parallel inside{}; across, {}", layout_.islands().count(),
            islands_.shards_optimizer() ? ", AdamW moments sharded (ZeRO-1)" : "",
            layout_.islands().leads_exchange()
                ? "the islands' ranks 0 exchange the whole model (fault tolerant: the members are the islands)"
                : "each rank's outer shard below");
}

void IslandWorld::summarize(TrainSummary& summary) {
  summary.bytes_inside = islands_.take_inside_stats().bytes_sent;
  summary.world_size = env_.world_size;
  summary.islands = layout_.islands().count();
}

}  // namespace tributary::detail
