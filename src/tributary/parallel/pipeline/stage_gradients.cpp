#include "tributary/parallel/pipeline/stage_gradients.h"

#include "tributary/core/error.h"
#include "tributary/parallel/pipeline/stage.h"

namespace tributary::pipeline {

int64_t reduce_stage_gradients(NamedTensors& params, const PipelineGroups& groups, int64_t stage, bool first, bool last,
                               int64_t step) {
  torch::NoGradGuard no_grad;
  if (groups.tie && (first || last)) {  // the tied embedding: lookup gradient + head gradient
    torch::Tensor g;
    for (auto& [name, t] : params)
      if (name == kTiedEmbedding) g = t.grad();
    TRIB_CHECK(g.defined(), "stage {} has no gradient for the tied embedding", stage);
    std::vector<torch::Tensor> one = {g.to(torch::kCPU).contiguous()};
    groups.tie->all_reduce_sum(one);
    g.copy_(one[0]);
  }
  if (!groups.averaging(step)) return 0;
  std::vector<torch::Tensor> grads, parts;
  for (auto& [name, t] : params)
    if (t.grad().defined()) {
      grads.push_back(t.grad());
      parts.push_back(t.grad().reshape({-1}).to(torch::kCPU));
    }
  std::vector<torch::Tensor> flat = {torch::cat(parts)};
  const int64_t n = groups.data->size();
  groups.data->all_reduce_sum(flat);
  flat[0].div_(double(n));
  int64_t offset = 0;
  for (auto& g : grads) {
    g.copy_(flat[0].narrow(0, offset, g.numel()).view_as(g));
    offset += g.numel();
  }
  return 2 * (n - 1) * flat[0].numel() * 4 / n;
}

}  // namespace tributary::pipeline
