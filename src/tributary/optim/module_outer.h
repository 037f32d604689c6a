// DiPaCo's per-module outer gradient (arXiv 2403.10616 §2.4). Every path p that went through module m this round
// contributes its pseudo-gradient delta_p = theta_global(m) - theta_p(m) with weight w_p = the size of p's shard:
//
//     Delta(m) = s(n) * sum_p w_p delta_p / sum_p w_p        n = number of contributing paths
//
// s(n) rescales the norm (the paper rescales by sqrt(paths) without saying in which direction):
//   none      s = 1          (default) the shard-weighted average, exactly DiLoCo's outer gradient;
//   multiply  s = sqrt(n)    undoes the 1/sqrt(n) shrinkage that averaging n *independent* pseudo-gradients causes;
//   divide    s = 1/sqrt(n)  damps widely shared modules further.
// Measured (docs/benchmarks.md §5.4): multiply is 1% better on 2x2 but diverges on 4x4 (the stem, shared by all 16
// paths, moves 4x as far as DiLoCo's step with the same outer lr: early in training the paths' pseudo-gradients
// are strongly correlated, so averaging does not shrink them); divide is worse than none on both. Hence none.
// Delta(m) then takes one Nesterov step of the module's own OuterOptimizer (optim/outer.h).
//
// Contributions are summed locally (ModuleAccumulator), then across processes (all-reduce of the sums and of the
// weights), and only then normalised (finalize), so the result does not depend on which worker ran which path — up to
// fp32 rounding: the sums are grouped by the worker that ran the paths (tests/integration/golden_runs_test.cpp compares
// two-worker DiPaCo to 1e-6 for that reason).
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
