#include "tributary/runtime/sync/replica_rounds.h"

#include <fmt/format.h>

#include "tributary/core/error.h"

namespace tributary {

ReplicaRounds::ReplicaRounds(const RunConfig& config, ReplicaChannel channel, bool part, AdmissionHooks admission)
    : config_(config), channel_(channel), admission_(std::move(admission)), ddp_(!config.dist.diloco()), part_(part) {
  TRIB_CHECK(!(part_ && ddp_), "a part's data-parallel replicas average in its step, not here");
}

comm::CommStats ReplicaRounds::take_stats() {
  comm::CommStats s = channel_.exchange.take_stats();
  s.comm_s = channel_.thread.take_blocked_s();
  return s;
}

void ReplicaRounds::start_outer_loop(NamedTensors& params, int64_t offset) {
  const auto& d = config_.dist;
  outer_ = std::make_unique<OuterLoop>(OuterLoopOptions{.inner_steps = d.inner_steps,
                                                        .fragments = d.fragments,
                                                        .overlap_steps = d.overlap_steps,
                                                        .merge_alpha = d.merge_alpha,
                                                        .ramp_steps = d.ramp_steps,
                                                        .qsr_alpha = d.qsr_alpha,
                                                        .outer = {d.outer_lr, d.outer_momentum},
                                                        .blocks_per_level = config_.model.blocks_per_level(),
                                                        .num_layers = config_.model.num_layers},
                                       channel_.reducer);
  outer_->set_landed([check = &channel_.check](const NamedTensors& globals, const std::string& when, bool merged) {
    if (merged) {
      check->later(globals, when);  // queues behind the exchanges in flight; verified at the next step or finish
    } else {
      check->now(globals, when);
    }
  });
  outer_->start(params, offset);
  if (admission_.start_round) channel_.reducer.set_start_round(admission_.start_round);
}

// Fault tolerant (the admission's hooks are set): one bucket, so that a step's gradients are one round, committed or
// redone whole by the survivors (no overlap with the backward pass, the price of a step that is never half averaged).
void ReplicaRounds::start_data_parallel(NamedTensors& params) {
  const double bucket_mb = admission_.round_ended ? 1e9 : config_.dist.bucket_mb;
  data_parallel_ = std::make_unique<DataParallel>(params, bucket_mb, channel_.reducer);
}

void ReplicaRounds::start(NamedTensors& params, int64_t step, const safetensors::File* outer,
                          const nlohmann::json& fragments) {
  enter(step, params);
  // DiLoCo: the units' offsets count from the end of the warm-up (0 without one); a resumed run takes each unit's
  // last sync and outer state from the checkpoint. Replicas differ between syncs, so the identity check is on the
  // global parameters (at step 0 they are the parameters).
  if (diloco_phase() && step > 0) {
    if (!outer)
      fail(
          "the checkpoint at step {} has no DiLoCo outer state for this rank (outer.safetensors; a pipeline rank R "
          "reads rank-R.outer.safetensors); it is incomplete: resume from an earlier checkpoint",
          step);
    outer_->load(*outer, fragments);
  }
  check_identical(params, step == 0 ? "at start" : fmt::format("when resuming at step {}", step));
}

void ReplicaRounds::enter(int64_t step, NamedTensors& params) {
  in_warmup_ = !ddp_ && step < config_.dist.warmup_ddp_steps;
  if (ddp_ || in_warmup_) {
    if (!part_) start_data_parallel(params);  // a part's step averages its own gradients
  } else {
    start_outer_loop(params, config_.dist.warmup_ddp_steps);
  }
}

void ReplicaRounds::check_identical(const NamedTensors& params, const std::string& when) {
  channel_.check.now(outer_ ? outer_->globals() : params, when);
}

void ReplicaRounds::before_backward(bool last_micro_batch, bool single_micro_batch) {
  if (data_parallel_) data_parallel_->before_backward(last_micro_batch, single_micro_batch, averaging_gradients());
}

void ReplicaRounds::after_backward(NamedTensors& params) {
  if (!data_parallel_ || !averaging_gradients()) return;
  data_parallel_->after_backward(params);
  if (admission_.round_ended) admission_.round_ended();  // every data-parallel step is a round
}

bool ReplicaRounds::after_step(int64_t step, double lr, NamedTensors& params) {
  step_now_ = step;
  if (ddp_) return false;
  if (in_warmup_) {
    if (step < config_.dist.warmup_ddp_steps) return false;
    // Warm-up done: the replicas are identical; DiLoCo starts from here.
    in_warmup_ = false;
    channel_.check.now(params, fmt::format("after {} data-parallel warm-up steps", step));
    start_outer_loop(params, step);
    return false;
  }
  channel_.check.verify(/*wait=*/false);
  const bool landed = outer_->after_step(step, lr, params);
  if (landed && admission_.round_ended) admission_.round_ended();
  return landed;
}

AfterStep ReplicaRounds::step_ended(int64_t step, double lr, NamedTensors& params, bool last) {
  bool landed = after_step(step, lr, params);
  if (last) landed |= finish(step, params);
  return {.landed = landed, .quiescent = quiescent()};
}

bool ReplicaRounds::finish(int64_t step, NamedTensors& params) {
  if (ddp_ || in_warmup_) return false;
  const bool landed = outer_->finish(step, params);
  channel_.check.verify(/*wait=*/true);
  return landed;
}

}  // namespace tributary
