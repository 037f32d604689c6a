#include "tributary/runtime/sync/loss_probe.h"

#include "tributary/core/error.h"
#include "tributary/model/eval.h"

namespace tributary {

LossProbe::LossProbe(const ModelConfig& model, const torch::Device& device,
                     std::shared_ptr<const std::vector<uint32_t>> tokens, int64_t windows,
                     std::function<NamedTensors()> globals)
    : device_(device),
      tokens_(std::move(tokens)),
      windows_(windows),
      context_(model.context),
      globals_(std::move(globals)),
      model_(std::make_shared<Transformer>(model)) {
  if (int64_t(tokens_->size()) < context_ + 2)
    fail("dist.score = 'loss': the training split holds {} tokens, fewer than one window of model.context = {}",
         tokens_->size(), context_);
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
  const int64_t last_start = int64_t(tokens_->size()) - (context_ + 1);
  const auto starts = torch::randint(last_start + 1, {windows_}, generator, torch::kInt64);
  auto units = torch::empty({windows_, context_ + 1}, torch::kInt64);
  auto* out = units.data_ptr<int64_t>();
  for (int64_t w = 0; w < windows_; ++w) {
    const auto* from = tokens_->data() + starts[w].item<int64_t>();
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
