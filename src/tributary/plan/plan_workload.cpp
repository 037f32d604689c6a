#include "tributary/plan/plan_workload.h"

#include "tributary/core/error.h"
#include "tributary/data/dataset.h"

namespace tributary {
namespace {

// Bytes per value on the wire; 0 for codecs whose size depends on the data or their own settings.
double bytes_of(const std::string& codec) {
  if (codec == "fp32") return 4;
  if (codec == "fp16" || codec == "bf16") return 2;
  if (codec == "int8") return 1;
  if (codec == "fp4") return 0.5;
  if (codec == "terngrad") return 0.25;
  if (codec == "hadamard4") return 0.5 + 4.0 / 64;  // parallel/pipeline/wire.h: a scale per 64 values
  if (codec == "hadamard2") return 0.25 + 4.0 / 64;
  // AQ-SGD: a revisited example's delta (its first visit travels as int8; the planner plans the steady state)
  if (codec == "aq4") return 0.5 + 4.0 / 64;
  if (codec == "aq2") return 0.25 + 4.0 / 64;
  return 0;
}

}  // namespace

sched::Workload workload_of(const RunConfig& c, int devices, const std::string& name) {
  const int64_t stages = c.parallel.pipeline_stages;
  if (devices % stages != 0)
    fail("parallel.pipeline_stages = {} does not divide the cluster's {} devices: the layout is D_DP x D_PP = devices",
         stages, devices);
  int64_t vocab = c.model.vocab_size;
  if (vocab == 0) vocab = Dataset::open(c.data.dir).vocab_size();  // as train does
  sched::Workload w;
  w.name = name;
  w.num_layers = c.model.num_layers;
  w.width = c.model.width;
  w.seq_len = c.model.context;
  w.d_pp = static_cast<int>(stages);
  w.d_dp = static_cast<int>(devices / stages);
  w.global_batch = double(c.train.batch_size * c.train.grad_accum * w.d_dp);
  w.num_parameters = double(c.model.num_parameters(vocab));
  const bool diloco = c.dist.diloco();
  w.sync_every = diloco ? c.dist.inner_steps : 1;
  w.micro_batches = c.parallel.micro_batches;
  w.bytes_per_parameter = diloco ? bytes_of(c.dist.compression) : 4.0;  // data parallel all-reduces fp32 gradients
  if (w.bytes_per_parameter == 0)
    fail(
        "dist.compression = {}: its bytes depend on its settings and the data; plan with a workload file that gives "
        "bytes_per_parameter",
        c.dist.compression);
  w.bytes_per_activation = bytes_of(c.parallel.activation_compression);
  return w;
}

}  // namespace tributary
