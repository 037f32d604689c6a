#include "tributary/runtime/sync/sync.h"

#include "tributary/perf/flops.h"
#include "tributary/runtime/sync/async_sync.h"
#include "tributary/runtime/sync/island_sync.h"
#include "tributary/runtime/sync/pipeline_sync.h"
#include "tributary/runtime/sync/replica_sync.h"

namespace tributary {

Started Sync::start(const StartState& state) {
  const KnownPeak peak = best_known_peak(measure_matmul_peak(state.device),
                                         peak_key(state.device, torch::kFloat32, torch::get_num_threads(), 1));
  return {.peak_flops = peak.flops, .peak_words = describe_peak(peak)};
}

std::unique_ptr<Sync> make_sync(const Session* session, const Layout& layout) {
  switch (layout.kind()) {
    case RunKind::kReplicas:
      if (layout.sync() == SyncKind::kAsyncDiloco) return std::make_unique<AsyncSync>(*session);
      return std::make_unique<ReplicaSync>(*session);
    case RunKind::kPipelines:
      return std::make_unique<PipelineSync>(*session, layout);
    case RunKind::kIslands:
      return std::make_unique<IslandSync>(*session, layout);
    case RunKind::kSingle:
    case RunKind::kDipaco:  // DiPaCo's workers are runtime/dipaco/worker.h's, not the trainer's
      break;
  }
  return std::make_unique<Sync>();  // one process: no peers, nothing to keep together
}

}  // namespace tributary
