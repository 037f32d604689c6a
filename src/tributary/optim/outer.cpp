#include "tributary/optim/outer.h"

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

}  // namespace tributary
