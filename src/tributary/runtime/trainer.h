// The trainer: the one entry point of every kind of run. One run loop (run_loop.h) drives one source of work: the
// trainer's steps (training_run.h) for one process, replicas of the model (data parallel, DiLoCo, Streaming DiLoCo),
// pipelines of stages, local parallelism and islands, or DiPaCo's rounds of path tasks (dipaco/worker.h). A unit reads
// as a sentence: next batch -> step (forward, backward, AdamW) -> sync -> report; then evaluate / checkpoint / stop.
// Deterministic for a seed and thread count; `resume` continues bit for bit from a checkpoint.
#pragma once

#include "tributary/config/run_config.h"
#include "tributary/runtime/train_options.h"
#include "tributary/runtime/train_summary.h"

namespace tributary {

TrainSummary train(const RunConfig& config, const TrainOptions& options);

}  // namespace tributary
