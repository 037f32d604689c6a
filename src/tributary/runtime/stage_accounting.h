// A pipeline stage's measurements over the run: its step's traffic (activations, their gradients, the stage's
// data-parallel average), compute and blocked time, what it sent to keep its replicas together, and the process's
// peak resident memory; gathered over the pipeline at the end into summary.json's "stages".
#pragma once

#include <functional>

#include <nlohmann/json.hpp>

#include "tributary/parallel/pipeline/pipeline_step.h"
#include "tributary/runtime/sync/pipeline_sync.h"

namespace tributary {

class StageAccounting {
 public:
  explicit StageAccounting(std::function<pipeline::PipelineStats()> take_step_stats)
      : take_(std::move(take_step_stats)) {}

  // After a step: its numbers join the run's; returned for the run's own traffic totals.
  pipeline::PipelineStats after_step();
  // Bytes the stage's DiLoCo exchanges sent (its data-parallel average is in the step's numbers).
  void add_sync_bytes(double bytes) { sync_bytes_ += bytes; }
  // Every rank of the pipeline takes part: per stage of this rank's pipeline, compute and blocked seconds, the
  // measured bubble (1 - compute / step time), bytes of activations and gradients, sync bytes and peak memory.
  nlohmann::json gather(PipelineSync& pipelines, double train_seconds) const;

 private:
  std::function<pipeline::PipelineStats()> take_;
  pipeline::PipelineStats total_;
  double sync_bytes_ = 0;
  double peak_rss_mb_ = 0;  // after the last step: the end's consolidation and checkpoint add theirs
};

}  // namespace tributary
