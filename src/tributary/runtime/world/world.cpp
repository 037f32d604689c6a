#include "tributary/runtime/world/world.h"

#include "tributary/runtime/flops.h"
#include "tributary/runtime/world/island_world.h"
#include "tributary/runtime/world/pipeline_world.h"
#include "tributary/runtime/world/replica_world.h"

namespace tributary::detail {

double World::matmul_peak(const torch::Device& device) { return measure_matmul_peak(device); }

std::unique_ptr<World> make_world(const Session* session, const Layout& layout) {
  switch (layout.kind()) {
    case RunKind::kReplicas:
      return std::make_unique<ReplicaWorld>(*session);
    case RunKind::kPipelines:
      return std::make_unique<PipelineWorld>(*session, layout);
    case RunKind::kIslands:
      return std::make_unique<IslandWorld>(*session, layout);
    case RunKind::kSingle:
    case RunKind::kDipaco:  // DiPaCo's workers are runtime/dipaco/worker.h's, not the trainer's
      break;
  }
  return std::make_unique<World>();  // one process: no peers, nothing to keep together
}

}  // namespace tributary::detail
