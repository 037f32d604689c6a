// The replicas of a multi-process run, as the trainer sees them: one object that owns the group, the exchange
// (compression, accounting, WAN emulation) and the outer optimizers, and answers at three points of the loop:
//   after_backward  data parallel: average the gradients (the outer step is the identity, H = 1)
//   after_step      DiLoCo: every H inner steps, average the pseudo-gradients and take the outer Nesterov step
//   finish          DiLoCo: a last outer step for fragments with pending inner steps
// Data parallel and DiLoCo are the same outer loop with different knobs (shared/design/ARCHITECTURE.md).
//
// Streaming DiLoCo (arXiv 2501.18512): the parameters are split into `fragments` (transformer blocks strided over
// the fragments; embeddings and the final norm/head go with fragment 0), each with its own outer optimizer; fragment
// f syncs at steps f*H/F + k*H, so only one fragment is in flight at a time. With overlap_steps = tau > 0 the
// exchange runs on a communication thread while training continues; tau steps later the outer step is applied to
// the fragment's global copy and merged: local = alpha * local + (1 - alpha) * global.
//
// Replicas are verified identical (xxh64 of the global parameters) at start and after every outer step: a mismatch
// is an Error naming the ranks, never a silent drift. Collectives run in the same order on every rank: all of them go
// through the communication thread's FIFO.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "tributary/comm/exchange.h"
#include "tributary/comm/group.h"
#include "tributary/comm/lagged_vote.h"
#include "tributary/core/safetensors.h"
#include "tributary/model/tensor_io.h"
#include "tributary/optim/outer.h"
#include "tributary/runtime/dist_env.h"
#include "tributary/runtime/run_config.h"

namespace tributary {

// Connects to the run's store and refuses ranks whose resolved configs differ (naming the ranks and keys).
c10::intrusive_ptr<c10d::Store> rendezvous(const RunConfig& config, const DistEnv& env);

class Replicas {
 public:
  // Rendezvous: connects the store and forms the group; refuses ranks whose resolved configs differ (naming the
  // ranks and keys).
  Replicas(const RunConfig& config, const DistEnv& env);
  ~Replicas();

  int rank() const { return group_->rank(); }
  int size() const { return group_->size(); }
  bool ddp() const { return ddp_; }
  // True while gradients are averaged every step: data parallel, or DiLoCo's data-parallel warm-up.
  bool averaging_gradients() const { return ddp_ || in_warmup_; }

  // Joins the run at `step`: 0, or a checkpoint's, with DiLoCo's outer state (`outer`, null for data parallel and
  // during the warm-up) and the fragments' progress() saved with it. Checks that the replicas are identical.
  void start(NamedTensors& params, int64_t step = 0, const safetensors::File* outer = nullptr,
             const nlohmann::json& fragments = nlohmann::json::array());
  // ddp: call before each micro-batch's backward; with one micro-batch per step the gradient buckets are
  // all-reduced while the backward pass is still running (hooks on the parameters).
  void before_backward(bool last_micro_batch, bool single_micro_batch);
  void after_backward(NamedTensors& params);     // ddp: average gradients (waits for the overlapped buckets)
  bool after_step(int64_t step, double lr, NamedTensors& params);  // diloco: outer steps due; true if one landed
  bool finish(int64_t step, NamedTensors& params);
  int64_t outer_steps() const;  // landed outer steps, all fragments together

  // Checkpoints (trainer.cpp, checkpoint.h). One is taken only while no exchange is in flight (overlap defers it).
  bool quiescent() const;
  // The outer state every replica holds identically (rank 0 writes it): each fragment's global parameters
  // ("<param>") and momentum ("<param>.outer_momentum"), and per fragment its last sync and outer-step count (the
  // rest — offsets, the warm-up, QSR's H — follows from the config and the step).
  NamedTensors outer_state() const;
  nlohmann::json progress() const;
  // Small collectives for the checkpoint protocol and the stop agreement (in the communication thread's FIFO).
  void barrier();
  std::vector<torch::Tensor> all_gather(const torch::Tensor& tensor);
  // Called every step on every rank: true on every rank at the same step, a few steps after any rank asked to stop
  // (comm/lagged_vote.h); no outer step or blocking round trip needed.
  bool stop_agreed(bool local_stop);
  int64_t inner_steps_now() const { return current_h_; }
  // This rank's traffic since the last call; comm_s is the time the training thread was blocked on communication.
  comm::CommStats take_stats();
  // The sgemm peak one replica can count on: rank 0 measures the whole machine while the others wait (measuring
  // concurrently would measure contention), and the peak is shared by the local replicas.
  double shared_matmul_peak(const torch::Device& device, int local_world_size);

 private:
  struct Fragment {
    std::vector<size_t> params;  // indices into the model's parameter list
    std::unique_ptr<OuterOptimizer> outer;
    int64_t last_sync = 0;
    // in flight (overlap): the averaged pseudo-gradient arrives through `pending`, to be applied at `apply_step`
    std::future<std::vector<torch::Tensor>> pending;
    int64_t apply_step = -1;
    bool merge = false;  // sent with overlap: merge with the local progress instead of replacing it
  };

  struct Bucket {  // data parallel: parameters in reverse order (the order backward produces their gradients)
    std::vector<size_t> params;
    torch::Tensor flat;
    int64_t ready = 0;
    std::future<std::vector<torch::Tensor>> pending;
  };
  void on_gradient(size_t param, const torch::Tensor& grad);

  NamedTensors subset(const NamedTensors& params, const Fragment& f) const;
  void send(Fragment& f, int64_t step, NamedTensors& params, int64_t overlap_steps);
  void land(Fragment& f, NamedTensors& params);
  void check_identical(const NamedTensors& params, const std::string& when);
  // The same check without blocking training (overlap mode): the all-gather of hashes queues behind the exchanges
  // and is verified when it has arrived (at the latest in finish()).
  void check_identical_later(const NamedTensors& params, const std::string& when);
  void verify_checks(bool wait);
  template <typename T>
  std::future<T> enqueue(std::function<T()> job);  // runs in FIFO order on the communication thread
  template <typename T>
  T on_comm_thread(std::function<T()> job);  // enqueue and wait (the wait counts as blocked time)
  std::future<std::vector<torch::Tensor>> async_average(std::vector<torch::Tensor> tensors);

  RunConfig config_;
  std::unique_ptr<comm::Group> group_;
  std::unique_ptr<comm::LaggedVote> stop_vote_;
  std::unique_ptr<comm::Exchange> exchange_;
  std::vector<Fragment> fragments_;
  struct PendingCheck {
    std::future<std::vector<torch::Tensor>> hashes;
    std::string when;
  };
  std::deque<PendingCheck> pending_checks_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_, offset_in_bucket_;
  bool hooks_armed_ = false;
  bool in_warmup_ = false;  // DiLoCo's data-parallel warm-up (dist.warmup_ddp_steps)
  void build_buckets(NamedTensors& params);
  void build_fragments(NamedTensors& params, int64_t step);
  bool ddp_;
  int64_t current_h_;
  double blocked_s_ = 0;

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::thread comm_thread_;
};

}  // namespace tributary
