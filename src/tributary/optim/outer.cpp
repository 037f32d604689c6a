#include "tributary/optim/outer.h"

#include "tributary/core/error.h"

namespace tributary {

OuterOptimizer::OuterOptimizer(const NamedTensors& params, OuterOptions options) : options_(options) {
  for (const auto& [name, p] : params) {
    global_.emplace_back(name, p.detach().to(torch::kCPU, torch::kFloat32).clone());
    momentum_.push_back(torch::zeros_like(global_.back().second));
  }
}

std::vector<torch::Tensor> OuterOptimizer::pseudo_gradient(const NamedTensors& local) const {
  std::vector<torch::Tensor> delta;
  for (size_t i = 0; i < global_.size(); ++i)
    delta.push_back(global_[i].second - local[i].second.detach().to(torch::kCPU, torch::kFloat32));
  return delta;
}

void OuterOptimizer::step(const std::vector<torch::Tensor>& delta, NamedTensors& local) {
  apply(delta);
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < global_.size(); ++i)
    local[i].second.copy_(global_[i].second.to(local[i].second.device(), local[i].second.scalar_type()));
}

void OuterOptimizer::apply(const std::vector<torch::Tensor>& delta) {
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

void OuterOptimizer::load_state(const safetensors::File& file, int64_t num_steps) {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < global_.size(); ++i) {
    const std::string& name = global_[i].first;
    for (auto [key, target] :
         {std::pair{name, &global_[i].second}, std::pair{name + ".outer_momentum", &momentum_[i]}}) {
      auto src = to_torch(file.at(key));
      if (src.sizes() != target->sizes())
        fail("'{}': outer tensor '{}' has the wrong shape: the checkpoint's model config differs", file.origin(), key);
      target->copy_(src);
    }
  }
  num_steps_ = num_steps;
}

}  // namespace tributary
