// The average of DiLoCo's pseudo-gradients when every replica's update is judged (dist.aggregate other than "mean",
// or dist.reject_norm_factor > 0): the updates are all-gathered whole (comm::Exchange::gather) instead of summed on
// the ring, every rank judges each one as received and applies the rule (optim/robust_aggregate.h), with loss scores
// when a jury is set (optim/probe_jury.h). A refused update is named (participant, exchange, reason) and left out; an
// evicted participant is named once to everybody and once to itself. Sealed payloads (with the run's key) need no
// check of the result: every rank decodes what each rank sent.
//
// One of ResilientAverage's two guards (optim/resilient_average.h), which owns the rounds, the members and their
// failures; this class owns the judging and what it remembers between exchanges (fingerprints, ratings, verdicts).
// Called on the communication thread; take_scores() from the training thread.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tributary/comm/exchange.h"
#include "tributary/comm/group.h"
#include "tributary/optim/adversary.h"
#include "tributary/optim/probe_jury.h"
#include "tributary/optim/robust_aggregate.h"

namespace tributary {

class JudgedAverage {
 public:
  explicit JudgedAverage(AggregateOptions options) : aggregate_(std::move(options)) {}

  // Loss scores (dist.score = "loss"): every exchange's updates are measured by the jury before the rule.
  void set_jury(std::unique_ptr<ProbeJury> jury) { jury_ = std::move(jury); }

  // One exchange: `tensors` (this rank's update, rank group.rank()) are gathered over `exchange` and replaced by the
  // aggregate. `ids[r]`: the participant at group rank r; `epoch`: the membership's (a change forgets the
  // fingerprints, which a joiner does not have); `noun`: what a participant is called in the logs; `number`: the
  // exchange's (1-based, in the logs and the jury's probe). `adversary`: shown what the exchange let it see (null:
  // none). Returns how many updates were refused.
  int64_t average(comm::Exchange& exchange, comm::Group& group, std::vector<torch::Tensor>& tensors,
                  const std::vector<int>& ids, int epoch, const std::string& noun, int64_t number, Adversary* adversary,
                  int stream);

  // What a joiner needs to judge as the members do; adopted before its first exchange (or to redo a discarded one).
  RobustAggregate::Verdicts verdicts() const { return aggregate_.verdicts(); }
  void adopt(RobustAggregate::Verdicts v, int epoch);

  // Every participant's score in the last exchange (id -> cosine with the aggregate or loss rating, -1 when refused),
  // then cleared.
  std::map<int, double> take_scores() {
    std::lock_guard<std::mutex> lock(scores_mutex_);
    return std::exchange(scores_, {});
  }

 private:
  RobustAggregate aggregate_;
  int epoch_ = 0;                    // the membership's epoch aggregate_'s fingerprints belong to
  std::unique_ptr<ProbeJury> jury_;  // loss scores; null: agreement scores
  std::mutex scores_mutex_;
  std::map<int, double> scores_;  // of the last exchange (communication thread -> training thread)
  bool told_evicted_ = false;     // this rank was told the others evicted it
};

}  // namespace tributary
