// What kind of run this is and where this rank stands in it, resolved once before any group is built (torchtitan's
// ParallelDims): the ranks form R replicas of the model (D_DP), each a pipeline of S stages (D_PP; S = 1 without a
// pipeline), and rank_at(replica, stage) names the rank that runs a stage of a replica. The replicas of a stage stay
// together by one kind of sync (data parallel, DiLoCo); DiPaCo's workers train paths and sync modules with their
// owners. Local parallelism cuts the model into chunks (one per stage across processes, all in one process otherwise).
// Islands (parallel.islands) group the replicas by a fast link: data parallel inside an island, DiLoCo across the
// islands, the outer exchange sharded over the island's ranks (runtime/sync/island_sync.h).
//
// Pure and torch-free: the trainer, the planner and the unit tests compute the same layout from the same keys.
// Megatron's order unless a placement renames the ranks: stage s's replicas are ranks s*R .. s*R + R - 1, replica
// (pipeline) i is ranks i, i + R, ...; sched's evaluate_megatron prices the same order.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tributary/parallel/island_shape.h"

namespace tributary {

// How the replicas of the model (or of each pipeline stage) stay together.
enum class SyncKind {
  kNone,          // one replica
  kDataParallel,  // gradients averaged every step
  kDiloco,        // H local steps, then an outer step on the averaged pseudo-gradients (Streaming: per fragment)
  kModules,       // DiPaCo: each path's pseudo-gradient goes to its modules' owners
  kAsyncDiloco,   // DiLoCo without the barrier: each replica posts its updates, a merger merges by quorum
};

enum class RunKind {
  kSingle,     // one process (local parallelism may still cut it into chunks)
  kReplicas,   // replicas of the whole model, one per process
  kPipelines,  // pipelines of stages, one stage per process; replicas of each stage across the pipelines
  kDipaco,     // workers claiming path tasks
  kIslands,  // islands of ranks joined by a fast link: data parallel inside, DiLoCo across (runtime/sync/island_sync.h)
};

// A placement's answer (sched/placement.h's placement.json, read by config/run_layout.h): which rank runs which stage
// of which pipeline, and which cluster device each rank emulates.
struct PlacedRanks {
  int64_t replicas = 0, stages = 0;
  std::vector<std::vector<int>> rank_at;  // [replica][stage]
  std::vector<int> device_of_rank;
};

// The keys that decide the layout (RunConfig's, read by config/run_layout.h).
struct LayoutSpec {
  int rank = 0, world_size = 1;
  int64_t pipeline_stages = 1;           // parallel.pipeline_stages
  int64_t local_chunks = 0;              // local.chunks
  bool dipaco = false;                   // dipaco.modules set
  bool diloco = true;                    // dist.algorithm: diloco (true) or ddp
  bool async = false;                    // dist.algorithm = async_diloco (replicas of the whole model only)
  int64_t warmup_ddp_steps = 0;          // dist.warmup_ddp_steps (resolved: >= 0)
  std::optional<PlacedRanks> placement;  // parallel.placement, read
  std::string placement_key;             // its file, for messages
  std::string islands;                   // parallel.islands: "" | "N" (equal) | "4,4,2" (sizes) | "machines"
  std::string island_steps;              // parallel.island_steps: "" | steps per tick per island "2,1" | "auto"
  int local_world_size = 1;              // processes on this rank's machine ("machines": one island each)
  bool fault_tolerant = false;           // dist.fault_tolerant: the members are the islands, one per machine
};

// A value: its public methods read it; none changes it.
// Size: every group and count of a layout is one question a caller asks.
class Layout {
 public:
  // Error naming the key on a shape that cannot run (a world the stages do not divide, a placement of another
  // shape, local chunks across processes without a pipeline).
  static Layout resolve(const LayoutSpec& spec);

  RunKind kind() const { return kind_; }
  SyncKind sync() const { return sync_; }
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  bool distributed() const { return world_size_ > 1; }
  int64_t stages() const { return stages_; }      // D_PP, 1 without a pipeline
  int64_t replicas() const { return replicas_; }  // D_DP: replicas of the model (pipelines)
  int64_t stage() const { return stage_; }        // this rank's
  int64_t replica() const { return replica_; }    // this rank's (its pipeline)
  int64_t local_chunks() const { return chunks_; }
  // DiLoCo's data-parallel warm-up (dist.warmup_ddp_steps): the steps before DiLoCo starts, 0 without one.
  int64_t warmup_ddp_steps() const { return warmup_ddp_steps_; }
  // A pipeline stage averages its gradients over its replicas in its own step: data parallel every step (-1), or
  // during DiLoCo's warm-up only (its step count); 0: it does not (one pipeline, or DiLoCo without a warm-up).
  int64_t stage_data_parallel_steps() const;

  int rank_at(int64_t replica, int64_t stage) const { return rank_at_[size_t(replica)][size_t(stage)]; }
  int device_of(int rank) const { return device_of_rank_[size_t(rank)]; }
  const std::vector<int>& device_of_rank() const { return device_of_rank_; }
  std::vector<int> pipeline_ranks() const;       // this rank's pipeline, stage by stage
  std::vector<int> stage_replica_ranks() const;  // the ranks that run this rank's stage, replica by replica
  // Pipelines in islands (parallel.islands with parallel.pipeline_stages): d pipelines per island, island-major
  // (island i's pipelines are i x d .. i x d + d - 1); 0 otherwise. With d > 1 a stage's replicas inside an island
  // average their gradients every step (stage_data_parallel_steps() = -1 over island_stage_ranks()), and the island's
  // first pipeline speaks for the island across the islands (DiLoCo per stage over lead_stage_ranks()).
  int64_t pipelines_per_island() const { return pipelines_per_island_; }
  int64_t pipeline_in_island() const { return pipelines_per_island_ > 0 ? replica_ % pipelines_per_island_ : 0; }
  std::vector<int> island_stage_ranks() const;  // this rank's stage in its island's pipelines
  std::vector<int> lead_stage_ranks() const;    // this rank's stage in every island's first pipeline

  // Islands (RunKind::kIslands; otherwise every rank is an island of one, in lockstep): parallel/island_shape.h.
  const IslandShape& islands() const { return islands_; }

  // "diloco", "ddp", "pipeline", "pipeline+diloco", "local-stages", "local", "single", "dipaco": summary.json's
  // algorithm.
  std::string name() const;
  // One line for the start-up log: the kind, the shape and this rank's place.
  std::string describe() const;

 private:
  void place_islands(const LayoutSpec& spec);
  void place_pipeline_islands(const LayoutSpec& spec, const std::vector<int64_t>& islands);
  static void check_fault_tolerant_islands(const LayoutSpec& spec, const std::vector<int64_t>& islands);

  RunKind kind_ = RunKind::kSingle;
  SyncKind sync_ = SyncKind::kNone;
  int rank_ = 0, world_size_ = 1;
  int64_t stages_ = 1, replicas_ = 1, stage_ = 0, replica_ = 0, chunks_ = 0, warmup_ddp_steps_ = 0;
  std::vector<std::vector<int>> rank_at_;  // [replica][stage]
  std::vector<int> device_of_rank_;
  IslandShape islands_;
  int64_t pipelines_per_island_ = 0;  // parallel.islands with pipelines (island-major ranks); 0: none
};

const char* sync_name(SyncKind sync);

// parallel.islands' island sizes for a world: "" (none: empty), "N" (N equal islands), "4,4,2", or "machines" (one
// island per machine of `local_world_size` processes). An Error naming `key` when they do not cover the world.
std::vector<int64_t> parse_islands(const std::string& text, int world_size, int local_world_size,
                                   const std::string& key);

}  // namespace tributary
