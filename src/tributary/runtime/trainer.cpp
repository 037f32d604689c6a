#include "tributary/runtime/trainer.h"

#include "tributary/runtime/dipaco/worker.h"
#include "tributary/runtime/run_layout.h"
#include "tributary/runtime/run_loop.h"
#include "tributary/runtime/training_run.h"

namespace tributary {

TrainSummary train(const RunConfig& config, const TrainOptions& options) {
  std::unique_ptr<WorkSource> work;
  if (run_layout(config, options.dist).kind() == RunKind::kDipaco)
    work = dipaco::make_path_rounds(config, options);
  else
    work = std::make_unique<detail::TrainingRun>(config, options);
  return run_loop(*work, options.stop_after_step);
}

}  // namespace tributary
