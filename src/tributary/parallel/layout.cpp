#include "tributary/parallel/layout.h"

#include <fmt/format.h>

#include "tributary/core/error.h"

namespace tributary {

const char* sync_name(Sync sync) {
  switch (sync) {
    case Sync::kNone:
      return "none";
    case Sync::kDataParallel:
      return "data parallel";
    case Sync::kDiloco:
      return "DiLoCo";
    case Sync::kModules:
      return "DiPaCo modules";
  }
  return "?";
}

Layout Layout::resolve(const LayoutSpec& spec) {
  TRIB_CHECK(spec.world_size >= 1 && spec.rank >= 0 && spec.rank < spec.world_size, "rank {} of world {}", spec.rank,
             spec.world_size);
  Layout l;
  l.rank_ = spec.rank;
  l.world_size_ = spec.world_size;
  l.chunks_ = spec.local_chunks;
  const int64_t p = spec.pipeline_stages;
  if (spec.dipaco) {  // every worker is a replica that trains paths
    l.kind_ = RunKind::kDipaco;
    l.sync_ = Sync::kModules;
    l.replicas_ = spec.world_size;
  } else if (p > 1) {
    if (spec.world_size < p)
      fail(
          "parallel.pipeline_stages = {0} needs at least {0} worker processes: tributary launch --nproc {0} -- "
          "train ...",
          p);
    if (spec.world_size % p != 0)
      fail(
          "parallel.pipeline_stages = {} does not divide the world size {}: launch D_DP x D_PP workers (e.g. "
          "launch --nproc {})",
          p, spec.world_size, p);
    l.kind_ = RunKind::kPipelines;
    l.stages_ = p;
    l.replicas_ = spec.world_size / p;
  } else if (spec.world_size > 1) {
    if (spec.local_chunks > 0)
      fail(
          "local.chunks = {} with {} processes: local parallelism runs in one process, or one chunk per pipeline "
          "stage (parallel.pipeline_stages = local.chunks)",
          spec.local_chunks, spec.world_size);
    l.kind_ = RunKind::kReplicas;
    l.replicas_ = spec.world_size;
  }
  if (l.kind_ == RunKind::kReplicas || (l.kind_ == RunKind::kPipelines && l.replicas_ > 1))
    l.sync_ = spec.diloco ? Sync::kDiloco : Sync::kDataParallel;
  if (l.sync_ == Sync::kDiloco) l.warmup_ddp_steps_ = spec.warmup_ddp_steps;

  l.rank_at_.assign(size_t(l.replicas_), std::vector<int>(size_t(l.stages_), 0));
  l.device_of_rank_.resize(size_t(spec.world_size));
  for (int r = 0; r < spec.world_size; ++r)
    l.rank_at_[size_t(r % l.replicas_)][size_t(r / l.replicas_)] = l.device_of_rank_[size_t(r)] = r;
  if (spec.placement && l.kind_ == RunKind::kPipelines) {
    const auto& placement = *spec.placement;
    if (placement.stages != p || placement.replicas * placement.stages != spec.world_size)
      fail(
          "parallel.placement = '{}' places {} pipelines x {} stages but this run has {} x {} (world size {}, "
          "parallel.pipeline_stages {}): plan for this world, or launch --nproc {}",
          spec.placement_key, placement.replicas, placement.stages, l.replicas_, p, spec.world_size, p,
          placement.replicas * placement.stages);
    l.rank_at_ = placement.rank_at;
    l.device_of_rank_ = placement.device_of_rank;
  }
  for (size_t i = 0; i < l.rank_at_.size(); ++i)
    for (size_t j = 0; j < l.rank_at_[i].size(); ++j)
      if (l.rank_at_[i][j] == spec.rank) l.replica_ = int64_t(i), l.stage_ = int64_t(j);
  return l;
}

int64_t Layout::stage_data_parallel_steps() const {
  if (kind_ != RunKind::kPipelines || replicas_ == 1) return 0;
  if (sync_ == Sync::kDataParallel) return -1;
  return warmup_ddp_steps_;
}

std::vector<int> Layout::pipeline_ranks() const { return rank_at_[size_t(replica_)]; }

std::vector<int> Layout::stage_replica_ranks() const {
  std::vector<int> out;
  for (const auto& pipeline : rank_at_) out.push_back(pipeline[size_t(stage_)]);
  return out;
}

std::string Layout::name() const {
  switch (kind_) {
    case RunKind::kSingle:
      return chunks_ > 0 ? "local" : "single";
    case RunKind::kReplicas:
      return sync_ == Sync::kDataParallel ? "ddp" : "diloco";
    case RunKind::kPipelines:
      return std::string(chunks_ > 0 ? "local-stages" : "pipeline") + (sync_ == Sync::kDiloco ? "+diloco" : "");
    case RunKind::kDipaco:
      return "dipaco";
  }
  return "?";
}

std::string Layout::describe() const {
  const std::string local = chunks_ > 0 ? fmt::format(", local parallelism in {} chunks", chunks_) : "";
  switch (kind_) {
    case RunKind::kSingle:
      return fmt::format("layout: one process{}", local);
    case RunKind::kReplicas:
      return fmt::format(
          "layout: {} replicas of the model, kept together by {}{}; this is replica {}", replicas_, sync_name(sync_),
          warmup_ddp_steps_ > 0 ? fmt::format(" after {} data-parallel steps", warmup_ddp_steps_) : "", replica_);
    case RunKind::kPipelines:
      return fmt::format(
          "layout: {} pipeline(s) x {} stages{}{}; rank {} runs stage {} of pipeline {}", replicas_, stages_,
          replicas_ > 1 ? fmt::format(", each stage's replicas kept together by {}", sync_name(sync_)) : "", local,
          rank_, stage_, replica_);
    case RunKind::kDipaco:
      return fmt::format("layout: DiPaCo, {} worker(s) claiming path tasks", world_size_);
  }
  return "layout: ?";
}

}  // namespace tributary
