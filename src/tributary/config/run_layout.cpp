#include "tributary/config/run_layout.h"

#include "tributary/sched/placement.h"

namespace tributary {

Layout run_layout(const RunConfig& config, const DistEnv& env) {
  LayoutSpec spec{.rank = env.rank,
                  .world_size = env.world_size,
                  .pipeline_stages = config.parallel.pipeline_stages,
                  .local_chunks = config.local.chunks,
                  .dipaco = !config.dipaco.modules.empty(),
                  .diloco = config.dist.diloco(),
                  .async = config.dist.async_diloco(),
                  .warmup_ddp_steps = std::max<int64_t>(config.dist.warmup_ddp_steps, 0),
                  .placement = std::nullopt,
                  .placement_key = config.parallel.placement,
                  .islands = config.parallel.islands,
                  .island_steps = config.parallel.island_steps,
                  .local_world_size = env.local_world_size,
                  .fault_tolerant = config.dist.fault_tolerant};
  if (!config.parallel.placement.empty() && config.parallel.pipeline_stages > 1) {
    const sched::Placement placement = sched::read_placement(config.parallel.placement);
    spec.placement = PlacedRanks{.replicas = placement.d_dp,
                                 .stages = placement.d_pp,
                                 .rank_at = placement.pipelines,
                                 .device_of_rank = placement.cluster_device};
  }
  return Layout::resolve(spec);
}

}  // namespace tributary
