// The replicas of a multi-process run, as the trainer sees them: one object that owns the group, the exchange
// (compression, accounting, WAN emulation) and the outer optimizer, and answers at three points of the loop:
//   after_backward  data parallel: average the gradients (the outer step is the identity, H = 1)
//   after_step      DiLoCo: every H inner steps, average the pseudo-gradients and take the outer Nesterov step
//   finish          DiLoCo: a last outer step if inner steps are pending
// Data parallel and DiLoCo are the same outer loop with different knobs (shared/design/ARCHITECTURE.md).
// Replicas are verified identical (xxh64 of every parameter) at start and after every outer step: a mismatch is an
// Error naming the ranks, never a silent drift.
#pragma once

#include <memory>

#include "tributary/comm/exchange.h"
#include "tributary/comm/group.h"
#include "tributary/model/tensor_io.h"
#include "tributary/optim/outer.h"
#include "tributary/runtime/dist_env.h"
#include "tributary/runtime/run_config.h"

namespace tributary {

class Replicas {
 public:
  // Rendezvous: connects the store and forms the group; refuses ranks whose resolved configs differ (naming the
  // ranks and keys).
  Replicas(const RunConfig& config, const DistEnv& env);

  int rank() const { return group_->rank(); }
  int size() const { return group_->size(); }
  bool ddp() const { return ddp_; }

  void start(NamedTensors& params);             // broadcast-free check that every replica starts identical
  void after_backward(NamedTensors& params);     // ddp: average gradients
  bool after_step(int64_t step, double lr, NamedTensors& params);  // diloco: outer step when due; true if taken
  bool finish(int64_t step, NamedTensors& params);
  int64_t outer_steps() const { return outer_steps_; }
  int64_t inner_steps_now() const { return current_h_; }
  comm::CommStats take_stats() { return exchange_->take_stats(); }
  const comm::Exchange& exchange() const { return *exchange_; }
  OuterOptimizer* outer() { return outer_.get(); }

 private:
  void outer_round(NamedTensors& params);
  void check_identical(const NamedTensors& params, const std::string& when);

  RunConfig config_;
  std::unique_ptr<comm::Group> group_;
  std::unique_ptr<comm::Exchange> exchange_;
  std::unique_ptr<OuterOptimizer> outer_;
  bool ddp_;
  int64_t last_sync_step_ = 0;
  int64_t current_h_;
  int64_t outer_steps_ = 0;
};

}  // namespace tributary
