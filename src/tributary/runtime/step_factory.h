// Which step runs behind the seam (parallel/train_step.h), from the run's configuration and parts: a local-parallel
// stage or all chunks in one process (local.chunks > 0), a pipeline stage (parallel.pipeline_stages > 1), or the dense
// model (one process or data-parallel/DiLoCo replicas).
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>

#include "tributary/config/run_config.h"
#include "tributary/data/loader.h"
#include "tributary/model/aux_head.h"
#include "tributary/model/tensor_io.h"
#include "tributary/model/transformer.h"
#include "tributary/optim/adamw.h"
#include "tributary/parallel/pipeline/pipeline_step.h"
#include "tributary/parallel/train_step.h"

namespace tributary {

class PipelineSync;
class ReplicaRounds;

struct StepInputs {
  const RunConfig& config;
  Transformer& model;
  NamedTensors& params;   // every parameter of the model
  NamedTensors& trained;  // what the optimizer updates: a stage's parameters (+ its head's), or every parameter
  AuxHeads* heads;        // local parallelism's auxiliary heads; null without
  AdamW& optimizer;
  BatchLoader& loader;
  ReplicaRounds* sync;      // the whole model's replicas' (data parallel averages gradients in the step); may be null
  PipelineSync* pipelines;  // this process's pipeline stage; null without pipeline stages
  torch::Device device;
  double slowdown = 1;  // dist.slow_workers' factor for this process
};

struct BuiltStep {
  std::unique_ptr<TrainStep> step;
  std::function<pipeline::PipelineStats()> take_stage_stats;  // set for a pipeline or local stage
  // The step sleeps for dist.slow_workers itself (a pipeline stage, after each forward and backward: a sleep after
  // the whole step would also stretch its waits for the neighbours); otherwise the loop sleeps after each step.
  bool slows_itself = false;
};

BuiltStep make_train_step(const StepInputs& in);

}  // namespace tributary
