#include "tributary/parallel/local/local_stage.h"

#include <cmath>

#include "tributary/core/clock.h"
#include "tributary/core/error.h"
#include "tributary/parallel/pipeline/stage_gradients.h"

namespace tributary::local {
namespace {

constexpr int kActivation = 0, kOverlapGradient = 1;
const char* const kKindName[] = {"activation", "overlap gradient"};

int tag(int kind, int64_t step, int64_t mb) {  // as the pipeline step's: unique per (peer, message) near a step
  return (kind << 28) | static_cast<int>((step & 0xFFF) << 16) | static_cast<int>(mb);
}

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
  micro_ = B / m;
  auto all = clip_groups(named_parameters_of(p_.model), named_parameters_of(p_.heads), p_.plan,
                         p_.model.config().blocks_per_level(), p_.tied_embeddings);
  clip_groups_.push_back(all.at(size_t(p_.stage)));
  const bool tied_group = static_cast<int64_t>(all.size()) > p_.plan.chunks();
  if (tied_group && (first_ || last_)) clip_groups_.push_back(all.back());
}

torch::Tensor LocalStage::receive(int kind, int64_t step, int64_t mb, int peer) {
  const int64_t T = p_.loader.context(), C = p_.model.config().width;
  auto buffer = pipeline::wire_buffer(p_.wire, {micro_, T, C});
  const auto t0 = Clock::now();
  p_.groups.pipe->recv(buffer, peer, tag(kind, step, mb),
                       fmt::format("stage {}: {} of micro-batch {} at step {} from stage {}", p_.stage,
                                   kKindName[kind], mb, step + 1, peer))
      .wait();
  stats_.blocked_s += seconds_since(t0);
  return pipeline::wire_decode(buffer, p_.wire, {micro_, T, C}).to(p_.device);
}

void LocalStage::send(const torch::Tensor& t, int kind, int64_t step, int64_t mb, int peer) {
  send_buffers_.push_back(pipeline::wire_encode(t, p_.wire));
  const int64_t bytes = send_buffers_.back().numel() * int64_t(send_buffers_.back().element_size());
  (kind == kActivation ? stats_.activation_bytes : stats_.gradient_bytes) += bytes;
  sends_.push_back(p_.groups.pipe->send(send_buffers_.back(), peer, tag(kind, step, mb),
                                        fmt::format("stage {}: {} of micro-batch {} at step {} to stage {}",
                                                    p_.stage, kKindName[kind], mb, step + 1, peer)));
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
    if (first_) x = p_.model.embed(rows.narrow(1, 0, T));
    else if (overlap) x.requires_grad_(true);
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
  for (auto& s : sends_) s.wait();  // every message of this step delivered before its buffer goes
  sends_.clear();
  send_buffers_.clear();
  stats_.data_parallel_bytes += pipeline::reduce_stage_gradients(p_.params, p_.groups, p_.stage, first_, last_);
  return loss_sum;
}

StepResult LocalStage::run(int64_t step, double lr) {
  const double loss = forward_backward(step);
  // Each chunk clips on its own; the tied embedding's group is clipped alike on the first and the last stage and
  // counted once (stage 0) in the reported norm.
  double squared = 0;
  for (size_t g = 0; g < clip_groups_.size(); ++g) {
    const double norm = clip_grad_norm(clip_groups_[g], p_.grad_clip);
    if (g == 0 || first_) squared += norm * norm;
  }
  const int64_t K = p_.plan.chunks();
  auto shared = torch::zeros({K + 1}, torch::kFloat64);
  shared[p_.stage] = loss;
  shared[K] = squared;
  std::vector<torch::Tensor> one = {shared};
  p_.groups.pipe->all_reduce_sum(one);
  StepResult result;
  for (int64_t k = 0; k < K; ++k) result.chunk_losses.push_back(one[0][k].item<double>());
  result.loss = result.chunk_losses.back();
  result.grad_norm = std::sqrt(one[0][K].item<double>());
  for (int64_t k = 0; k < K; ++k)
    if (!std::isfinite(result.chunk_losses[size_t(k)]))
      fail("loss of chunk {} became {} at step {}: lower optim.lr or raise optim.warmup_steps", k,
           result.chunk_losses[size_t(k)], step + 1);
  p_.optimizer.step(lr);
  return result;
}

}  // namespace tributary::local
