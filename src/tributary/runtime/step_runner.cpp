#include "tributary/runtime/step_runner.h"

#include <cmath>

#include "tributary/core/error.h"
#include "tributary/model/autocast.h"
#include "tributary/runtime/sync/replica_sync.h"

namespace tributary {

DenseStep::DenseStep(DenseStepParts parts)
    : p_(parts),
      // Pinned on a GPU run, so that the copy to the device is a DMA the host need not wait for.
      batch_(torch::empty({parts.loader.batch_size(), parts.loader.context() + 1},
                          torch::TensorOptions(torch::kInt64).pinned_memory(parts.device.is_cuda()))) {}

StepResult DenseStep::run(int64_t step, double lr) {
  const int64_t T = p_.loader.context();
  p_.optimizer.zero_grad();
  double step_loss = 0;
  for (int64_t micro = 0; micro < p_.grad_accum; ++micro) {
    p_.loader.next(batch_.data_ptr<int64_t>());  // the last copy out of batch_ is done: loss.item() waited for it
    auto on_device = batch_.to(p_.device, /*non_blocking=*/true);
    torch::Tensor logits;
    {
      const Autocast autocast(p_.bf16, p_.device.type());
      logits = p_.model.forward(on_device.narrow(1, 0, T));
    }
    auto loss = Transformer::loss(p_.bf16 ? logits.to(torch::kFloat32) : logits, on_device.narrow(1, 1, T));
    if (p_.sync) p_.sync->before_backward(micro + 1 == p_.grad_accum, p_.grad_accum == 1);
    (p_.grad_accum > 1 ? loss / double(p_.grad_accum) : loss).backward();
    step_loss += loss.item<double>() / double(p_.grad_accum);
  }
  if (p_.sync) p_.sync->after_backward(p_.params);  // data parallel: average gradients
  if (!std::isfinite(step_loss))
    fail("loss became {} at step {}: lower optim.lr or raise optim.warmup_steps", step_loss, step + 1);
  StepResult result{.loss = step_loss, .grad_norm = clip_grad_norm(p_.params, p_.grad_clip)};
  p_.optimizer.step(lr);
  return result;
}

}  // namespace tributary
