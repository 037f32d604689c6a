#include "tributary/runtime/step_factory.h"

#include "tributary/core/error.h"
#include "tributary/parallel/local/local_stage.h"
#include "tributary/parallel/local/local_step.h"
#include "tributary/parallel/pipeline/wire.h"
#include "tributary/runtime/step_runner.h"
#include "tributary/runtime/sync/pipeline_sync.h"

namespace tributary {

BuiltStep make_train_step(const StepInputs& in) {
  const RunConfig& c = in.config;
  const LocalConfig& local = c.local;
  const auto plan = [&] {
    return local::ChunkPlan::make(c.model.num_layers, local.chunks, local.mode, local.overlap_blocks);
  };
  const auto wire = [&] {
    return pipeline::parse_wire(c.parallel.activation_compression, "parallel.activation_compression");
  };
  BuiltStep out;
  if (in.heads && in.pipelines) {
    if (pipeline::is_delta(wire()))
      fail(
          "parallel.activation_compression = '{}' keeps a cache per pipeline boundary, which local parallelism's "
          "stages do not have: use int8, hadamard4 or hadamard2 with local.chunks",
          c.parallel.activation_compression);
    auto step = std::make_unique<local::LocalStage>(local::LocalStageParts{.model = in.model,
                                                                           .heads = *in.heads,
                                                                           .params = in.trained,
                                                                           .optimizer = in.optimizer,
                                                                           .loader = in.loader,
                                                                           .groups = in.pipelines->groups(),
                                                                           .report = in.pipelines->stage_report(),
                                                                           .plan = plan(),
                                                                           .stage = in.pipelines->stage(),
                                                                           .micro_batches = c.parallel.micro_batches,
                                                                           .aux_weight = local.aux_weight,
                                                                           .device = in.device,
                                                                           .grad_clip = c.optim.grad_clip,
                                                                           .wire = wire(),
                                                                           .lr_scale = lr_scales(local)});
    out.take_stage_stats = [s = step.get()] { return s->take_stats(); };
    out.step = std::move(step);
  } else if (in.heads) {
    out.step = std::make_unique<local::LocalStep>(local::LocalStepParts{.model = in.model,
                                                                        .heads = *in.heads,
                                                                        .optimizer = in.optimizer,
                                                                        .loader = in.loader,
                                                                        .plan = plan(),
                                                                        .aux_weight = local.aux_weight,
                                                                        .device = in.device,
                                                                        .grad_accum = c.train.grad_accum,
                                                                        .grad_clip = c.optim.grad_clip,
                                                                        .lr_scale = lr_scales(local)});
  } else if (!in.pipelines) {
    out.step = std::make_unique<DenseStep>(DenseStepParts{in.model, in.params, in.optimizer, in.loader, in.sync,
                                                          in.device, c.train.grad_accum, c.optim.grad_clip,
                                                          c.train.precision == "bf16", c.train.cuda_graph});
  } else {
    auto step = std::make_unique<pipeline::PipelineStep>(pipeline::PipelineStepParts{
        in.model, in.trained, in.optimizer, in.loader, in.pipelines->groups(), in.pipelines->schedule(),
        in.pipelines->layout(), in.pipelines->stage(), in.device, c.optim.grad_clip, wire(),
        int64_t(c.parallel.activation_cache_mb * 1024 * 1024), in.slowdown});
    out.slows_itself = true;
    out.take_stage_stats = [s = step.get()] { return s->take_stats(); };
    out.step = std::move(step);
  }
  return out;
}

}  // namespace tributary
