#include "tributary/runtime/step_runner.h"

#include <cmath>

#include "tributary/core/error.h"
#include "tributary/model/autocast.h"
#include "tributary/runtime/step_graph.h"
#include "tributary/runtime/sync/replica_rounds.h"

namespace tributary {

DenseStep::DenseStep(DenseStepParts parts)
    : p_(parts),
      // Pinned on a GPU run, so that the copy to the device is a DMA the host need not wait for.
      batch_(torch::empty({parts.loader.batch_size(), parts.loader.context() + 1},
                          torch::TensorOptions(torch::kInt64).pinned_memory(parts.device.is_cuda()))) {}

// The step's inputs and outputs in tensors that keep their storage, as a captured graph needs (step_graph.h).
struct DenseStep::Graphed {
  StepGraph graph;
  torch::Tensor host_batches;  // (grad_accum, B, T+1), pinned on a GPU run
  torch::Tensor tokens;        // the same on the device
  torch::Tensor loss, norm;    // 0-d, on the device
  explicit Graphed(const DenseStepParts& p)
      : graph(p.device),
        host_batches(torch::empty({p.grad_accum, p.loader.batch_size(), p.loader.context() + 1},
                                  torch::TensorOptions(torch::kInt64).pinned_memory(p.device.is_cuda()))),
        tokens(torch::empty(host_batches.sizes(), torch::TensorOptions(torch::kInt64).device(p.device))),
        loss(torch::zeros({}, torch::TensorOptions(torch::kFloat32).device(p.device))),
        norm(torch::zeros_like(loss)) {}
};

DenseStep::~DenseStep() = default;

StepResult DenseStep::run(int64_t step, double lr) {
  if (p_.cuda_graph && (!p_.sync || !p_.sync->averaging_gradients())) return run_graphed(step, lr);
  p_.optimizer.zero_grad();
  double step_loss = 0;
  for (int64_t micro = 0; micro < p_.grad_accum; ++micro) {
    p_.loader.next(batch_.data_ptr<int64_t>());  // the last copy out of batch_ is done: loss.item() waited for it
    const auto loss = next_token_loss(p_.model, batch_.to(p_.device, /*non_blocking=*/true), p_.bf16);
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

StepResult DenseStep::run_graphed(int64_t step, double lr) {
  if (!graphed_) {
    torch::NoGradGuard no_grad;
    for (auto& [name, p] : p_.params)  // the graph's gradient tensors exist before its first step
      if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
    graphed_ = std::make_unique<Graphed>(p_);
  }
  Graphed& g = *graphed_;
  for (int64_t micro = 0; micro < p_.grad_accum; ++micro) p_.loader.next(g.host_batches[micro].data_ptr<int64_t>());
  if (p_.sync) p_.sync->before_backward(true, p_.grad_accum == 1);  // not averaging this step: its hooks stand down
  p_.optimizer.prepare_device_step(lr);
  g.graph.run([&] { g.tokens.copy_(g.host_batches, /*non_blocking=*/true); }, [&] { graphed_body(); });
  // Read after the step (the graph cannot stop halfway): a non-finite loss ends the run as the eager step's does.
  const double loss = g.loss.item<double>();
  if (!std::isfinite(loss))
    fail("loss became {} at step {}: lower optim.lr or raise optim.warmup_steps", loss, step + 1);
  return {.loss = loss, .grad_norm = g.norm.item<double>()};
}

torch::Tensor next_token_loss(Transformer& model, const torch::Tensor& tokens, bool bf16) {
  const int64_t T = tokens.size(1) - 1;
  torch::Tensor logits;
  {
    const Autocast autocast(bf16, tokens.device().type());
    logits = model.forward(tokens.narrow(1, 0, T));
  }
  return Transformer::loss(bf16 ? logits.to(torch::kFloat32) : logits, tokens.narrow(1, 1, T));
}

void DenseStep::graphed_body() {
  Graphed& g = *graphed_;
  p_.optimizer.zero_grad();
  torch::Tensor total;
  for (int64_t micro = 0; micro < p_.grad_accum; ++micro) {
    const auto loss = next_token_loss(p_.model, g.tokens[micro], p_.bf16);
    (p_.grad_accum > 1 ? loss / double(p_.grad_accum) : loss).backward();
    const auto share = loss.detach() / double(p_.grad_accum);
    total = total.defined() ? total + share : share;
  }
  torch::NoGradGuard no_grad;
  g.loss.copy_(total);
  g.norm.copy_(clip_grad_norm_on_device(p_.params, p_.grad_clip));
  p_.optimizer.device_step();
}

}  // namespace tributary
