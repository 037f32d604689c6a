#include "tributary/optim/probe_jury.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace tributary {

uint64_t probe_batch_seed(uint64_t run_seed, const std::vector<torch::Tensor>& gathered, int64_t exchange) {
  uint64_t seed = run_seed * 0x9E3779B97F4A7C15ULL + uint64_t(exchange);
  for (size_t i = 0; i < gathered.size(); ++i) {
    const auto& u = gathered[i];
    if (u.defined() && u.numel() > 0) {  // 1,024 strided values: every rank decoded the same bytes
      const auto sample = u.slice(0, 0, u.numel(), std::max<int64_t>(1, u.numel() / 1024)).contiguous();
      const auto* bytes = static_cast<const uint8_t*>(sample.data_ptr());
      for (size_t b = 0; b < size_t(sample.numel()) * sample.element_size(); ++b)
        seed = (seed ^ bytes[b]) * 0x100000001B3ULL;
    }
    seed = seed * 0x100000001B3ULL + i;
  }
  return seed;
}

std::vector<double> ProbeJury::improvements(comm::Exchange& exchange_group, int rank,
                                            const std::vector<torch::Tensor>& gathered, int64_t exchange) {
  const int n = int(gathered.size());
  const int evaluators = std::min(n - 1, evaluators_);
  std::vector<const torch::Tensor*> asked = {nullptr};
  std::vector<int> whose;
  for (int k = 1; k <= evaluators; ++k) {  // this rank judges the k ranks before it
    const int i = (rank - k + n) % n;
    if (!gathered[size_t(i)].defined()) continue;  // not signed by its sender: refused anyway
    asked.push_back(&gathered[size_t(i)]);
    whose.push_back(i);
  }
  auto mine = torch::full({n}, NAN, torch::kFloat64);
  if (!whose.empty()) {  // a non-finite update's loss is NaN: not measured
    const auto losses = probe_->losses(asked, 1.0 / n, probe_batch_seed(seed_, gathered, exchange));
    for (size_t j = 0; j < whose.size(); ++j) mine[whose[j]].fill_(losses[0] - losses[j + 1]);
  }
  const auto all = exchange_group.gather_values(mine);
  std::vector<double> out(size_t(n), NAN);
  for (int i = 0; i < n; ++i) {
    std::vector<double> said;
    for (int k = 1; k <= evaluators; ++k) {
      const auto& from = all[size_t((i + k) % n)];
      if (!from.defined()) continue;
      const double v = from[i].item<double>();
      if (std::isfinite(v)) said.push_back(v);
    }
    if (said.empty()) continue;
    std::sort(said.begin(), said.end());
    const size_t m = said.size();
    out[size_t(i)] = m % 2 ? said[m / 2] : 0.5 * (said[m / 2 - 1] + said[m / 2]);
  }
  return out;
}

}  // namespace tributary
