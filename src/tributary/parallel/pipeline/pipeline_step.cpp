#include "tributary/parallel/pipeline/pipeline_step.h"

#include <chrono>
#include <cmath>
#include <thread>

#include "tributary/core/clock.h"
#include "tributary/core/error.h"
#include "tributary/parallel/pipeline/stage_gradients.h"

namespace tributary::pipeline {
namespace {

constexpr int kActivation = 0, kGradient = 1;

// The stochastic rounding's draw of one message (wire.h): its kind, sender, step and micro-batch.
uint64_t message_seed(int kind, int64_t stage, int64_t step, int64_t mb) {
  return (uint64_t(kind) << 62) ^ (uint64_t(stage) << 48) ^ (uint64_t(step) << 16) ^ uint64_t(mb);
}

// dist.slow_workers inside the schedule: (factor - 1) x the computation that just ran.
void slow_down(double factor, Clock::time_point start) {
  if (factor > 1) std::this_thread::sleep_for(std::chrono::duration<double>((factor - 1) * seconds_since(start)));
}

}  // namespace

PipelineStep::PipelineStep(PipelineStepParts parts)
    : p_(std::move(parts)),
      actions_(stage_actions(p_.schedule, p_.stage)),
      batch_(torch::empty({p_.loader.batch_size(), p_.loader.context() + 1}, torch::kInt64)),
      first_(p_.stage == 0),
      last_(p_.stage == p_.schedule.stages - 1) {
  const int64_t B = p_.loader.batch_size(), m = p_.schedule.micro_batches;
  if (m < 1 || B % m != 0)
    fail(
        "parallel.micro_batches = {} must divide train.batch_size = {} (equal micro-batches keep the loss the batch "
        "mean)",
        m, B);
  if (m > 0xFFFF) fail("parallel.micro_batches = {} is more than 65535", m);
  TRIB_CHECK(p_.groups.pipe && p_.groups.pipe->size() == p_.schedule.stages && p_.groups.pipe->rank() == p_.stage);
  micro_ = B / m;
  if (is_delta(p_.wire)) {
    if (!first_) arriving_.emplace(delta_wire(p_.wire), p_.activation_cache_bytes);
    if (!last_) leaving_.emplace(delta_wire(p_.wire), p_.activation_cache_bytes);
  }
}

std::vector<uint64_t> PipelineStep::example_keys(int64_t mb) const {
  const int64_t n = batch_.size(1);
  const int64_t* ids = batch_.data_ptr<int64_t>() + mb * micro_ * n;
  std::vector<uint64_t> keys;
  for (int64_t r = 0; r < micro_; ++r) keys.push_back(example_key(ids + r * n, n));
  return keys;
}

void PipelineStep::execute(const Action& a, int64_t step) {
  const int64_t T = p_.loader.context(), C = p_.model.config().width;
  const auto mb = static_cast<size_t>(a.mb);
  const auto start = Clock::now();
  auto wait_counted = [&](comm::PendingCollective pending) {
    const auto t0 = Clock::now();
    pending.wait();
    stats_.blocked_s += seconds_since(t0);
  };
  switch (a.op) {
    case Op::RecvAct: {
      const auto keys = arriving_ ? example_keys(a.mb) : std::vector<uint64_t>{};
      auto buffer = arriving_ ? byte_message_buffer(arriving_->message_bytes(keys, T, C), p_.groups.mac)
                              : message_buffer(p_.wire, {micro_, T, C}, p_.groups.mac);
      const std::string what = fmt::format("stage {}: activation of micro-batch {} at step {} from stage {}", p_.stage,
                                           a.mb, step + 1, p_.stage - 1);
      wait_counted(p_.groups.pipe->recv(buffer, int(p_.stage - 1), stage_message_tag(kActivation, step, a.mb), what));
      const auto place = stage_message_place(*p_.groups.pipe, kActivation, step, a.mb, p_.stage - 1, p_.stage);
      inputs_[mb] = (arriving_ ? arriving_->decode(open_bytes(buffer, p_.groups.mac, place, what), keys, T, C)
                               : open_message(buffer, p_.wire, {micro_, T, C}, p_.groups.mac, place, what))
                        .to(p_.device)
                        .requires_grad_(true);
      return;
    }
    case Op::Forward: {
      auto rows = batch_.narrow(0, a.mb * micro_, micro_).to(p_.device);
      auto x = first_ ? p_.model.embed(rows.narrow(1, 0, T)) : inputs_[mb];
      auto y = p_.model.blocks(x, p_.layout.begin(p_.stage), p_.layout.end(p_.stage));
      if (last_) {
        auto loss = Transformer::loss(p_.model.logits(y), rows.narrow(1, 1, T));
        loss_sum_ += loss.item<double>() / double(p_.schedule.micro_batches);
        outputs_[mb] = loss / double(p_.schedule.micro_batches);
      } else {
        outputs_[mb] = y;
      }
      slow_down(p_.slowdown, start);
      stats_.compute_s += seconds_since(start);
      return;
    }
    case Op::SendAct: {
      send_buffers_.push_back(seal_message(
          leaving_ ? leaving_->encode(outputs_[mb], example_keys(a.mb)) : wire_encode(outputs_[mb], p_.wire),
          p_.groups.mac, stage_message_place(*p_.groups.pipe, kActivation, step, a.mb, p_.stage, p_.stage + 1)));
      stats_.activation_bytes += send_buffers_.back().numel() * int64_t(send_buffers_.back().element_size());
      sends_.push_back(p_.groups.pipe->send(send_buffers_.back(), int(p_.stage + 1),
                                            stage_message_tag(kActivation, step, a.mb),
                                            fmt::format("stage {}: activation of micro-batch {} at step {} to stage {}",
                                                        p_.stage, a.mb, step + 1, p_.stage + 1)));
      return;
    }
    case Op::RecvGrad: {
      auto buffer = message_buffer(gradient_wire(p_.wire), {micro_, T, C}, p_.groups.mac);
      const std::string what = fmt::format("stage {}: gradient of micro-batch {} at step {} from stage {}", p_.stage,
                                           a.mb, step + 1, p_.stage + 1);
      wait_counted(p_.groups.pipe->recv(buffer, int(p_.stage + 1), stage_message_tag(kGradient, step, a.mb), what));
      out_grads_[mb] =
          open_message(buffer, gradient_wire(p_.wire), {micro_, T, C}, p_.groups.mac,
                       stage_message_place(*p_.groups.pipe, kGradient, step, a.mb, p_.stage + 1, p_.stage), what)
              .to(p_.device);
      return;
    }
    case Op::Backward: {
      if (last_)
        outputs_[mb].backward();
      else
        outputs_[mb].backward(out_grads_[mb]);
      outputs_[mb] = out_grads_[mb] = torch::Tensor();  // the activations of this micro-batch are released
      slow_down(p_.slowdown, start);
      stats_.compute_s += seconds_since(start);
      return;
    }
    case Op::SendGrad: {
      send_buffers_.push_back(seal_message(
          wire_encode(inputs_[mb].grad(), gradient_wire(p_.wire), message_seed(kGradient, p_.stage, step, a.mb)),
          p_.groups.mac, stage_message_place(*p_.groups.pipe, kGradient, step, a.mb, p_.stage, p_.stage - 1)));
      stats_.gradient_bytes += send_buffers_.back().numel() * int64_t(send_buffers_.back().element_size());
      sends_.push_back(p_.groups.pipe->send(send_buffers_.back(), int(p_.stage - 1),
                                            stage_message_tag(kGradient, step, a.mb),
                                            fmt::format("stage {}: gradient of micro-batch {} at step {} to stage {}",
                                                        p_.stage, a.mb, step + 1, p_.stage - 1)));
      inputs_[mb] = torch::Tensor();
      return;
    }
  }
}

double PipelineStep::forward_backward(int64_t step) {
  p_.optimizer.zero_grad();
  p_.loader.next(batch_.data_ptr<int64_t>());
  const auto m = static_cast<size_t>(p_.schedule.micro_batches);
  inputs_.assign(m, {});
  outputs_.assign(m, {});
  out_grads_.assign(m, {});
  send_buffers_.clear();
  sends_.clear();
  loss_sum_ = 0;
  for (const Action& a : actions_) execute(a, step);
  for (auto& s : sends_) s.wait();  // every message of this step delivered before its buffer goes
  sends_.clear();
  send_buffers_.clear();
  stats_.data_parallel_bytes += reduce_stage_gradients(p_.params, p_.groups, p_.stage, first_, last_, step);
  return loss_sum_;  // meaningful on the last stage; run() shares it
}

StepResult PipelineStep::run(int64_t step, double lr) {
  forward_backward(step);
  // The loss (last stage) and the squared gradient norm of every stage, the tied copy counted once (on stage 0).
  double squared = 0;
  {
    torch::NoGradGuard no_grad;
    for (const auto& [name, t] : p_.params) {
      if (!t.grad().defined() || (last_ && !first_ && name == kTiedEmbedding)) continue;
      squared += t.grad().to(torch::kFloat64).pow(2).sum().item<double>();
    }
  }
  std::vector<torch::Tensor> shared = {torch::tensor({last_ ? loss_sum_ : 0.0, squared}, torch::kFloat64)};
  p_.groups.pipe->all_reduce_sum(shared);
  const double loss = shared[0][0].item<double>(), norm = std::sqrt(shared[0][1].item<double>());
  if (!std::isfinite(loss))
    fail("loss became {} at step {}: lower optim.lr or raise optim.warmup_steps", loss, step + 1);
  if (p_.grad_clip > 0 && norm > p_.grad_clip) {
    torch::NoGradGuard no_grad;
    const double scale = p_.grad_clip / (norm + 1e-6);
    for (auto& [name, t] : p_.params)
      if (t.grad().defined()) t.grad().mul_(scale);
  }
  p_.optimizer.step(lr);
  return {.loss = loss, .grad_norm = norm};
}

PipelineStats PipelineStep::take_stats() {
  stats_.activation_cache_bytes =
      (arriving_ ? arriving_->cached_bytes() : 0) + (leaving_ ? leaving_->cached_bytes() : 0);
  return std::exchange(stats_, {});
}

}  // namespace tributary::pipeline
