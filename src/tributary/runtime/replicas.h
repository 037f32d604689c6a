// The replicas of a multi-process run, as the trainer sees them: one object that composes the rendezvous, the
// group, the exchange (compression, accounting, WAN emulation), the communication thread, and one of two ways to
// keep replicas together, and answers at three points of the loop:
//   after_backward  data parallel (parallel/data_parallel.h): average the gradients (the outer step is the identity,
//                   H = 1); also DiLoCo's data-parallel warm-up (dist.warmup_ddp_steps)
//   after_step      DiLoCo / Streaming DiLoCo (optim/outer_loop.h): the units that are due sync and take their outer
//                   Nesterov step, possibly overlapped with training
//   finish          a last outer step for units with pending inner steps
// Replicas are verified identical (parallel/replica_check.h) at start and after every outer step. Collectives run
// in the same order on every rank: all of them go through the communication thread's FIFO.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "tributary/comm/comm_thread.h"
#include "tributary/comm/exchange.h"
#include "tributary/comm/group.h"
#include "tributary/comm/lagged_vote.h"
#include "tributary/comm/membership.h"
#include "tributary/core/safetensors.h"
#include "tributary/model/tensor_io.h"
#include "tributary/optim/outer_loop.h"
#include "tributary/optim/resilient_average.h"
#include "tributary/parallel/data_parallel.h"
#include "tributary/parallel/replica_check.h"
#include "tributary/runtime/dist_env.h"
#include "tributary/runtime/run_config.h"

namespace tributary {

// The replicas of one part of the model inside a larger world (a pipeline stage's replicas across the pipelines):
// their own process group under `prefix` on the run's store, and their view of the emulated links.
struct ReplicaGroup {
  comm::Store store;
  int rank = 0, size = 1;
  std::optional<comm::LinkModel> link;
  std::string prefix;
};

// What a worker joining mid-run receives from the lead (fault tolerance): `tensors` in place (the same names and
// shapes on both sides: parameters, inner optimizer state), and `meta` (step, tokens, loader position, ...).
struct HealState {
  NamedTensors tensors;
  nlohmann::json meta;
  size_t num_params = 0;  // the first num_params of `tensors` are the trained parameters
};

class Replicas {
 public:
  // Rendezvous: connects the store and forms the group of every rank; refuses ranks whose resolved configs differ.
  Replicas(const RunConfig& config, const DistEnv& env);
  // The replicas of a part of the model (the run's rendezvous is done): no stop vote of their own (the run's covers
  // every rank). During a data-parallel warm-up the part's step averages its gradients itself (a pipeline stage over
  // its data group); these replicas only start DiLoCo when it ends.
  Replicas(const RunConfig& config, ReplicaGroup group);
  ~Replicas();

  int rank() const { return group_->rank(); }
  int size() const { return group_->size(); }
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
  bool after_step(int64_t step, double lr, NamedTensors& params);  // diloco: outer steps due; true if one landed
  bool finish(int64_t step, NamedTensors& params);
  int64_t outer_steps() const { return outer_ ? outer_->outer_steps() : 0; }
  int64_t inner_steps_now() const { return outer_ ? outer_->inner_steps_now() : config_.dist.inner_steps; }

  // Checkpoints (trainer.cpp, checkpoint.h). One is taken only while no exchange is in flight (overlap defers it).
  bool quiescent() const { return !outer_ || outer_->quiescent(); }
  // The outer state every replica holds identically (rank 0 writes it), and per unit its last sync and outer-step
  // count (the rest — offsets, the warm-up, QSR's H — follows from the config and the step).
  NamedTensors outer_state() const { return outer_ ? outer_->outer_state() : NamedTensors{}; }
  nlohmann::json progress() const { return outer_ ? outer_->progress() : nlohmann::json::array(); }
  // This rank's own codec state (top-k / SparseLoCo / PowerSGD error feedback; empty otherwise): each rank saves
  // its own, and a resume with the same workers restores it (load_codec_state, after start()).
  NamedTensors codec_state() const { return exchange_->codec_state(); }
  void load_codec_state(const NamedTensors& state, const std::string& origin) {
    exchange_->load_codec_state(state, origin);
  }
  // Small collectives for the checkpoint protocol (in the communication thread's FIFO).
  void barrier();
  std::vector<torch::Tensor> all_gather(const torch::Tensor& tensor);
  // Called every step on every rank: true on every rank at the same step, a few steps after any rank asked to stop
  // (comm/lagged_vote.h); no outer step or blocking round trip needed. Only for the replicas of the whole world.
  // Fault tolerant: the wish travels with the next outer step's vote, and the run stops after that outer step.
  bool stop_agreed(bool local_stop);
  // Fault tolerance (dist.fault_tolerant): the members now (rank() and size() are this process's place among them),
  // how many re-formations so far, and the updates rejected since the last call (dist.reject_norm_factor).
  bool fault_tolerant() const { return membership_ != nullptr; }
  int64_t reformations() const { return reducer_->reformations() + admissions_; }
  // -1 when neither fault tolerance nor dist.reject_norm_factor guards the exchange.
  int64_t take_rejected() {
    return membership_ || config_.dist.reject_norm_factor > 0 ? reducer_->take_rejected() : -1;
  }
  // Live healing (runtime/replicas_heal.cpp). Members, right after a round (an outer step landed, or a data-parallel
  // step): true when workers asked to join in it; admit() then re-forms the group with them and sends them `state`
  // and the outer state (none for data parallel).
  bool joiners_waiting() const { return !joiners_.empty() && !reducer_->stop_decided(); }
  void admit(const HealState& state);
  // A restarted worker (DistEnv::joining) instead of start(): waits to be admitted at a round boundary, receives the
  // state into `state.tensors` and the outer loop's, and returns the lead's meta. Checks the replicas identical
  // (`params`: the parameters in `state.tensors`). In DiLoCo's phase the lead heals it mid-round instead: the meta
  // then says "pending" (it trains on alone and becomes a member right before the next round's collective;
  // "members_world": the members' number until then).
  nlohmann::json join(NamedTensors& params, HealState state);
  // Mid-round heal, the lead's side (DiLoCo's phase, nothing in flight): true when a worker asked to join;
  // offer_heal() then sends it `state` (the lead's live parameters and AdamW state: the joiner forks the lead's
  // trajectory with its own data) and the outer state over a group of two, on the communication thread.
  bool heal_wanted();
  void offer_heal(const HealState& state);
  bool pending() const { return pending_; }  // a joiner healed mid-round, not a member yet
  // Tests (runtime/ft/faults.h): this rank's every pseudo-gradient corrupted before its round ("nan" | "scale100").
  void inject_bad_updates(const std::string& kind);
  // This rank's traffic since the last call; comm_s is the time the training thread was blocked on communication.
  comm::CommStats take_stats();
  // The training thread's time blocked on communication since the start (dist.slow_workers slows compute only).
  double blocked_total_s() const { return thread_->blocked_total_s(); }
  // The sgemm peak one replica can count on under the run's conditions: every rank measures at the same time with
  // its own threads (the contention of training), and the mean over ranks is every rank's figure. Collective.
  double shared_matmul_peak(const torch::Device& device);

 private:
  void build(const comm::Store& store, int rank, int size, std::optional<comm::LinkModel> link,
             const std::string& prefix, std::optional<comm::LinkModel> world_link);
  void start_outer_loop(NamedTensors& params, int64_t offset);
  void start_data_parallel(NamedTensors& params);

  RunConfig config_;
  bool ddp_;
  bool in_warmup_ = false;  // DiLoCo's data-parallel warm-up (dist.warmup_ddp_steps)
  bool part_ = false;       // a part's replicas: its step averages the warm-up's gradients, not DataParallel hooks
  std::unique_ptr<comm::Membership> membership_;  // dist.fault_tolerant
  std::optional<comm::Store> store_;              // the run's (fault tolerance: the heal's meta)
  std::vector<int> joiners_;                      // admitted after the outer step that just landed
  std::vector<int> healed_;                       // communication thread: healed mid-round, members at next round
  std::atomic<bool> pending_{false};
  std::atomic<int64_t> step_now_{0};  // the training thread's step, for the communication thread's log lines
  bool open_round(const std::string& round);     // communication thread (ResilientAverage::set_open_round)
  nlohmann::json join_healed(const std::string& offer, NamedTensors& params, HealState& state);
  int64_t admissions_ = 0;
  std::unique_ptr<comm::Group> group_;
  std::unique_ptr<comm::LaggedVote> stop_vote_;
  std::unique_ptr<comm::Exchange> exchange_;
  std::unique_ptr<comm::CommThread> thread_;  // joined first by the destructor: its jobs use the members below
  std::unique_ptr<ResilientAverage> reducer_;  // the exchange's average, on the communication thread
  std::unique_ptr<ReplicaCheck> check_;
  std::unique_ptr<DataParallel> data_parallel_;
  std::unique_ptr<OuterLoop> outer_;
};

}  // namespace tributary
