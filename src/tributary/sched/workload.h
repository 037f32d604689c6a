// What is being trained, as the scheduler sees it: the bytes a stage's data-parallel group exchanges (c_DP) and the
// bytes of activations crossing one stage boundary per macro-batch (c_PP), for a layout of D_DP x D_PP devices.
// Either derived from the model (layers, width, sequence, global batch, bytes per value) or given directly.
#pragma once

#include <cstdint>
#include <string>

namespace tributary::sched {

struct Workload {
  std::string name = "workload";
  int64_t num_layers = 0;
  int64_t width = 0;
  int64_t seq_len = 0;
  double global_batch = 0;          // sequences per iteration
  double num_parameters = 0;        // 0: 12 * layers * width^2 (transformer blocks)
  double bytes_per_parameter = 4;   // gradients exchanged in data parallel (fp32)
  double bytes_per_activation = 2;  // activations between stages (fp16)
  int d_dp = 0, d_pp = 0;           // the layout (0: search or take from the cluster size)
  double c_dp_gb = 0, c_pp_gb = 0;  // > 0: given directly (for the layout d_dp x d_pp), overriding the derivation
  // Iterations per data-parallel exchange: 1 = data parallel (every iteration); DiLoCo's H: each stage's replicas
  // exchange pseudo-gradients every H steps, so an iteration pays 1/H of the exchange, latency included (CostModel's
  // sync_every). The planner then keeps the pipelines on the good links and lets the replicas cross the slow ones.
  int64_t sync_every = 1;
  // Micro-batches per macro-batch (parallel.micro_batches): only the compute term uses it (CostModel::set_compute).
  int64_t micro_batches = 1;

  double parameters() const;
  // c_DP (one exchange) and c_PP in GB (1e9 bytes) for a layout; the given constants apply to the workload's own
  // layout only.
  double c_dp(int dp, int pp) const;
  double c_pp(int dp, int pp) const;
  // Training FLOPs of one tasklet (forward + backward of one stage on one macro-batch): 6 * params/pp * tokens.
  double tasklet_flops(int dp, int pp) const;
  // Rough per-device memory for one stage: weights, gradients and Adam moments in fp32 (16 B/param) plus the
  // stashed activations of a macro-batch at every layer of the stage.
  double stage_memory_gb(int dp, int pp) const;
};

Workload load_workload(const std::string& path_or_preset);  // JSON file or preset "gpt3-xl"
Workload parse_workload(const std::string& json_text, const std::string& origin);

}  // namespace tributary::sched
