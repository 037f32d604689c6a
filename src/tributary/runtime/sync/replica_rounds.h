// How replicas stay together: the one sync object the run loop talks to, for the whole model's replicas or a pipeline
// stage's across the pipelines. It answers at three points of the loop:
//   after_backward  data parallel (parallel/data_parallel.h): average the gradients (the outer step is the identity,
//                   H = 1); also DiLoCo's data-parallel warm-up (dist.warmup_ddp_steps)
//   after_step      DiLoCo / Streaming DiLoCo (optim/outer_loop.h): the units that are due sync and take their outer
//                   Nesterov step, possibly overlapped with training
//   finish          a last outer step for units with pending inner steps
// Replicas are verified identical (parallel/replica_check.h) at start and after every outer step.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "tributary/config/run_config.h"
#include "tributary/core/safetensors.h"
#include "tributary/model/tensor_io.h"
#include "tributary/optim/outer_loop.h"
#include "tributary/parallel/data_parallel.h"
#include "tributary/runtime/ft/healable_rounds.h"
#include "tributary/runtime/ft/replica_channel.h"

namespace tributary {

// What the replicas did after a step: an outer step landed (true on every rank alike), and nothing is in flight (the
// run may stop or checkpoint here).
struct AfterStep {
  bool landed = false;
  bool quiescent = true;
  bool over = false;  // the run's work is done before its last step (asynchronous rounds: the merges took its tokens)
};

// Size: the loop's fifteen questions and the five a heal asks (enter, adopt_progress, check_identical,
// diloco_phase, step_now), which are about the same state: the phase (data parallel, warm-up, DiLoCo) and the outer
// loop's units.
class ReplicaRounds final : public HealableRounds {
 public:
  // What a fault-tolerant run's admission (runtime/ft/admission.h) is told: a round ended (joiners may be waiting),
  // and, in DiLoCo's phase, before each round's collective, which members open it.
  struct AdmissionHooks {
    std::function<void()> round_ended;
    std::function<bool(const std::string& round)> start_round;  // on the communication thread
  };
  // `part`: a pipeline stage's replicas, whose step averages the warm-up's gradients itself (no DataParallel here).
  ReplicaRounds(const RunConfig& config, ReplicaChannel channel, bool part, AdmissionHooks admission = {});

  int size() const { return channel_.group.size(); }
  bool ddp() const { return ddp_; }
  // True while gradients are averaged every step: data parallel, or DiLoCo's data-parallel warm-up.
  bool averaging_gradients() const { return ddp_ || in_warmup_; }

  // Joins the run at `step`: 0, or a checkpoint's, with DiLoCo's outer state (`outer`, null for data parallel and
  // during the warm-up) and the units' progress() saved with it. Checks that the replicas are identical.
  void start(NamedTensors& params, int64_t step = 0, const safetensors::File* outer = nullptr,
             const nlohmann::json& fragments = nlohmann::json::array());
  // ddp: call before each micro-batch's backward; with one micro-batch per step the gradient buckets are
  // all-reduced while the backward pass is still running (hooks on the parameters).
  void before_backward(bool last_micro_batch, bool single_micro_batch);
  void after_backward(NamedTensors& params);  // ddp: average gradients (waits for the overlapped buckets)
  // After each step: DiLoCo's outer steps due, and with `last` (the run's last step) those of units with pending inner
  // steps.
  AfterStep step_ended(int64_t step, double lr, NamedTensors& params, bool last);
  // Whether step_ended(step, lr, ..., last) would read the parameters: an outer step sent or landed, or DiLoCo
  // starting after the warm-up (a pipeline's lead makes its copy of the whole model current for it).
  bool round_due(int64_t step, double lr, bool last) const {
    if (ddp_) return false;
    if (in_warmup_) return step >= config_.dist.warmup_ddp_steps;
    return outer_->due(step, lr, last);
  }
  int64_t outer_steps() const { return outer_ ? outer_->outer_steps() : 0; }
  int64_t inner_steps_now() const { return outer_ ? outer_->inner_steps_now() : config_.dist.inner_steps; }
  // This rank's traffic since the last call; comm_s is the time the training thread was blocked on communication.
  comm::CommStats take_stats();

  // Checkpoints (runtime/replica_checkpoint.h) are taken only while no exchange is in flight (overlap defers them).
  bool quiescent() const override { return !outer_ || outer_->quiescent(); }
  // The outer state every replica holds identically, and per unit its last sync and outer-step count (the rest —
  // offsets, the warm-up, QSR's H — follows from the config and the step).
  NamedTensors outer_state() const override { return outer_ ? outer_->outer_state() : NamedTensors{}; }
  nlohmann::json progress() const override { return outer_ ? outer_->progress() : nlohmann::json::array(); }
  // DiLoCo's global parameters (the round's start model), empty before the outer loop starts (data parallel, the
  // warm-up).
  NamedTensors outer_globals() const { return outer_ && !in_warmup_ ? outer_->globals() : NamedTensors{}; }

  // The phase at `step` (data parallel, the warm-up, or DiLoCo), set up without checks: start() uses it, and the
  // admission's heal, whose joiner then receives the outer state in outer_state()'s tensors and adopts the units'
  // progress. check_identical: the identity check on what every member holds alike (DiLoCo's global parameters,
  // otherwise `params`).
  void enter(int64_t step, NamedTensors& params) override;
  void adopt_progress(const nlohmann::json& progress) override {
    if (outer_) outer_->adopt_progress(progress);
  }
  void check_identical(const NamedTensors& params, const std::string& when) override;
  bool diloco_phase() const override {
    return outer_ && !in_warmup_;
  }  // past the warm-up: a joiner may be healed mid-round
  int64_t step_now() const override { return step_now_; }  // the training thread's step, for log lines

 private:
  bool after_step(int64_t step, double lr, NamedTensors& params);  // diloco: outer steps due; true if one landed
  bool finish(int64_t step, NamedTensors& params);
  void start_outer_loop(NamedTensors& params, int64_t offset);
  void start_data_parallel(NamedTensors& params);

  const RunConfig& config_;  // the ReplicaSync's own, which outlives this
  ReplicaChannel channel_;
  AdmissionHooks admission_;
  bool ddp_;
  bool part_;
  bool in_warmup_ = false;  // DiLoCo's data-parallel warm-up (dist.warmup_ddp_steps)
  std::atomic<int64_t> step_now_{0};
  std::unique_ptr<DataParallel> data_parallel_;
  std::unique_ptr<OuterLoop> outer_;
};

}  // namespace tributary
