#include "tributary/optim/module_feedback.h"

#include "tributary/core/error.h"

namespace tributary {

ModuleFeedback::ModuleFeedback(comm::SparseChunkOptions options, double decay) : chunks_(options), decay_(decay) {
  if (!(decay >= 0 && decay <= 1)) fail("dist.error_feedback_decay = {}: choose a value in [0, 1]", decay);
}

torch::Tensor ModuleFeedback::encode(const std::vector<size_t>& modules,
                                     const std::vector<const std::vector<torch::Tensor>*>& sums) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> corrected;
  for (size_t k = 0; k < modules.size(); ++k) {
    std::vector<torch::Tensor> flat;
    for (const auto& s : *sums[k]) flat.push_back(s.reshape({-1}).to(torch::kFloat32));
    auto e = torch::cat(flat);
    if (const auto it = feedback_.find(modules[k]); it != feedback_.end()) e = it->second * decay_ + e;
    corrected.push_back(std::move(e));
  }
  auto x = torch::cat(corrected).contiguous();
  torch::Tensor sent;
  auto payload = chunks_.encode(x, sent);
  auto residual = x.sub_(sent);
  int64_t at = 0;
  for (size_t k = 0; k < modules.size(); ++k) {
    const int64_t n = corrected[k].numel();
    pending_[modules[k]] = residual.narrow(0, at, n).clone();
    at += n;
  }
  return payload;
}

void ModuleFeedback::commit() {
  for (auto& [module, r] : pending_) feedback_[module] = std::move(r);
  pending_.clear();
}

void ModuleFeedback::discard() { pending_.clear(); }

std::vector<std::pair<std::string, torch::Tensor>> ModuleFeedback::state() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& [module, e] : feedback_) out.emplace_back("feedback." + std::to_string(module), e);
  return out;
}

void ModuleFeedback::load_state(const std::vector<std::pair<std::string, torch::Tensor>>& state,
                                const std::vector<int64_t>& numel, const std::string& origin) {
  std::map<size_t, torch::Tensor> loaded;
  for (const auto& [name, t] : state) {
    size_t module = numel.size();
    try {
      size_t used = 0;
      if (name.rfind("feedback.", 0) == 0) module = std::stoul(name.substr(9), &used);
      if (used != name.size() - 9) module = numel.size();
    } catch (const std::exception&) {
    }
    if (module >= numel.size())
      fail("'{}': '{}' is not the error feedback of one of this run's {} modules; the file belongs to another run",
           origin, name, numel.size());
    if (t.dim() != 1 || t.numel() != numel[module] || t.scalar_type() != torch::kFloat32)
      fail("'{}': '{}' holds {} values, module {} has {} parameters; the file belongs to another run", origin, name,
           t.numel(), module, numel[module]);
    loaded[module] = t.clone();
  }
  feedback_ = std::move(loaded);
  pending_.clear();
}

}  // namespace tributary
