#include "tributary/parallel/local/local_step.h"

#include <cmath>

#include "tributary/core/error.h"

namespace tributary::local {

LocalStep::LocalStep(LocalStepParts parts)
    : p_(std::move(parts)),
      groups_(clip_groups(p_.model, p_.heads, p_.plan)),
      weights_(static_cast<size_t>(p_.plan.chunks()), p_.aux_weight),
      batch_(torch::empty({p_.loader.batch_size(), p_.loader.context() + 1}, torch::kInt64)) {
  TRIB_CHECK(p_.heads.size() == p_.plan.chunks() - 1, "{} auxiliary heads for {} chunks", p_.heads.size(),
             p_.plan.chunks());
  weights_.back() = 1.0;
  std::vector<int64_t> chunk_of(groups_.size(), 0);  // chunk k's group, then the tied embedding's (the first chunk's)
  for (int64_t k = 0; k < p_.plan.chunks(); ++k) chunk_of[size_t(k)] = k;
  set_chunk_lr_scales(p_.optimizer, groups_, chunk_of, p_.lr_scale);
}

StepResult LocalStep::run(int64_t step, double lr) {
  const int64_t T = p_.loader.context();
  p_.optimizer.zero_grad();
  StepResult result;
  result.chunk_losses.assign(weights_.size(), 0.0);
  for (int64_t micro = 0; micro < p_.grad_accum; ++micro) {
    p_.loader.next(batch_.data_ptr<int64_t>());
    auto on_device = batch_.to(p_.device);
    const auto losses = local_forward_backward(p_.model, p_.heads, p_.plan, on_device.narrow(1, 0, T),
                                               on_device.narrow(1, 1, T), weights_, p_.grad_accum);
    for (size_t k = 0; k < losses.size(); ++k) result.chunk_losses[k] += losses[k] / double(p_.grad_accum);
  }
  result.loss = result.chunk_losses.back();
  for (size_t k = 0; k < result.chunk_losses.size(); ++k)
    if (!std::isfinite(result.chunk_losses[k]))
      fail("loss of chunk {} became {} at step {}: lower optim.lr or raise optim.warmup_steps", k,
           result.chunk_losses[k], step + 1);
  result.grad_norm = clip_chunks(groups_, p_.grad_clip);
  p_.optimizer.step(lr);
  return result;
}

}  // namespace tributary::local
