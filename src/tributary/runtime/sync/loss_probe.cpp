#include "tributary/runtime/sync/loss_probe.h"

#include <fmt/format.h>

#include <algorithm>

#include "tributary/core/error.h"
#include "tributary/model/eval.h"

namespace tributary {

LossProbe::LossProbe(const ModelConfig& model, const torch::Device& device,
                     std::vector<std::shared_ptr<const std::vector<uint32_t>>> strata, int64_t windows,
                     std::function<NamedTensors()> globals)
    : device_(device),
      strata_(std::move(strata)),
      windows_(std::max<int64_t>(windows, int64_t(strata_.size()))),
      context_(model.context),
      globals_(std::move(globals)),
      model_(std::make_shared<Transformer>(model)) {
  for (size_t s = 0; s < strata_.size(); ++s)
    if (int64_t(strata_[s]->size()) < context_ + 2)
      fail("dist.score = 'loss': the training split{} holds {} tokens, fewer than one window of model.context = {}",
           strata_.size() > 1 ? fmt::format("'s domain {}", s) : "", strata_[s]->size(), context_);
  model_->to(device_);
  model_->eval();
  for (auto& [name, t] : named_parameters_of(*model_)) params_.emplace(name, t);
}

bool LossProbe::applies(int64_t numel) const {
  const NamedTensors globals = globals_();
  int64_t total = 0;
  for (const auto& [name, t] : globals) total += t.numel();
  return !globals.empty() && total == numel;
}

torch::Tensor LossProbe::windows_of(uint64_t seed) const {
  auto generator = at::detail::createCPUGenerator(seed);
  auto units = torch::empty({windows_, context_ + 1}, torch::kInt64);
  auto* out = units.data_ptr<int64_t>();
  for (int64_t w = 0; w < windows_; ++w) {
    const auto& tokens = *strata_[size_t(w) % strata_.size()];
    const int64_t last_start = int64_t(tokens.size()) - (context_ + 1);
    const auto* from = tokens.data() + torch::randint(last_start + 1, {1}, generator, torch::kInt64).item<int64_t>();
    for (int64_t t = 0; t <= context_; ++t) *out++ = int64_t(from[t]);
  }
  return units;
}

std::vector<double> LossProbe::losses(const std::vector<const torch::Tensor*>& updates, double step, uint64_t seed) {
  torch::NoGradGuard no_grad;
  const NamedTensors globals = globals_();
  const torch::Tensor units = windows_of(seed);
  std::vector<double> out;
  for (const torch::Tensor* update : updates) {
    int64_t offset = 0;
    for (const auto& [name, global] : globals) {
      const int64_t n = global.numel();
      if (const auto p = params_.find(name); p != params_.end()) {
        p->second.copy_(global);
        if (update) p->second.sub_(update->narrow(0, offset, n).view(global.sizes()).to(p->second.device()), step);
      }
      offset += n;
    }
    TRIB_CHECK(!update || offset == update->numel(), "(a probed update is the whole model's pseudo-gradient)");
    out.push_back(evaluate_units(*model_, units, 0, device_, windows_).mean());
  }
  return out;
}

}  // namespace tributary
