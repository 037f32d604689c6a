// What a pipeline stage does with its gradients after the micro-batches and before clipping, for the pipeline step
// and the local-parallel stage alike (Megatron/DeepSpeed order): the tied embedding's gradient summed between the
// first and the last stage (lookup + head), then the stage's data-parallel average over its replicas in the other
// pipelines (one all-reduce of the flattened gradients: one round trip per step, not one per tensor).
#pragma once

#include <cstdint>

#include "tributary/model/tensor_io.h"
#include "tributary/parallel/pipeline/pipeline_step.h"

namespace tributary::pipeline {

// At `step` (0-based). Returns the bytes the data-parallel all-reduce sends as a ring does (2 (n-1)/n x the
// gradients); 0 without one.
int64_t reduce_stage_gradients(NamedTensors& params, const PipelineGroups& groups, int64_t stage, bool first, bool last,
                               int64_t step);

}  // namespace tributary::pipeline
