// The trainer: the one entry point of every kind of run. One run loop serves one process, replicas of the model (data
// parallel, DiLoCo, Streaming DiLoCo), pipelines of stages, local parallelism and islands; DiPaCo's rounds still have
// their own loop (runtime/dipaco/worker.h), which reports through the same TrainSummary and stop agreement. The loop
// reads as a sentence: next batch -> step (forward, backward, AdamW) -> sync -> report / evaluate / checkpoint / stop.
// Deterministic for a seed and thread count; `resume` continues bit for bit from a checkpoint.
#pragma once

#include "tributary/runtime/run_config.h"
#include "tributary/runtime/train_options.h"
#include "tributary/runtime/train_summary.h"

namespace tributary {

TrainSummary train(const RunConfig& config, const TrainOptions& options);

}  // namespace tributary
