// AdamW with decoupled weight decay: torch.optim.AdamW's arithmetic (foreach=False, PyTorch 1.13), in one pass per
// element on CPU float32 (equal to PyTorch's to rounding; GoldenAdamW holds it to 1e-6 relative). On a GPU the step is
// ATen's fused multi-tensor kernel (`_fused_adamw_`, torch.optim.AdamW(fused=True)): a few launches per step instead
// of six per parameter, which is what bounds a small model's step there.
// Our own implementation (not torch::optim) so that its state is plainly named tensors: checkpointed as safetensors,
// and later shipped, averaged or reset per module by the outer loop of DiLoCo/DiPaCo.
// Weight decay applies to matrices and embeddings (dim >= 2), not to norm gains.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tributary/model/tensor_io.h"

namespace tributary {

// Which code steps the parameters. kAuto: ours on CPU float32, ATen's fused kernel on any other device, the composite
// ATen ops otherwise (other dtypes on the CPU). The others force one path (tests compare them).
enum class AdamWKernel { kAuto, kOurs, kATenFused, kComposite };

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  AdamWKernel kernel = AdamWKernel::kAuto;
};

class AdamW {
 public:
  AdamW(NamedTensors params, AdamWOptions options);

  void step(double lr);  // uses each parameter's .grad(); parameters without a gradient are skipped
  void zero_grad();
  // From now on the parameters of `group` (the same tensors as some of this optimizer's) step with lr * scale: local
  // parallelism's per-chunk learning rates. Weight decay scales with them, as with torch's per-group lr. A scale of 1
  // leaves the step bit for bit as it was.
  void set_lr_scale(const NamedTensors& group, double scale);

  // ZeRO-1 (runtime/sync/island_sync.h): from now on this optimizer keeps and steps only rows core/row_split(index,
  // count) of every parameter, its moments cut to them. After each step `make_whole` (collective over the ranks that
  // hold the other shards) brings their rows of the parameters to this rank; state() hands it whole-size moments in
  // which only this rank's rows are filled, so that every rank returns the whole state.
  using MakeWhole = std::function<void(const std::vector<torch::Tensor>& tensors)>;
  void keep_rows(int64_t index, int64_t count, MakeWhole make_whole);
  bool sharded() const { return shard_count_ > 1; }
  double held_bytes() const;  // the moments this rank keeps (1/count of them when sharded)

  int64_t num_steps() const { return num_steps_; }
  void set_num_steps(int64_t n) { num_steps_ = n; }  // a joining replica: its state() tensors were filled in place
  // State as named tensors: "<param>.exp_avg", "<param>.exp_avg_sq"; the step count travels in metadata. Whole
  // when sharded (then collective, see keep_rows).
  NamedTensors state() const;
  void load_state(const safetensors::File& file, int64_t num_steps);

  // The step in two halves, for a step captured as a CUDA graph (runtime/step_graph.h): prepare_device_step advances
  // the count and writes lr and the count into tensors on the parameters' device (host work, before each replay);
  // device_step launches ATen's fused kernel, which reads them (what the graph captures). The parameters, gradients
  // and moments must keep their storage from the first prepare on (zero_grad and load_state write in place).
  void prepare_device_step(double lr);
  void device_step();

 private:
  NamedTensors params_;
  std::vector<torch::Tensor> exp_avg_, exp_avg_sq_;
  std::vector<bool> decay_;
  std::vector<double> lr_scale_;
  AdamWOptions options_;
  int64_t num_steps_ = 0;
  int64_t shard_index_ = 0, shard_count_ = 1;  // keep_rows
  MakeWhole make_whole_;
  torch::Tensor device_step_;  // the fused kernel's step count, on the parameters' device

  // Parameters with gradients that ATen's fused kernel steps in one launch: one learning rate and decay.
  struct FusedGroup {
    double lr_scale, weight_decay;
    std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs;
    torch::Tensor lr;  // the group's learning rate, on the parameters' device (a captured step reads it there)
  };
  std::vector<FusedGroup> device_groups_;  // prepare_device_step's, kept for every step after

  torch::Tensor rows_of(const torch::Tensor& t) const;  // this shard's rows (the tensor itself unsharded)
  // The groups of every parameter with a gradient; nullopt (or, forced, an error) where the tensors do not suit it.
  std::optional<std::vector<FusedGroup>> fused_groups(bool forced) const;
  void write_device_step(const torch::Tensor& like);
  void launch_fused(const FusedGroup& group) const;  // at group.lr
  // ATen's fused kernel over every parameter with a gradient; returns false (stepping nothing) where the tensors do
  // not suit it.
  bool aten_fused_step(double lr, bool forced);
  void make_whole_after_step();  // ZeRO-1: the other shards' rows arrive (keep_rows)
};

// Scales gradients so their global L2 norm is at most max_norm (0: no clipping). Returns the norm before clipping.
// On a GPU it is clip_grad_norm_on_device and one host read of the norm.
double clip_grad_norm(const NamedTensors& params, double max_norm);
// The same without a host read, for a captured step (runtime/step_graph.h): the gradients are scaled by
// min(1, max_norm / (norm + 1e-6)) on their device, and the norm comes back as a 0-d tensor there.
torch::Tensor clip_grad_norm_on_device(const NamedTensors& params, double max_norm);

}  // namespace tributary
