// The replicas' sync (runtime/sync/sync.h): the whole model's replicas of a multi-process run, or the replicas of a
// part inside a larger sync (a pipeline stage's across the pipelines, an island's ranks, an outer shard across the
// islands). It holds the group and its exchange (compression, accounting, WAN emulation), the communication thread
// every collective runs on (so that all ranks issue them in the same order), the run's stop vote and the shared
// matmul peak; what the replicas do with them is two objects of their own: their rounds (rounds(): data parallel or
// DiLoCo, replica_rounds.h) and, under dist.fault_tolerant, who they are (admission(): runtime/ft/admission.h).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "tributary/comm/comm_thread.h"
#include "tributary/comm/exchange.h"
#include "tributary/comm/group.h"
#include "tributary/comm/lagged_vote.h"
#include "tributary/comm/membership.h"
#include "tributary/config/run_config.h"
#include "tributary/launch/dist_env.h"
#include "tributary/model/tensor_io.h"
#include "tributary/optim/resilient_average.h"
#include "tributary/parallel/replica_check.h"
#include "tributary/runtime/ft/admission.h"
#include "tributary/runtime/session.h"
#include "tributary/runtime/sync/replica_rounds.h"
#include "tributary/runtime/sync/sync.h"

namespace tributary {

// The replicas of one part of the model inside a larger world (a pipeline stage's replicas across the pipelines):
// their own process group under `prefix` on the run's store, and their view of the emulated links.
struct ReplicaGroup {
  comm::Store store;
  int rank = 0, size = 1;
  std::optional<comm::LinkModel> link;
  std::string prefix;
  // A part of the model (a pipeline stage's replicas, an island's outer shard), whose own step averages any warm-up's
  // gradients; false: the replicas average their gradients here (data parallel).
  bool part = true;
};

// The members of a fault-tolerant group (dist.fault_tolerant): member `id` of `size` on `store` (the run's keys, or
// the island leads' scope of them), `heartbeat_store` a second connection for its heartbeat thread; `joining`: a
// restarted member that joins the running group; `link`: the members' emulated links.
struct MemberGroup {
  comm::Store store, heartbeat_store;
  int id = 0, size = 1;
  bool joining = false;
  std::optional<comm::LinkModel> link;
  std::string noun = "worker";                  // what a member is, in the messages ("island")
  std::shared_ptr<comm::MessageSigner> signer;  // signs the membership's messages (null: unsigned)
};

// Size: the Sync's answers for the whole model's replicas, and what the syncs that compose it (pipeline_sync.h,
// island_sync.h) and the trainer's report ask of a part's replicas: their rounds, admission, codec state, weight and
// rejected updates.
class ReplicaSync : public Sync {
 public:
  // The replicas of the whole run: the group of every rank, over the session's store and links.
  explicit ReplicaSync(const Session& session);
  // The replicas of a part of the model (the run's rendezvous is done): no stop vote of their own (the run's covers
  // every rank). During a data-parallel warm-up the part's step averages its gradients itself (a pipeline stage over
  // its data group); these replicas only start DiLoCo when it ends.
  ReplicaSync(const RunConfig& config, ReplicaGroup group);
  // The fault-tolerant replicas of a part of the run (the islands, spoken for by their ranks 0): a membership of their
  // own, whose stop vote travels with its rounds as the whole run's does.
  ReplicaSync(const RunConfig& config, MemberGroup members);
  ~ReplicaSync() override;

  // The Sync of the whole model's replicas: every rank holds and trains the whole model and reads its own share of
  // the windows; a resume takes the checkpoint's outer state, a restarted member joins the run (join_run).
  Share share() const override { return {.data = {launched_rank_, launched_}, .batches_per_step = size()}; }
  Started start(const StartState& state) override;
  ReplicaSync* replicas() override { return this; }
  StepPeers step_peers() override;
  AfterStep after_step(int64_t step, double lr, NamedTensors& trained, bool last) override {
    return rounds_->step_ended(step, lr, trained, last);  // DiLoCo: an outer step every H inner steps
  }
  RunPeers peers() override;  // the whole model's replicas only: a part's are inside a larger run's
  // The per-rank state, plus DiLoCo's outer state (identical on every rank, outer.safetensors) and the units'
  // progress.
  bool checkpoint_part(const fs::path& run_dir, int64_t step, const RankState& mine,
                       CheckpointContents& contents) override;
  void summarize(TrainSummary& summary) override { summary.world_size = size(); }

  int rank() const { return group_->rank(); }  // a fault-tolerant run's: this process's place among the members
  int size() const { return group_->size(); }
  ReplicaRounds& rounds() { return *rounds_; }
  Admission* admission() { return admission_.get(); }  // dist.fault_tolerant; null otherwise

  // Called every step on every rank: true on every rank at the same step, a few steps after any rank asked to stop
  // (comm/lagged_vote.h); no outer step or blocking round trip needed. Only for the replicas of the whole world.
  // Fault tolerant: the wish travels with the next outer step's vote, and the run stops after that outer step.
  bool stop_agreed(bool local_stop);
  // This rank's own codec state (top-k / SparseLoCo / PowerSGD error feedback; empty otherwise): each rank saves
  // its own, and a resume with the same workers restores it (load_codec_state, after rounds().start()).
  NamedTensors codec_state() const { return exchange_->codec_state(); }
  void load_codec_state(const NamedTensors& state, const std::string& origin) {
    exchange_->load_codec_state(state, origin);
  }
  // The updates refused since the last call (dist.reject_norm_factor, dist.aggregate, or a fault-tolerant run's
  // guard); -1 when none guards the exchange.
  int64_t take_rejected() { return membership_ || config_.dist.judges_updates() ? reducer_->take_rejected() : -1; }
  // Under a robust rule: every participant's score in the last exchange (JudgedAverage::take_scores); else empty.
  std::map<int, double> take_scores() {
    return reducer_->judge() ? reducer_->judge()->take_scores() : std::map<int, double>{};
  }
  // This rank's updates count `weight` times in the average (ResilientAverage::set_weight).
  void set_update_weight(double weight) { reducer_->set_weight(weight); }
  // Tests and benchmarks (runtime/ft/faults.h): this rank lies in every round (optim/adversary.h's kinds).
  void install_adversary(const std::string& kind);
  // dist.score = "loss": the robust exchange's jury (optim/probe_jury.h) judges with `probe`. Before the first round
  // (start() does it for the whole model's replicas; a sync that composes this one does it for its part's).
  void judge_by_loss(const ProbeMaker& probe);

 private:
  // The sgemm peak one replica can count on under the run's conditions: every rank measures at the same time with
  // its own threads (the contention of training), and the mean over ranks is every rank's figure; `words` says which
  // measurement it is. Collective.
  double shared_matmul_peak(const torch::Device& device, std::string& words);
  // Small collectives for the checkpoint protocol (in the communication thread's FIFO); fault tolerant, they give up
  // at a member's death (a NetworkError) instead of at the collective deadline.
  CheckpointPeers checkpoint_peers();
  void barrier();
  std::vector<torch::Tensor> all_gather(const torch::Tensor& tensor);
  void join_members(MemberGroup members);
  // The public key the rank at `group_rank` published (communication thread): what its signatures are checked with.
  std::string key_of(int group_rank);
  void build(const comm::Store& store, int rank, int size, std::optional<comm::LinkModel> link,
             const std::string& prefix, std::optional<comm::LinkModel> world_link, bool part);
  template <typename T>
  T abandoning_on_death(const std::function<T()>& collective);

  RunConfig config_;
  std::unique_ptr<comm::Membership> membership_;  // dist.fault_tolerant
  std::optional<comm::Store> store_;              // the run's (fault tolerance: the heal's meta, the shared peak)
  std::unique_ptr<comm::Group> group_;
  std::unique_ptr<comm::LaggedVote> stop_vote_;
  std::unique_ptr<comm::Exchange> exchange_;
  std::unique_ptr<comm::CommThread> thread_;   // joined first by the destructor: its jobs use the members below
  std::unique_ptr<ResilientAverage> reducer_;  // the exchange's average, on the communication thread
  std::unique_ptr<ReplicaCheck> check_;
  std::unique_ptr<ReplicaRounds> rounds_;
  std::unique_ptr<Admission> admission_;
  int launched_rank_ = 0, launched_ = 1;  // the launched ranks (a fault-tolerant run's members may be fewer)
  int local_workers_ = 1;                 // the launched workers sharing this machine (the peak's key)
  // The whole run's replicas with identities (runtime/rendezvous.h): this rank's, and the published keys the robust
  // exchange checks signatures with, pinned per membership epoch (communication thread).
  std::shared_ptr<const comm::Identity> identity_;
  std::optional<comm::Store> identity_store_;
  std::vector<std::string> admitted_;  // dist.admission's keys, read once (empty: open)
  std::map<int, std::string> pinned_keys_;
  int pinned_epoch_ = -1;
};

}  // namespace tributary
