#include "tributary/runtime/world/pipeline_world.h"

#include <fmt/format.h>

#include "tributary/core/log.h"

namespace tributary::detail {

PipelineWorld::PipelineWorld(const Session& session, const Layout& layout)
    : config_(session.config()),
      layout_(layout),
      pipelines_(session, layout),
      rank_(session.env().rank),
      world_size_(session.env().world_size) {}

std::optional<CheckpointPeers> PipelineWorld::peers() {
  return CheckpointPeers{.rank = pipelines_.rank(),
                         .size = pipelines_.world_size(),
                         .barrier = [this] { pipelines_.barrier(); },
                         .all_gather = [this](const torch::Tensor& t) { return pipelines_.all_gather(t); }};
}

std::optional<PendingHeal> PipelineWorld::start(const StartState& s) {
  Replicas* replicas = pipelines_.stage_replicas();
  if (!replicas) return std::nullopt;
  if (!s.ckpt) {
    replicas->sync().start(s.trained);
    return std::nullopt;
  }
  const ReplicaResume resume = replica_resume(*s.ckpt, replica_outer_file(rank_));  // a stage's is its rank's own
  replicas->sync().start(s.trained, s.progress.step, resume.outer ? &*resume.outer : nullptr, resume.progress);
  return std::nullopt;
}

StopAgreement::Vote PipelineWorld::stop_vote() {
  return [this](bool local) { return pipelines_.stop_agreed(local); };
}

// Pipeline stages hold only their own parameters current.
void PipelineWorld::whole_model(NamedTensors& params, NamedTensors* aux_params) {
  pipelines_.consolidate(params, config_.model.blocks_per_level());
  if (aux_params && !aux_params->empty()) pipelines_.consolidate_aux_heads(*aux_params);
}

// A pipeline rank's parameters are its whole model as consolidated over its pipeline (its own stage current), so
// `restore` reads them as it reads a replica's; DiLoCo per stage adds the stage's outer state per rank.
bool PipelineWorld::stage_state(const fs::path& run_dir, int64_t step, const RankState& rank_state,
                                CheckpointContents& contents) {
  Replicas* replicas = pipelines_.stage_replicas();
  const NamedTensors outer = replicas ? replicas->sync().outer_state() : NamedTensors{};
  const NamedTensors codec = replicas ? replicas->codec_state() : NamedTensors{};
  RankState mine = rank_state;
  if (replicas) {
    mine.outer = &outer;
    mine.codec = &codec;
  }
  if (!stage_rank_state(*peers(), run_dir, step, mine, contents)) return false;
  contents.state["replicas"] = replicas ? replicas->sync().progress() : nlohmann::json::array();
  return true;
}

void PipelineWorld::describe() {
  const auto& par = config_.parallel;
  log::info(
      "{} pipeline(s) of {} stages (blocks per stage from {}), schedule {}{}, {} micro-batches of {}, "
      "activations on the wire as {}",
      layout_.replicas(), layout_.stages(),
      par.stage_layers.empty() ? std::string("a balanced split") : par.stage_layers, par.schedule,
      par.schedule == "1f1b" ? fmt::format(" (warm-up margin {})", par.warmup_margin) : "", par.micro_batches,
      config_.train.batch_size / par.micro_batches, par.activation_compression);
}

}  // namespace tributary::detail
