// Robust aggregation of the replicas' updates (dist.aggregate): what a round applies when a participant that holds the
// run's secret may still send garbage, nothing, an old update or a push on purpose. The receiver judges every update
// from the update itself, as received — never from a number its sender reports.
//
// Every participant's update arrives whole (comm::Exchange::gather), then, in this order:
//   1. Checks, each refusing the update for the round with a reason: a signature that is not its participant's
//      (with identities, comm/identity.h); non-finite values; a norm above
//      dist.reject_norm_factor x the round's (lower) median norm, or below the median / that factor (a free rider's
//      zeros); the same values as an update seen in the last `memory` exchanges (a replay of its own, a copy of
//      another's: compared on a fixed sample of coordinates, cosine >= 0.9999 and norms within 1%). A participant
//      already evicted (below) is refused from then on.
//   2. The rule over the accepted updates (optim/merge_rule.h: mean, trimmed_mean, median, centered_clip).
//   3. Scores: every update's cosine with the aggregate (how far it agreed with the round; a refused update scores
//      -1). A participant refused or scoring below `min_score` in `evict_after` exchanges in a row is evicted.
// With loss scores (dist.score = "loss", Covenant's Gauntlet: `improvements` given to combine(), each update's
// lowering of the loss on a probe batch its sender could not choose, agreed by its evaluators), the score is a rating
// instead: each exchange an update scores its improvement / the round's median improvement (clipped to [-1, 2]; no
// score when the median does not improve), and its participant's rating (1 at first) moves a quarter of the way to
// it (one noisy round of an honest update does not refuse it: two at -1 in a row do). A rating below `min_score`
// refuses the update before the rule (step 1). An exchange counts towards eviction when the update was refused, or
// rated below `min_score`, or agreed less than `min_score` with the aggregate (the cosine of step 3: noise lowers the
// probe's loss by a sliver, and a rating drifting to 0 took 9 exchanges to evict it; its cosine is ~0 at once).
// Every participant decodes the same bytes and runs the same arithmetic (norms summed in a fixed order, whatever the
// thread count), so every participant applies the same aggregate and refuses the same updates.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tributary/optim/aggregate_options.h"
#include "tributary/optim/merge_rule.h"

namespace tributary {

// Why an update was refused this round.
struct Refusal {
  int participant = 0;  // index in the round's updates
  std::string reason;
};

struct Aggregated {
  torch::Tensor value;           // fp32, the updates' length (zeros when every update was refused)
  std::vector<double> norms;     // every update's, as received
  std::vector<Refusal> refused;  // in participant order
  std::vector<double> scores;    // every update's cosine with the aggregate, or its loss rating; -1 when refused
  std::vector<int> evicted;      // the participants (ids) this exchange evicted
  int64_t accepted = 0;
};

// Size: the rule, and the fingerprints of the updates of the last rounds (replays and copies).
class RobustAggregate {
 public:
  explicit RobustAggregate(AggregateOptions options);

  // updates[i]: participant i's update, fp32, one dimension, all of one length; undefined when its signature failed
  // (comm::Exchange::gather), and then refused. `ids[i]`: the participant's name in the reasons (a member id, a
  // rank). Remembers the accepted updates' fingerprints for the next rounds.
  // With loss_scores: `improvements[i]`, how much update i alone lowered the loss on the round's probe batch (NaN:
  // not measured); none: the round is not rated (a warm-up's gradients). Ignored without loss_scores.
  Aggregated combine(const std::vector<torch::Tensor>& updates, const std::vector<int>& ids,
                     const std::vector<double>* improvements = nullptr);
  const AggregateOptions& options() const { return options_; }

  // What a participant must hold to judge the next exchange as the others do, beside the fingerprints: who is
  // evicted (and why), the strikes towards it, the loss ratings, and the exchanges judged so far. A fault-tolerant
  // run's joiner receives them with its heal, and a round redone without the dead starts again from them.
  struct Verdicts {
    std::map<int, std::string> evicted;
    std::map<int, int> strikes;
    std::map<int, double> ratings;
    int64_t exchanges = 0;
  };
  Verdicts verdicts() const { return {evicted_, strikes_, ratings_, round_}; }
  // Takes `v` over and forgets the fingerprints (a joiner has none).
  void adopt(Verdicts v) {
    evicted_ = std::move(v.evicted);
    strikes_ = std::move(v.strikes);
    ratings_ = std::move(v.ratings);
    round_ = v.exchanges;
    seen_.clear();
  }
  // Forgets the earlier exchanges' fingerprints: a fault-tolerant group does this on every member when its
  // membership changes, so that a joiner, which starts with none, checks replays as they do.
  void forget_fingerprints() { seen_.clear(); }

 private:
  struct Fingerprint {
    int id = 0;
    int64_t round = 0, numel = 0;  // the exchange it was seen in, and its update's length
    torch::Tensor sample;          // the values at sample_index_, fp64
    double norm = 0;
  };
  std::string seen_before(const torch::Tensor& sample, int64_t numel, double norm) const;
  void score_and_evict(const std::vector<torch::Tensor>& updates, const std::vector<int>& ids, Aggregated& out);
  // Loss scores: moves every measured participant's rating; the reason to refuse each update for its rating ("": none).
  std::vector<std::string> rate(const std::vector<double>& improvements, const std::vector<int>& ids);
  static double target_of(double improvement, double median);

  AggregateOptions options_;
  std::unique_ptr<MergeRule> rule_;                // options_.rule
  std::map<int, int> strikes_;                     // by id: exchanges in a row refused or below min_score
  std::map<int, std::string> evicted_;             // by id: why
  std::map<int, double> ratings_;                  // by id, with loss scores: 1 at first
  std::map<int64_t, torch::Tensor> sample_index_;  // by length: fixed coordinates, seeded by the length
  std::deque<Fingerprint> seen_;
  int64_t round_ = 0;
};

}  // namespace tributary
