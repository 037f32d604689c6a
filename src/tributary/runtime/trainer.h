// The trainer: one run loop for every kind of run but DiPaCo's (runtime/dipaco/worker.h) — one process, replicas of
// the model (data parallel, DiLoCo, Streaming DiLoCo), pipelines of stages, local parallelism. The loop reads as a
// sentence: next batch -> step (forward, backward, AdamW) -> sync -> report / evaluate / checkpoint / stop.
// Deterministic for a seed and thread count; `resume` continues bit for bit from a checkpoint.
#pragma once

#include "tributary/runtime/run_config.h"
#include "tributary/runtime/train_options.h"
#include "tributary/runtime/train_summary.h"

namespace tributary {

TrainSummary train(const RunConfig& config, const TrainOptions& options);

}  // namespace tributary
