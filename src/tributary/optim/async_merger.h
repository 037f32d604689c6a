// Asynchronous DiLoCo's merger (Decoupled DiLoCo, arXiv 2604.21428; Asynchronous Local-SGD, Liu et al. 2024): it takes
// the replicas' pseudo-gradients as they arrive on the update board (optim/update_board.h) and merges them into the
// next global version without any replica waiting for another.
//   quorum   a merge closes once updates from dist.min_quorum replicas have arrived and dist.grace_s has passed since
//            then, for stragglers (at once when every live replica has one in): the quorum of a merge is whoever
//            arrived, not a fixed set.
//   weight   each update counts by the tokens it represents, discounted by its lag L: the rounds of the whole run
//            (round tokens x replicas) merged since the version it trained from. w = tokens / (round tokens x
//            replicas x max(1, L)): a round's update counts 1 / replicas as in synchronous DiLoCo's average whichever
//            merge it lands in, and is discounted only for what was merged beyond one round since its start. Up to
//            one round is its peers' rounds trained alongside it (a synchronous merge of all of them, split in two
//            by the quorum): discounting those, 1 / (1 + merges since), made the equal-speed run's rounds count 0.5-
//            0.75 of one (measured, +6.5% loss against synchronous DiLoCo at equal tokens). Weights normalised per
//            merge made two merges of two move the model twice as far as one of four (+14%). An update more than
//            dist.max_staleness merges old (its staleness) is refused.
//   momentum the merged, weighted average takes one outer Nesterov step (optim/outer.h) per merge: the momentum
//            moves once per merge however many updates it holds, Asynchronous Local-SGD's delayed Nesterov with the
//            merge as its period, so a burst of stale updates cannot pump it.
//   refusal  an update whose bytes do not parse, of the wrong names or shapes, with NaN or Inf, for a version the
//            merger never published, or too stale, is refused with a log line naming the replica and the reason;
//            nothing of it reaches the model.
// No single point of failure: every replica process holds a candidate (this class) with its heartbeat. The merging
// role is a term held by one rank (optim/merger_term.h). When the holder's heartbeat goes stale, the candidates race
// for the next term and the winner takes over
// from the last committed version's parameters, momenta and consumed posts: at most the merge in flight is lost,
// its updates are merged by the successor. A merger that was frozen and comes back loses its next commit to the
// successor's (set_once) and stands down; the model is never half written.
// The run is done when the merges have taken in dist's token budget (train.steps x replicas x a replica's tokens per
// step): the last commit says so and every replica stops at its next round.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "tributary/optim/merger_term.h"
#include "tributary/optim/outer.h"
#include "tributary/optim/robust_aggregate.h"
#include "tributary/optim/update_board.h"
#include "tributary/optim/update_probe.h"

namespace tributary {

struct MergeRules {
  int replicas = 1;
  int64_t min_quorum = 1;
  double grace_s = 1;
  int64_t max_staleness = 4;
  int64_t token_budget = 0;  // the run is done once the merges took in this many tokens (0: never)
  int64_t round_tokens = 1;  // the tokens of one replica's round (H steps)
  OuterOptions outer;
  double dead_after_s = 10;  // a candidate whose heartbeat is stale this long holds no term
  // dist.aggregate and its checks (optim/robust_aggregate.h) over each merge's updates: the rule's value, scaled by
  // the accepted updates' summed weight, replaces their weighted sum. Mean without a norm test: the weighted sum.
  AggregateOptions aggregate;
};

// Where version 1 of a resumed run stands (AsyncSync::start from a checkpoint): the tokens the run had merged, and the
// outer momenta of the version its checkpoint holds. A fresh run: none of either.
struct MergeStart {
  int64_t tokens = 0;
  NamedTensors momenta;  // "<param>.outer_momentum"; empty: zero
};

struct MergerStats {
  int64_t merges = 0, refused = 0, takeovers = 0;
};

// Size: the last committed version's state (version, its tokens and their history, the outer step's momenta, the
// posts consumed), the merge in progress (pending updates, the quorum's clock), its judge (rule and probe), and its
// thread.
class AsyncMerger {
 public:
  // `board`: a store connection of the merger's own; `heartbeat`: another, for this process's heartbeat (started
  // now). `initial`: the model every replica starts from (version 1, when no version exists yet). `on_merge`: the
  // committed meta of each merge this candidate made (the caller logs it and writes merges.jsonl). `start`: version
  // 1's tokens and momenta when the run resumed.
  AsyncMerger(UpdateBoard board, comm::Store heartbeat, int self, MergeRules rules, const NamedTensors& initial,
              std::function<void(const nlohmann::json&)> on_merge = {}, MergeStart start = {});
  ~AsyncMerger();

  // One pass: the term, the posts since the last pass, a merge when one is due. True when it merged. The thread
  // (run()) calls it every few milliseconds; tests call it directly.
  bool poll();
  void run();  // polls on a thread of its own until the run is done or this is destroyed
  // dist.score = "loss": each merge's updates are rated by the loss each alone brings on a probe batch drawn from
  // `seed`, the version and the updates (optim/probe_jury.h), measured by this merger, the merge's only judge. Before
  // run(); the probe reads the merge's start model through global().
  void set_probe(std::unique_ptr<UpdateProbe> probe, uint64_t seed);
  NamedTensors global() const;  // the merger's global model (empty before it loaded one): on the merger's thread
  bool merging() const { return merging_; }
  bool done() const { return done_; }
  MergerStats stats() const;

 private:
  struct Pending {
    PostedUpdate update;
    int64_t staleness = 0;  // merges since its base version
    double lag = 0;         // rounds of the run merged since its base version
    double weight = 0;      // tokens / (round tokens x replicas x max(1, lag)), set when its merge closes
  };
  // The rounds of the run merged since `version` (its staleness in merges where the history is gone).
  double lag_since(int64_t version) const;
  bool elect();
  void take_over();
  void collect();
  std::string refusal(const PostedUpdate& u) const;
  bool due();
  void merge();

  UpdateBoard board_;
  MergerTerm term_;  // who merges; refers to board_
  int self_;
  MergeRules rules_;
  NamedTensors initial_;
  MergeStart start_;
  std::vector<std::string> names_;  // the model's parameters, in order: posts and versions are read in it
  std::function<void(const nlohmann::json&)> on_merge_;

  std::atomic<bool> merging_{false}, done_{false}, stop_{false};
  bool loaded_ = false;  // the merger's state is the last commit's
  std::unique_ptr<OuterOptimizer> outer_;
  int64_t version_ = 0;
  std::map<int64_t, int64_t> tokens_at_;  // the tokens merged by each recent version (committed in its meta)
  int64_t merged_tokens() const { return tokens_at_.at(version_); }
  nlohmann::json tokens_at_json() const;
  std::map<int, int64_t> consumed_;  // per replica: the next post to read
  std::vector<Pending> pending_;
  std::unique_ptr<UpdateProbe> probe_;  // dist.score = "loss"
  uint64_t probe_seed_ = 0;
  std::unique_ptr<RobustAggregate> robust_;  // rules_.aggregate when robust; its history restarts with a takeover
  std::optional<std::chrono::steady_clock::time_point> quorum_since_;
  mutable std::mutex stats_mutex_;
  MergerStats stats_;
  std::thread thread_;
  // The robust rule over pending_ (robust_): refused updates leave pending_ (logged, counted); the others' value.
  std::vector<torch::Tensor> robust_merge();
};

}  // namespace tributary
