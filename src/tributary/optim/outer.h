// The outer optimizer of DiLoCo (and, per module, DiPaCo): the global parameters and the Nesterov momentum live in
// host memory (fp32, CPU) whatever device the inner loop runs on, so that a GPU holds one model (torchft RFC #342).
// For a model on a GPU that memory is pinned: the local parameters come down into a pinned staging copy (one wait for
// all of them, at the full DMA rate) and the new global parameters go up without the host waiting, so the next inner
// steps are launched while they travel (the stream runs the copies before them).
//   pseudo-gradient  delta = theta_global - theta_local            (per replica; then averaged across replicas)
//   Nesterov SGD     buf = mu * buf + delta;  theta_global -= lr * (delta + mu * buf)   (torch.optim.SGD, nesterov)
// With lr = 1 and mu = 0 the step is plain averaging of the replicas (FedAvg).
#pragma once

#include <torch/torch.h>

#include "tributary/core/safetensors.h"
#include "tributary/model/tensor_io.h"

namespace tributary {

struct OuterOptions {
  double lr = 0.7;
  double momentum = 0.9;
};

class OuterOptimizer {
 public:
  OuterOptimizer(const NamedTensors& params, OuterOptions options);  // copies the current parameters as global

  // delta[i] = global[i] - local[i] (fp32, CPU), in the order of the parameters.
  std::vector<torch::Tensor> pseudo_gradient(const NamedTensors& local) const;
  // One Nesterov step on the global parameters with the averaged pseudo-gradient; then copies them into `local`.
  void step(const std::vector<torch::Tensor>& averaged_delta, NamedTensors& local);
  // The same step without touching the local parameters (Streaming DiLoCo merges them itself).
  void apply(const std::vector<torch::Tensor>& averaged_delta);
  // The global parameters into `local` (step()'s second half): asynchronous from pinned memory.
  void copy_to(NamedTensors& local) const;

  const NamedTensors& global() const { return global_; }
  NamedTensors state() const;  // "<param>.outer_momentum"
  int64_t num_steps() const { return num_steps_; }
  void set_num_steps(int64_t n) { num_steps_ = n; }  // a joining replica (its state arrived in place)
  // Resume: global parameters ("<param>") and momenta ("<param>.outer_momentum") from a checkpoint's file.
  void load_state(const safetensors::File& file, int64_t num_steps);
  // Resume of asynchronous DiLoCo's merger: only the momenta ("<param>.outer_momentum"; the globals are the model it
  // was built from). Error naming `origin` for a missing or misshapen one.
  void load_momenta(const NamedTensors& momenta, const std::string& origin);

 private:
  // The device's queued work that reads the host state (the last step's copies up) is finished before it changes.
  void wait_for_device() const;

  NamedTensors global_;
  std::vector<torch::Tensor> momentum_;
  bool pinned_ = false;                         // a parameter lives on a GPU
  int64_t device_index_ = -1;                   // that GPU
  mutable std::vector<torch::Tensor> staging_;  // pinned: the local parameters brought down, reused every round
  OuterOptions options_;
  int64_t num_steps_ = 0;
};

}  // namespace tributary
