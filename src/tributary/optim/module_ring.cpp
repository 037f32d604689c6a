#include "tributary/optim/module_ring.h"

#include <cmath>

namespace tributary {
namespace {

// The owner's outer step: Nesterov on the module's master copy; returns master - replica (what the replicas add).
std::vector<torch::Tensor> outer_step(ModuleRing& r, size_t module, const std::vector<torch::Tensor>& sum,
                                      double weight, int64_t paths) {
  const auto& replica = r.global.at(r.module_ids[module]);
  auto& opt = *r.owned.at(r.module_ids[module]);
  if (paths > 0)  // else every path through it was dropped: the module keeps its parameters
    opt.apply(finalize(sum, weight, paths, r.norm_rescale));
  std::vector<torch::Tensor> change;
  for (size_t k = 0; k < replica.size(); ++k) change.push_back(opt.global()[k].second - replica[k].second);
  return change;
}

}  // namespace

// One ring for the whole round (Exchange::reduce_update_gather): chunk c holds the accumulated sums of the modules
// owned by group rank (c + n - 1) mod n, so the reduce-scatter leaves each owner with the full sums of its modules;
// it steps them in place and the all-gather brings every change to every worker. Weights and path counts go
// through an exact fp32 all-reduce first.
void reduce_and_step(ModuleRing& r, comm::Group& group, comm::Exchange& exchange) {
  const size_t M = r.module_ids.size();
  auto counts = torch::zeros({static_cast<int64_t>(M), 2}, torch::kFloat64);
  for (size_t i = 0; i < M; ++i)
    if (auto it = r.accumulated.find(r.module_ids[i]); it != r.accumulated.end()) {
      counts[int64_t(i)][0] = it->second.weight;
      counts[int64_t(i)][1] = double(it->second.paths);
    }
  std::vector<torch::Tensor> count_list{counts};
  group.all_reduce_sum(count_list);

  const int n = group.size();
  std::vector<std::vector<size_t>> owned_by(static_cast<size_t>(n));
  for (size_t i = 0; i < M; ++i) owned_by[size_t(r.owner[i])].push_back(i);
  std::vector<size_t> order;  // modules in ring order
  std::vector<int64_t> begin{0};
  std::vector<torch::Tensor> parts;
  for (int c = 0; c < n; ++c) {
    int64_t end = begin.back();
    for (size_t i : owned_by[size_t((c + n - 1) % n)]) {
      order.push_back(i);
      auto it = r.accumulated.find(r.module_ids[i]);  // zeros where this worker ran no path through the module
      for (size_t k = 0; k < r.global.at(r.module_ids[i]).size(); ++k) {
        parts.push_back(it == r.accumulated.end() ? torch::zeros({r.global.at(r.module_ids[i])[k].second.numel()})
                                          : it->second.sum[k].reshape({-1}));
        end += parts.back().numel();
      }
    }
    begin.push_back(end);
  }
  auto flat = torch::cat(parts);
  exchange.reduce_update_gather(flat, begin, [&](torch::Tensor& chunk) {
    int64_t offset = 0;
    for (size_t i : owned_by[size_t(group.rank())]) {
      std::vector<torch::Tensor> sum;
      for (const auto& [name, t] : r.global.at(r.module_ids[i])) {
        sum.push_back(chunk.narrow(0, offset, t.numel()).view(t.sizes()));
        offset += t.numel();
      }
      auto change = outer_step(r, i, sum, counts[int64_t(i)][0].item<double>(),
                               std::llround(counts[int64_t(i)][1].item<double>()));
      for (size_t k = 0; k < sum.size(); ++k) sum[k].copy_(change[k]);
    }
  });
  int64_t offset = 0;
  for (size_t i : order)
    for (auto& [name, t] : r.global.at(r.module_ids[i])) {
      t = t + flat.narrow(0, offset, t.numel()).view(t.sizes());
      offset += t.numel();
    }
}

}  // namespace tributary
