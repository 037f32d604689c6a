#include "tributary/parallel/layout.h"

#include <fmt/format.h>

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "tributary/core/error.h"
#include "tributary/core/number_list.h"

namespace tributary {

const char* sync_name(SyncKind sync) {
  switch (sync) {
    case SyncKind::kNone:
      return "none";
    case SyncKind::kDataParallel:
      return "data parallel";
    case SyncKind::kDiloco:
      return "DiLoCo";
    case SyncKind::kModules:
      return "DiPaCo modules";
    case SyncKind::kAsyncDiloco:
      return "asynchronous DiLoCo";
  }
  return "?";
}

namespace {

// "4,4,2" as counts of at least 1, or an Error saying what `key` expects.
std::vector<int64_t> positive_counts(const std::string& text, const std::string& key, const std::string& expected) {
  std::vector<int64_t> out;
  for (double v : parse_number_list(text, key, expected)) {
    if (!(v >= 1 && v <= double(1 << 20) && v == std::floor(v))) fail("{} = '{}': {}", key, text, expected);
    out.push_back(int64_t(v));
  }
  return out;
}

}  // namespace

std::vector<int64_t> parse_islands(const std::string& text, int world_size, int local_world_size,
                                   const std::string& key) {
  if (text.empty()) return {};
  std::vector<int64_t> sizes;
  if (text == "machines") {
    if (local_world_size < 1 || world_size % local_world_size != 0)
      fail("{} = machines: the world of {} ranks is not machines of {} processes each; give the sizes instead", key,
           world_size, local_world_size);
    sizes.assign(size_t(world_size / local_world_size), local_world_size);
    return sizes;
  }
  sizes = positive_counts(text, key, "expected a number of equal islands ('2'), their sizes ('4,4,2') or 'machines'");
  if (sizes.size() == 1) {  // a count of equal islands
    const int64_t n = sizes[0];
    if (n > world_size || world_size % n != 0)
      fail(
          "{} = {}: {} islands do not divide the world of {} ranks equally; give their sizes (e.g. '{}') or launch "
          "a multiple of {} workers",
          key, n, n, world_size,
          world_size > 1 ? fmt::format("{},{}", world_size - world_size / 2, world_size / 2) : std::string("1"), n);
    sizes.assign(size_t(n), world_size / n);
    return sizes;
  }
  const int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  if (total != world_size)
    fail("{} = '{}': the islands hold {} ranks but the run has {} (launch --nproc {}, or sizes that add up to {})", key,
         text, total, world_size, total, world_size);
  return sizes;
}

// parallel.islands and parallel.island_steps: a replica run's ranks grouped by a fast link (one island per rank
// otherwise), and the optimizer steps each island takes per tick.
void Layout::place_islands(const LayoutSpec& spec) {
  const std::vector<int64_t> islands =
      parse_islands(spec.islands, spec.world_size, spec.local_world_size, "parallel.islands");
  if (!islands.empty()) {
    const char* other = spec.dipaco             ? "DiPaCo (dipaco.modules)"
                        : spec.local_chunks > 0 ? "local parallelism (local.chunks)"
                                                : nullptr;
    if (other)
      fail("parallel.islands with {} is not supported yet: islands run data parallel inside and DiLoCo across", other);
    if (!spec.diloco && !spec.async)
      fail(
          "parallel.islands needs dist.algorithm = diloco or async_diloco (DiLoCo across the islands); with "
          "dist.algorithm = ddp "
          "every rank would average every step across the slow link the islands avoid");
    if (islands.size() == 1)
      fail("parallel.islands = '{}' makes one island of all {} ranks: give two or more", spec.islands, spec.world_size);
    if (spec.warmup_ddp_steps > 0)
      fail(
          "dist.warmup_ddp_steps = {} with parallel.islands: the warm-up would be data parallel across the slow "
          "link the islands avoid; set it to 0",
          spec.warmup_ddp_steps);
    if (spec.pipeline_stages > 1) return place_pipeline_islands(spec, islands);
    kind_ = RunKind::kIslands;
    replicas_ = int64_t(islands.size());
  } else if (!spec.island_steps.empty()) {
    fail("parallel.island_steps = '{}' without parallel.islands: it paces islands; set both or neither",
         spec.island_steps);
  }
  const std::vector<int64_t> sizes = islands.empty() ? std::vector<int64_t>(size_t(spec.world_size), 1) : islands;
  std::vector<int64_t> island_steps(sizes.size(), 1);
  const bool measured = spec.island_steps == "auto";
  if (!spec.island_steps.empty() && !measured) {
    const std::vector<int64_t> steps = positive_counts(spec.island_steps, "parallel.island_steps",
                                                       "expected optimizer steps per tick for each island, e.g. '2,1', "
                                                       "or 'auto'");
    if (steps.size() != sizes.size())
      fail(
          "parallel.island_steps = '{}' gives {} island(s) steps but parallel.islands makes {}: one number per "
          "island",
          spec.island_steps, steps.size(), sizes.size());
    island_steps = steps;
  }
  if (spec.fault_tolerant && !islands.empty()) check_fault_tolerant_islands(spec, islands);
  islands_ = IslandShape(sizes, island_steps, spec.rank, measured, /*leads_exchange=*/spec.fault_tolerant);
}

// dist.fault_tolerant with islands: the members of the run's one quorum are the islands, each spoken for by its rank
// 0, and an island that loses a rank starts again as a whole (launch --restart-island restarts a machine's workers
// together): so an island is a machine's workers, and the islands keep one pace.
void Layout::check_fault_tolerant_islands(const LayoutSpec& spec, const std::vector<int64_t>& islands) {
  for (int64_t n : islands)
    if (n != spec.local_world_size)
      fail(
          "parallel.islands = '{}' with dist.fault_tolerant = true: each island must be one machine's workers "
          "(islands of {}, {} worker(s) per machine), since a machine's launch starts its island again as a whole; "
          "set parallel.islands = 'machines' and launch with --restart-island",
          spec.islands, fmt::join(islands, "/"), spec.local_world_size);
  if (!spec.island_steps.empty())
    fail(
        "parallel.island_steps = '{}' with dist.fault_tolerant = true is not supported: fault-tolerant islands keep "
        "one pace; drop parallel.island_steps",
        spec.island_steps);
}

// parallel.islands with parallel.pipeline_stages = p (DT-FM's shape: pipelines inside a region, their replicas across
// the regions): each island of d x p ranks holds d pipelines, their stages on the island's consecutive ranks (rank =
// (island x d + pipeline) x p + stage, the island's fast link carrying the activations); a stage's d replicas in an
// island average their gradients every step, and each stage's islands are kept together by DiLoCo through the
// island's first pipeline — the pipelines' runtime with DiLoCo per stage, placed island-major instead of Megatron's
// order.
void Layout::place_pipeline_islands(const LayoutSpec& spec, const std::vector<int64_t>& islands) {
  const int64_t p = spec.pipeline_stages;
  for (int64_t n : islands)
    if (n % p != 0 || n != islands.front())
      fail(
          "parallel.islands = '{}' with parallel.pipeline_stages = {}: each island holds the same number of whole "
          "pipelines, so every island must have the same multiple of {} ranks (islands of {})",
          spec.islands, p, p, fmt::join(islands, "/"));
  if (spec.placement)
    fail("parallel.placement with parallel.islands and pipelines: the islands place the pipelines; give one of them");
  if (!spec.island_steps.empty())
    fail("parallel.island_steps = '{}' with pipelines in the islands is not supported: every pipeline keeps the pace",
         spec.island_steps);
  if (spec.fault_tolerant) {
    check_fault_tolerant_islands(spec, islands);
    if (islands.front() != p)
      fail(
          "parallel.islands = '{}' with parallel.pipeline_stages = {} and dist.fault_tolerant = true: a fault-tolerant "
          "pipeline is one machine's workers (the machine's launch starts it again as a whole), so launch --nproc {} "
          "per machine (islands of {} hold {} pipelines)",
          spec.islands, p, p, islands.front(), islands.front() / p);
  }
  islands_ = IslandShape(islands, std::vector<int64_t>(islands.size(), 1), spec.rank);
  pipelines_per_island_ = islands.front() / p;
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
    l.sync_ = SyncKind::kModules;
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
  l.place_islands(spec);
  if (l.kind_ == RunKind::kReplicas || l.kind_ == RunKind::kIslands ||
      (l.kind_ == RunKind::kPipelines && l.replicas_ > 1))
    l.sync_ = spec.diloco ? SyncKind::kDiloco : SyncKind::kDataParallel;
  if ((l.kind_ == RunKind::kReplicas || l.kind_ == RunKind::kIslands) && spec.async) l.sync_ = SyncKind::kAsyncDiloco;
  if (l.sync_ == SyncKind::kDiloco) l.warmup_ddp_steps_ = spec.warmup_ddp_steps;

  l.rank_at_.assign(size_t(l.replicas_), std::vector<int>(size_t(l.stages_), 0));
  l.device_of_rank_.resize(size_t(spec.world_size));
  for (int r = 0; r < spec.world_size; ++r) {
    l.device_of_rank_[size_t(r)] = r;
    if (l.pipelines_per_island_ > 0)  // island-major: island i's pipelines on its ranks
      l.rank_at_[size_t(r / l.stages_)][size_t(r % l.stages_)] = r;
    else if (l.kind_ != RunKind::kIslands)
      l.rank_at_[size_t(r % l.replicas_)][size_t(r / l.replicas_)] = r;
  }
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
  if (l.kind_ == RunKind::kIslands)  // a replica is an island, named by its first rank
    for (int64_t i = 0; i < l.replicas_; ++i) l.rank_at_[size_t(i)][0] = l.islands_.begin(i);
  for (size_t i = 0; i < l.rank_at_.size(); ++i)
    for (size_t j = 0; j < l.rank_at_[i].size(); ++j)
      if (l.rank_at_[i][j] == spec.rank) l.replica_ = int64_t(i), l.stage_ = int64_t(j);
  if (l.kind_ == RunKind::kIslands) l.replica_ = l.islands_.island();
  return l;
}

int64_t Layout::stage_data_parallel_steps() const {
  if (kind_ != RunKind::kPipelines || replicas_ == 1) return 0;
  if (sync_ == SyncKind::kDataParallel || pipelines_per_island_ > 1) return -1;
  return warmup_ddp_steps_;
}

std::vector<int> Layout::island_stage_ranks() const {
  if (pipelines_per_island_ == 0) return {};
  std::vector<int> out;
  const int64_t first = replica_ - pipeline_in_island();
  for (int64_t k = 0; k < pipelines_per_island_; ++k) out.push_back(rank_at(first + k, stage_));
  return out;
}

std::vector<int> Layout::lead_stage_ranks() const {
  std::vector<int> out;
  for (int64_t q = 0; pipelines_per_island_ > 0 && q < replicas_; q += pipelines_per_island_)
    out.push_back(rank_at(q, stage_));
  return out;
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
      return sync_ == SyncKind::kDataParallel ? "ddp" : sync_ == SyncKind::kAsyncDiloco ? "async_diloco" : "diloco";
    case RunKind::kPipelines:
      return std::string(chunks_ > 0 ? "local-stages" : "pipeline") + (sync_ == SyncKind::kDiloco ? "+diloco" : "");
    case RunKind::kDipaco:
      return "dipaco";
    case RunKind::kIslands:
      return sync_ == SyncKind::kAsyncDiloco ? "islands+async_diloco" : "islands";
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
          "layout: {} pipeline(s) x {} stages{}{}{}; rank {} runs stage {} of pipeline {}", replicas_, stages_,
          pipelines_per_island_ == 1 ? ", one per island (its stages on the island's fast link)"
          : pipelines_per_island_ > 1
              ? fmt::format(", {} per island (their stages on the island's fast link, a stage's "
                            "replicas in an island data parallel)",
                            pipelines_per_island_)
              : "",
          replicas_ > 1 ? fmt::format(", each stage's replicas kept together by {}", sync_name(sync_)) : "", local,
          rank_, stage_, replica_);
    case RunKind::kDipaco:
      return fmt::format("layout: DiPaCo, {} worker(s) claiming path tasks", world_size_);
    case RunKind::kIslands:
      return fmt::format(
          "layout: {} islands of {} ranks, data parallel inside, {}{}; rank {} is rank {} of island {}",
          islands_.count(), fmt::join(islands_.sizes(), "/"),
          sync_ == SyncKind::kAsyncDiloco
              ? std::string("asynchronous DiLoCo across (each island's rank 0 posts and adopts without waiting)")
          : islands_.leads_exchange()
              ? std::string("DiLoCo across, fault tolerant: the islands are the quorum's members, their ranks 0 "
                            "exchange the whole model")
              : fmt::format("DiLoCo across, the outer exchange sharded {} way(s)", islands_.outer_shards()),
          islands_.batches_per_tick() != world_size_
              ? fmt::format(", time-paced: {} optimizer steps per tick", fmt::join(islands_.all_steps(), "/"))
              : "",
          rank_, islands_.rank_in_island(), islands_.island());
  }
  return "layout: ?";
}

}  // namespace tributary
