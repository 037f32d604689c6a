#include "tributary/parallel/local/head_eval.h"

namespace tributary::local {

std::vector<double> evaluate_heads(Transformer& model, AuxHeads& heads, const ChunkPlan& plan, BatchLoader& loader,
                                   int64_t num_batches, const torch::Device& device) {
  torch::NoGradGuard no_grad;
  model.eval();
  heads.eval();
  const int64_t T = loader.context(), K = plan.chunks();
  auto batch = torch::empty({loader.batch_size(), T + 1}, torch::kInt64);
  std::vector<double> sums(size_t(K), 0.0);
  for (int64_t b = 0; b < num_batches; ++b) {
    loader.next(batch.data_ptr<int64_t>());
    auto on_device = batch.to(device);
    auto x = model.embed(on_device.narrow(1, 0, T));
    for (int64_t k = 0; k < K; ++k) {
      x = model.blocks(x, plan.layout.begin(k), plan.layout.end(k));
      sums[size_t(k)] += chunk_loss(model, heads, plan, k, x, on_device.narrow(1, 1, T)).item<double>();
    }
  }
  for (auto& s : sums) s /= double(std::max<int64_t>(num_batches, 1));
  return sums;
}

}  // namespace tributary::local
