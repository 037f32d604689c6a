// The scheduler's workload (sched/workload.h) of a training configuration, so that `tributary plan --config` prices
// the run that `train` with the same configuration does: the model's blocks, width, context and exact parameter
// count, the batch of all pipelines, the bytes on the wire (dist.compression for the replicas' exchange,
// parallel.activation_compression for the activations) and how often replicas exchange (DiLoCo: dist.inner_steps).
#pragma once

#include "tributary/config/run_config.h"
#include "tributary/sched/workload.h"

namespace tributary {

// `devices`: the cluster's size; the layout is parallel.pipeline_stages x (devices / stages). Error naming the key for
// what cannot be priced (a layout that does not divide the devices, a codec whose size depends on the data).
sched::Workload workload_of(const RunConfig& config, int devices, const std::string& name);

}  // namespace tributary
