#include "tributary/parallel/pipeline/stage_gradients.h"

#include "tributary/core/error.h"
#include "tributary/parallel/pipeline/stage.h"

namespace tributary::pipeline {
namespace {

// The sum of `flat` (fp32, CPU, one dimension) over `group`: `sealed`'s (comm::Exchange::sum) when given, else Gloo's
// all-reduce.
void sum_over(comm::Group& group, comm::Exchange* sealed, torch::Tensor& flat) {
  if (sealed) return sealed->sum(flat);
  std::vector<torch::Tensor> one = {flat};
  group.all_reduce_sum(one);
}

}  // namespace

int64_t reduce_stage_gradients(NamedTensors& params, const PipelineGroups& groups, int64_t stage, bool first, bool last,
                               int64_t step) {
  torch::NoGradGuard no_grad;
  if (groups.tie && (first || last)) {  // the tied embedding: lookup gradient + head gradient
    torch::Tensor g;
    for (auto& [name, t] : params)
      if (name == kTiedEmbedding) g = t.grad();
    TRIB_CHECK(g.defined(), "stage {} has no gradient for the tied embedding", stage);
    torch::Tensor sum = g.to(torch::kCPU).contiguous().view({-1});
    sum_over(*groups.tie, groups.tie_sealed, sum);
    g.copy_(sum.view_as(g));
  }
  if (!groups.averaging(step)) return 0;
  std::vector<torch::Tensor> grads, parts;
  for (auto& [name, t] : params)
    if (t.grad().defined()) {
      grads.push_back(t.grad());
      parts.push_back(t.grad().reshape({-1}).to(torch::kCPU));
    }
  torch::Tensor flat = torch::cat(parts).contiguous();
  const int64_t n = groups.data->size();
  sum_over(*groups.data, groups.data_sealed, flat);
  flat.div_(double(n));
  int64_t offset = 0;
  for (auto& g : grads) {
    g.copy_(flat.narrow(0, offset, g.numel()).view_as(g));
    offset += g.numel();
  }
  return 2 * (n - 1) * flat.numel() * 4 / n + (groups.data_sealed ? 2 * (n - 1) * comm::WireMac::kBytes : 0);
}

}  // namespace tributary::pipeline
