#include "tributary/parallel/local/local_stage.h"

#include <cmath>
#include <limits>

#include "tributary/core/clock.h"
#include "tributary/core/error.h"
#include "tributary/parallel/pipeline/stage_gradients.h"

namespace tributary::local {
namespace {

constexpr int kActivation = 0, kOverlapGradient = 1;
const char* const kKindName[] = {"activation", "overlap gradient"};

}  // namespace

LocalStage::LocalStage(LocalStageParts parts)
    : p_(std::move(parts)),
      first_(p_.stage == 0),
      last_(p_.stage == p_.plan.chunks() - 1),
      batch_(torch::empty({p_.loader.batch_size(), p_.loader.context() + 1}, torch::kInt64)) {
  const int64_t B = p_.loader.batch_size(), m = p_.micro_batches;
  if (m < 1 || B % m != 0 || m > 0xFFFF)
    fail("parallel.micro_batches = {} must divide train.batch_size = {} (at most 65535)", m, B);
  TRIB_CHECK(p_.groups.pipe && p_.groups.pipe->size() == p_.plan.chunks() && p_.groups.pipe->rank() == p_.stage);
  TRIB_CHECK(p_.report, "a local stage needs its lagged report");
  micro_ = B / m;
  auto all = clip_groups(p_.model, p_.heads, p_.plan);
  clip_groups_.push_back(all.at(size_t(p_.stage)));
  const bool tied_group = static_cast<int64_t>(all.size()) > p_.plan.chunks();
  if (tied_group && (first_ || last_)) clip_groups_.push_back(all.back());
  std::vector<int64_t> chunk_of{p_.stage, 0};  // this chunk's group, then the tied embedding's: chunk 0's lr
  chunk_of.resize(clip_groups_.size());
  set_chunk_lr_scales(p_.optimizer, clip_groups_, chunk_of, p_.lr_scale);
}

torch::Tensor LocalStage::receive(int kind, int64_t step, int64_t mb, int peer) {
  const int64_t T = p_.loader.context(), C = p_.model.config().width;
  auto buffer = pipeline::message_buffer(p_.wire, {micro_, T, C}, p_.groups.mac);
  const std::string what = fmt::format("stage {}: {} of micro-batch {} at step {} from stage {}", p_.stage,
                                       kKindName[kind], mb, step + 1, peer);
  const auto t0 = Clock::now();
  p_.groups.pipe->recv(buffer, peer, pipeline::stage_message_tag(kind, step, mb), what).wait();
  stats_.blocked_s += seconds_since(t0);
  return pipeline::open_message(buffer, p_.wire, {micro_, T, C}, p_.groups.mac,
                                pipeline::stage_message_place(*p_.groups.pipe, kind, step, mb, peer, p_.stage), what)
      .to(p_.device);
}

void LocalStage::send(const torch::Tensor& t, int kind, int64_t step, int64_t mb, int peer) {
  auto buffer = pipeline::seal_message(pipeline::wire_encode(t, p_.wire), p_.groups.mac,
                                       pipeline::stage_message_place(*p_.groups.pipe, kind, step, mb, p_.stage, peer));
  (kind == kActivation ? stats_.activation_bytes : stats_.gradient_bytes) +=
      buffer.numel() * int64_t(buffer.element_size());
  auto work = p_.groups.pipe->send(buffer, peer, pipeline::stage_message_tag(kind, step, mb),
                                   fmt::format("stage {}: {} of micro-batch {} at step {} to stage {}", p_.stage,
                                               kKindName[kind], mb, step + 1, peer));
  in_flight_.push_back({step, std::move(buffer), std::move(work)});
}

// The bounded queue: sends of steps before `oldest_kept_step` must have completed (their buffers go).
void LocalStage::retire_sends(int64_t oldest_kept_step) {
  while (!in_flight_.empty() && in_flight_.front().step < oldest_kept_step) {
    const auto t0 = Clock::now();
    in_flight_.front().work.wait();
    stats_.blocked_s += seconds_since(t0);
    in_flight_.pop_front();
  }
}

// Overlapping: the next stage's loss gradient at this stage's output, through the last overlap blocks only.
void LocalStage::take_overlap_gradients(int64_t step, std::vector<torch::Tensor>& outputs) {
  for (int64_t mb = 0; mb < p_.micro_batches; ++mb) {
    const torch::Tensor g = receive(kOverlapGradient, step, mb, int(p_.stage + 1));
    const auto start = Clock::now();
    outputs[size_t(mb)].backward(g);
    outputs[size_t(mb)] = torch::Tensor();
    stats_.compute_s += seconds_since(start);
  }
}

double LocalStage::forward_backward(int64_t step) {
  const int64_t T = p_.loader.context();
  const bool overlap = p_.plan.overlap > 0;
  const double weight = last_ ? 1.0 : p_.aux_weight;
  p_.optimizer.zero_grad();
  p_.loader.next(batch_.data_ptr<int64_t>());
  std::vector<torch::Tensor> outputs(size_t(p_.micro_batches));  // overlapping: graphs above `split`, kept
  double loss_sum = 0;
  for (int64_t mb = 0; mb < p_.micro_batches; ++mb) {
    auto rows = batch_.narrow(0, mb * micro_, micro_).to(p_.device);
    torch::Tensor x = first_ ? torch::Tensor() : receive(kActivation, step, mb, int(p_.stage - 1));
    const auto start = Clock::now();
    if (first_)
      x = p_.model.embed(rows.narrow(1, 0, T));
    else if (overlap)
      x.requires_grad_(true);
    const ChunkForward f = chunk_forward(p_.model, p_.plan, p_.stage, x);
    if (!last_) send(f.y.detach(), kActivation, step, mb, int(p_.stage + 1));  // before the loss: no waiting on it
    const torch::Tensor loss = chunk_loss(p_.model, p_.heads, p_.plan, p_.stage, f.y, rows.narrow(1, 1, T));
    loss_sum += loss.item<double>() / double(p_.micro_batches);
    chunk_backward(loss, f, weight, p_.micro_batches);
    if (overlap && !last_) outputs[size_t(mb)] = f.y;
    stats_.compute_s += seconds_since(start);
    if (overlap && !first_) send(x.grad(), kOverlapGradient, step, mb, int(p_.stage - 1));
  }
  if (overlap && !last_) take_overlap_gradients(step, outputs);
  retire_sends(step + 1 - p_.report->lag());  // lag 0: every message of this step delivered
  stats_.data_parallel_bytes += pipeline::reduce_stage_gradients(p_.params, p_.groups, p_.stage, first_, last_, step);
  return loss_sum;
}

StepResult LocalStage::run(int64_t step, double lr) {
  const auto start = Clock::now();
  last_step_ = step;
  const int64_t bytes_before = stats_.activation_bytes;
  const double loss = forward_backward(step);
  // Each chunk clips on its own; the tied embedding's group is clipped alike on the first and the last stage and
  // counted once (stage 0) in the reported norm.
  double squared = 0;
  for (size_t g = 0; g < clip_groups_.size(); ++g) {
    const double norm = clip_grad_norm(clip_groups_[g], p_.grad_clip);
    if (g == 0 || first_) squared += norm * norm;
  }
  p_.optimizer.step(lr);
  // [loss per stage | step seconds per stage | bytes forward per stage | squared norm], summed over the pipeline.
  const int64_t K = p_.plan.chunks();
  std::vector<double> mine(size_t(3 * K + 1), 0.0);
  mine[size_t(p_.stage)] = loss;
  mine[size_t(K + p_.stage)] = seconds_since(start);
  mine[size_t(2 * K + p_.stage)] = double(stats_.activation_bytes - bytes_before);
  mine[size_t(3 * K)] = squared;
  const auto shared = p_.report->step(mine);
  if (!shared) return {.lag = p_.report->lag(), .reported = false};
  return result_of(*shared, step - p_.report->lag());
}

StepResult LocalStage::result_of(const std::vector<double>& shared, int64_t step) const {
  const auto K = size_t(p_.plan.chunks());
  StepResult r;
  r.chunk_losses.assign(shared.begin(), shared.begin() + long(K));
  r.stage_step_s.assign(shared.begin() + long(K), shared.begin() + long(2 * K));
  r.stage_bytes_forward.assign(shared.begin() + long(2 * K), shared.begin() + long(3 * K));
  r.loss = r.chunk_losses.back();
  r.grad_norm = std::sqrt(shared[3 * K]);
  r.lag = p_.report->lag();
  for (size_t k = 0; k < K; ++k)
    if (!std::isfinite(r.chunk_losses[k]))
      fail("loss of chunk {} became {} at step {}: lower optim.lr or raise optim.warmup_steps", k, r.chunk_losses[k],
           step + 1);
  return r;
}

std::vector<StepResult> LocalStage::drain() {
  retire_sends(std::numeric_limits<int64_t>::max());
  const auto owed = p_.report->drain();
  std::vector<StepResult> out;
  for (size_t i = 0; i < owed.size(); ++i) {
    out.push_back(result_of(owed[i], last_step_ - int64_t(owed.size() - 1 - i)));
    out.back().lag = int64_t(owed.size() - 1 - i);  // counted back from the last step run
  }
  return out;
}

}  // namespace tributary::local
