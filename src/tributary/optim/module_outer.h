// DiPaCo's per-module outer gradient (arXiv 2403.10616 §2.4). Every path p that went through module m this round
// contributes its pseudo-gradient delta_p = theta_global(m) - theta_p(m) with weight w_p = the size of p's shard:
//
//     Delta(m) = s(n) * sum_p w_p delta_p / sum_p w_p        n = number of contributing paths
//
// s(n) rescales the norm: averaging n roughly independent pseudo-gradients shrinks the norm of their noise like
// 1/sqrt(n) (DiLoCo's observation), so a module shared by many paths would move less than a private one.
//   multiply  s = sqrt(n)   (default) undoes that shrinkage, so every module moves by a comparable amount;
//   divide    s = 1/sqrt(n) damps widely shared modules further;
//   none      s = 1.
// The paper does not say which direction; we multiply for the reason above and keep the others selectable.
// Delta(m) then takes one Nesterov step of the module's own OuterOptimizer (optim/outer.h).
//
// Contributions are summed locally (ModuleAccumulator), then across processes (all-reduce of the sums and of the
// weights), and only then normalised (finalize), so the result does not depend on which worker ran which path.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

namespace tributary {

double norm_rescale_factor(const std::string& mode, int64_t num_paths);  // Error naming dipaco.norm_rescale

struct ModuleAccumulator {
  std::vector<torch::Tensor> sum;  // sum_p w_p delta_p (fp32, CPU), shaped like the module's parameters
  double weight = 0;               // sum_p w_p
  int64_t paths = 0;               // contributing paths

  void add(double w, const std::vector<torch::Tensor>& delta);
};

// Delta(m) from the (globally summed) accumulator; empty when no path contributed.
std::vector<torch::Tensor> finalize(const std::vector<torch::Tensor>& sum, double weight, int64_t paths,
                                    const std::string& rescale);

}  // namespace tributary
