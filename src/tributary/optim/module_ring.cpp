#include "tributary/optim/module_ring.h"

#include <cmath>

namespace tributary {

// One ring for the whole round (Exchange::reduce_update_gather): chunk c holds the accumulated sums of the modules
// owned by group rank (c + n - 1) mod n, so the reduce-scatter leaves each owner with the full sums of its modules;
// it steps them in place and the all-gather brings every change to every worker. Weights and path counts go
// through an exact fp64 all-reduce first.
void OwnerRing::reduce(const OwnedRound& r) {
  const size_t M = replicas_.size();
  auto counts = torch::zeros({static_cast<int64_t>(M), 2}, torch::kFloat64);
  for (size_t i = 0; i < M; ++i)
    if (const ModuleAccumulator* acc = r.contributions[i]) {
      counts[int64_t(i)][0] = acc->weight;
      counts[int64_t(i)][1] = double(acc->paths);
    }
  std::vector<torch::Tensor> count_list{counts};
  group_.all_reduce_sum(count_list);

  const int n = group_.size();
  std::vector<std::vector<size_t>> owned_by(static_cast<size_t>(n));
  for (size_t i = 0; i < M; ++i) owned_by[size_t(r.owner[i])].push_back(i);
  std::vector<size_t> order;  // modules in ring order
  std::vector<int64_t> begin{0};
  std::vector<torch::Tensor> parts;
  for (int c = 0; c < n; ++c) {
    int64_t end = begin.back();
    for (size_t i : owned_by[size_t((c + n - 1) % n)]) {
      order.push_back(i);
      const ModuleAccumulator* acc = r.contributions[i];  // zeros where this worker ran no path through the module
      for (size_t k = 0; k < replicas_[i]->size(); ++k) {
        parts.push_back(acc == nullptr ? torch::zeros({(*replicas_[i])[k].second.numel()}) : acc->sum[k].reshape({-1}));
        end += parts.back().numel();
      }
    }
    begin.push_back(end);
  }
  auto flat = torch::cat(parts);
  exchange_.reduce_update_gather(flat, begin, [&](torch::Tensor& chunk) {
    int64_t offset = 0;
    for (size_t i : owned_by[size_t(group_.rank())]) {
      const NamedTensors& replica = *replicas_[i];
      std::vector<torch::Tensor> sum;
      for (const auto& [name, t] : replica) {
        sum.push_back(chunk.narrow(0, offset, t.numel()).view(t.sizes()));
        offset += t.numel();
      }
      const NamedTensors& global =
          r.step(i, sum, counts[int64_t(i)][0].item<double>(), std::llround(counts[int64_t(i)][1].item<double>()));
      // What every replica adds: the owner's new global parameters minus the replica.
      for (size_t k = 0; k < sum.size(); ++k) sum[k].copy_(global[k].second - replica[k].second);
    }
  });
  int64_t offset = 0;
  for (size_t i : order)
    for (auto& [name, t] : *replicas_[i]) {
      t = t + flat.narrow(0, offset, t.numel()).view(t.sizes());
      offset += t.numel();
    }
}

}  // namespace tributary
