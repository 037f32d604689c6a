#include "tributary/runtime/trainer.h"

#include "tributary/config/run_layout.h"
#include "tributary/core/error.h"
#include "tributary/runtime/dipaco/worker.h"
#include "tributary/runtime/run_loop.h"
#include "tributary/runtime/training_run.h"

namespace tributary {

TrainSummary train(const RunConfig& config, const TrainOptions& options) {
  const Layout layout = run_layout(config, options.dist);
  // launch --restart-island starts an island's workers again as joiners: only fault-tolerant islands (of ranks, or
  // one pipeline each) can take them.
  const bool islands = layout.kind() == RunKind::kIslands || layout.pipelines_per_island() > 0;
  if (options.dist.island_life >= 0 && !(islands && config.dist.fault_tolerant))
    fail(
        "launch --restart-island starts a machine's island again when one of its workers dies, which only "
        "fault-tolerant islands can take back: set parallel.islands = machines and dist.fault_tolerant = true, or "
        "launch without --restart-island");
  std::unique_ptr<WorkSource> work;
  if (layout.kind() == RunKind::kDipaco)
    work = dipaco::make_path_rounds(config, options);
  else
    work = std::make_unique<detail::TrainingRun>(config, options);
  return run_loop(*work, options.stop_after_step);
}

}  // namespace tributary
