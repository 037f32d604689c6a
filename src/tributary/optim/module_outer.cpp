#include "tributary/optim/module_outer.h"

#include <cmath>

#include "tributary/core/error.h"

namespace tributary {

double norm_rescale_factor(const std::string& mode, int64_t n) {
  if (n < 1) return 0;
  if (mode == "multiply") return std::sqrt(double(n));
  if (mode == "divide") return 1.0 / std::sqrt(double(n));
  if (mode == "none") return 1.0;
  fail("dipaco.norm_rescale = '{}': choose multiply, divide or none", mode);
}

void ModuleAccumulator::add(double w, const std::vector<torch::Tensor>& delta) {
  torch::NoGradGuard no_grad;
  if (sum.empty()) {
    for (const auto& d : delta) sum.push_back(torch::zeros_like(d, torch::kFloat32));
  }
  if (sum.size() != delta.size()) fail("module accumulator: {} tensors, contribution has {}", sum.size(), delta.size());
  for (size_t i = 0; i < sum.size(); ++i) sum[i].add_(delta[i].to(torch::kFloat32), w);
  weight += w;
  paths += 1;
}

std::vector<torch::Tensor> finalize(const std::vector<torch::Tensor>& sum, double weight, int64_t paths,
                                    const std::string& rescale) {
  if (paths == 0 || weight <= 0) return {};
  const double scale = norm_rescale_factor(rescale, paths) / weight;
  std::vector<torch::Tensor> out;
  for (const auto& s : sum) out.push_back(s * scale);
  return out;
}

}  // namespace tributary
