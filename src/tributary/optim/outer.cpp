#include "tributary/optim/outer.h"

#include <map>

#include <torch/cuda.h>

#include "tributary/core/error.h"

namespace tributary {

OuterOptimizer::OuterOptimizer(const NamedTensors& params, OuterOptions options) : options_(options) {
  for (const auto& [name, p] : params)
    if (p.is_cuda()) {
      pinned_ = true;
      device_index_ = p.device().index();
    }
  const auto host = torch::TensorOptions(torch::kFloat32).pinned_memory(pinned_);
  for (const auto& [name, p] : params) {
    global_.emplace_back(name, torch::empty(p.sizes(), host));
    global_.back().second.copy_(p.detach());
    momentum_.push_back(torch::zeros(p.sizes(), host));
  }
}

std::vector<torch::Tensor> OuterOptimizer::pseudo_gradient(const NamedTensors& local) const {
  std::vector<torch::Tensor> delta;
  if (!pinned_) {
    for (size_t i = 0; i < global_.size(); ++i)
      delta.push_back(global_[i].second - local[i].second.detach().to(torch::kCPU, torch::kFloat32));
    return delta;
  }
  if (staging_.empty())
    for (const auto& [name, g] : global_) staging_.push_back(torch::empty_like(g));
  for (size_t i = 0; i < global_.size(); ++i) staging_[i].copy_(local[i].second.detach(), /*non_blocking=*/true);
  wait_for_device();
  for (size_t i = 0; i < global_.size(); ++i) delta.push_back(global_[i].second - staging_[i]);
  return delta;
}

void OuterOptimizer::step(const std::vector<torch::Tensor>& delta, NamedTensors& local) {
  apply(delta);
  copy_to(local);
}

void OuterOptimizer::copy_to(NamedTensors& local) const {
  torch::NoGradGuard no_grad;
  // From pinned memory the copy is queued on the device's stream and the host goes on; apply() waits for it before
  // the global parameters change again.
  for (size_t i = 0; i < global_.size(); ++i) local[i].second.copy_(global_[i].second, /*non_blocking=*/pinned_);
}

void OuterOptimizer::wait_for_device() const {
  if (pinned_) torch::cuda::synchronize(device_index_);  // the model's GPU, which need not be the current one
}

void OuterOptimizer::apply(const std::vector<torch::Tensor>& delta) {
  wait_for_device();
  torch::NoGradGuard no_grad;
  const double lr = options_.lr, mu = options_.momentum;
  for (size_t i = 0; i < global_.size(); ++i) {
    auto& buf = momentum_[i];
    if (num_steps_ == 0) {
      buf.copy_(delta[i]);  // torch.optim.SGD starts the buffer at the first gradient
    } else {
      buf.mul_(mu).add_(delta[i]);
    }
    global_[i].second.sub_(delta[i] + mu * buf, /*alpha=*/lr);
  }
  num_steps_ += 1;
}

NamedTensors OuterOptimizer::state() const {
  NamedTensors out;
  for (size_t i = 0; i < global_.size(); ++i) out.emplace_back(global_[i].first + ".outer_momentum", momentum_[i]);
  return out;
}

namespace {
void put(torch::Tensor& target, const torch::Tensor& src, const std::string& origin, const std::string& key) {
  if (src.sizes() != target.sizes())
    fail("'{}': outer tensor '{}' has the wrong shape: the checkpoint's model config differs", origin, key);
  target.copy_(src);
}
}  // namespace

void OuterOptimizer::load_state(const safetensors::File& file, int64_t num_steps) {
  wait_for_device();
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < global_.size(); ++i) {
    const std::string& name = global_[i].first;
    put(global_[i].second, to_torch(file.at(name)), file.origin(), name);
    put(momentum_[i], to_torch(file.at(name + ".outer_momentum")), file.origin(), name + ".outer_momentum");
  }
  num_steps_ = num_steps;
}

void OuterOptimizer::load_momenta(const NamedTensors& momenta, const std::string& origin) {
  wait_for_device();
  torch::NoGradGuard no_grad;
  std::map<std::string, const torch::Tensor*> by_name;
  for (const auto& [name, t] : momenta) by_name[name] = &t;
  for (size_t i = 0; i < global_.size(); ++i) {
    const std::string key = global_[i].first + ".outer_momentum";
    const auto found = by_name.find(key);
    if (found == by_name.end())
      fail("'{}' has no outer tensor '{}': the checkpoint's model config differs", origin, key);
    put(momentum_[i], *found->second, origin, key);
  }
}

}  // namespace tributary
