// The average of DiLoCo's pseudo-gradients when replicas may die or misbehave: a Reducer (optim/reducer.h) that adds
// two guards around comm::Exchange::average, on the communication thread.
//
// Robust aggregation (dist.aggregate other than "mean", or dist.reject_norm_factor > 0): every update is gathered
// whole and judged (optim/judged_average.h); the count of refused updates is in take_rejected() (metrics "rejected").
// The mean without a norm test stays on the ring, bit for bit.
//
// Fault tolerance (a comm::Membership): each reduction is a round, committed only when every member's collective
// succeeded (Membership::should_commit). A discarded round is redone from the same pseudo-gradients by the survivors
// after the group re-forms (Group::reform under the new epoch's prefix), so the average is over those who contributed
// and nothing is half applied. A member that hangs is abandoned at its heartbeat deadline, not the collective's. Stop
// wishes travel with the votes: stop_decided() turns true on every member after the same round. A round's outcome
// (stop, joiners) is taken by the training thread when it collects that round (wait()), not when the communication
// thread decides it: an overlapped round (Streaming DiLoCo) is decided while training goes on, at a different step on
// each member, but collected at the same step on all of them.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>

#include "tributary/comm/average_check.h"
#include "tributary/comm/comm_thread.h"
#include "tributary/comm/exchange.h"
#include "tributary/comm/link_model.h"
#include "tributary/comm/membership.h"
#include "tributary/optim/adversary.h"
#include "tributary/optim/judged_average.h"
#include "tributary/optim/reducer.h"

namespace tributary {

// Size: the round's collaborators (thread, exchange, group, membership, links), its two guards (the judge and the
// average check), the tests' hooks (adversary, wire tamper), and the outcomes and counters the communication thread
// hands the training thread.
class ResilientAverage : public Reducer {
 public:
  // After a re-formation: the members dropped and the new membership (the caller's accounting and log).
  using Reformed = std::function<void(const std::vector<int>& dropped, const comm::Membership& now)>;
  // `membership`: null without fault tolerance (a failed collective then throws as before). `aggregate`: the rule
  // and checks (mean without a norm test: the ring). `link`: the world's emulated links (subset to the members after
  // a re-formation), if any.
  ResilientAverage(comm::CommThread& thread, comm::Exchange& exchange, comm::Group& group, comm::Membership* membership,
                   AggregateOptions aggregate, std::optional<comm::LinkModel> link, Reformed reformed);
  std::future<std::vector<torch::Tensor>> start(std::vector<torch::Tensor> tensors, int stream = 0) override;
  // Collects a round (rounds are collected in the order they were started) and takes its outcome.
  std::vector<torch::Tensor> wait(std::future<std::vector<torch::Tensor>> pending) override;

  // This rank's update counts `weight` times in the average (sum of w_r * update_r / N; weights of mean 1 make it a
  // weighted mean): islands of unlike size weigh their pseudo-gradients by the tokens they trained on. Set before the
  // first round; 1 leaves the average bit for bit as it was.
  void set_weight(double weight) { weight_ = weight; }
  // Tests and benchmarks: this rank lies (optim/adversary.h): its update is rewritten before every round, and it is
  // shown what the round let it see of the others.
  void set_adversary(std::unique_ptr<Adversary> adversary) { adversary_ = std::move(adversary); }
  // Under a robust rule: the judge of every round's updates (its jury, scores, verdicts); null on the ring.
  JudgedAverage* judge() { return judge_.get(); }
  // Every average is checked against what the ranks sent (comm/average_check.h: a change of the traffic in flight
  // fails the round on every rank, which then applies nothing of it). Set before the first round.
  void check_averages(std::unique_ptr<comm::AverageCheck> check) { check_ = std::move(check); }
  // Tests: applied to this rank's update after the check saw it, as a stranger on the path would change it.
  void set_wire_tamper(std::function<void(std::vector<torch::Tensor>&)> tamper) { wire_tamper_ = std::move(tamper); }
  // Workers asking to join, from the decision of the last collected round; cleared.
  std::vector<int> take_joiners() { return std::exchange(joiners_, {}); }
  // The group and exchange follow the membership after it changed outside a round (admit, join).
  void follow_membership();
  // A round with nothing to average (before a checkpoint), on the communication thread: the members agree who is
  // alive, and one gone since the last round is dropped as a failed round drops it. `round`: a name no other round of
  // this epoch has. True when the members changed.
  bool settle(const std::string& round);
  // DiLoCo rounds: called with the round's name before its first collective, on the communication thread; true when
  // it changed the members (Membership::start_round admits the joiners the lead healed during the round). The group
  // then re-forms before the collective.
  void set_start_round(std::function<bool(const std::string& round)> start) { start_round_ = std::move(start); }
  // Rounds started so far (their store keys): a joiner continues the members' count.
  int64_t rounds() const { return rounds_; }
  void set_rounds(int64_t n) { rounds_ = n; }
  void set_stop_wish(bool stop) { stop_wish_ = stop; }  // training thread: sent with the next round's vote
  bool stop_decided() const { return stop_decided_; }   // as of the last collected round (training thread)
  int64_t reformations() const { return reformations_; }
  int64_t take_rejected() { return rejected_.exchange(0); }
  // Under a robust rule, fault tolerant: what a joiner needs to judge the updates as the members do, read by the lead
  // while no round is in flight (nullopt on the ring), and taken over by the joiner before its first round.
  std::optional<RobustAggregate::Verdicts> verdicts() const {
    return judge_ ? std::optional(judge_->verdicts()) : std::nullopt;
  }
  void adopt_verdicts(RobustAggregate::Verdicts v);

 private:
  std::vector<torch::Tensor> reduce(std::vector<torch::Tensor> tensors, int stream);
  bool form(const std::string& round);  // follow_membership; false when the group could not form (a death)
  // After a discarded round (the members moved to the next epoch without the dead): its group formed (false: it
  // could not).
  bool follow_the_survivors(const std::string& round, const comm::RoundDecision& decision);
  void guarded_average(std::vector<torch::Tensor>& tensors, int stream, const std::string& round);
  // The exchange's average, times `rescale`, checked when check_ is set.
  void checked_average(std::vector<torch::Tensor>& tensors, int stream, double rescale, const std::string& round);

  comm::CommThread& thread_;
  comm::Exchange& exchange_;
  comm::Group& group_;
  comm::Membership* membership_;
  std::unique_ptr<JudgedAverage> judge_;  // null: the mean on the ring
  std::optional<comm::LinkModel> link_;
  Reformed reformed_;
  double weight_ = 1;
  std::unique_ptr<Adversary> adversary_;
  std::function<void(std::vector<torch::Tensor>&)> wire_tamper_;
  std::unique_ptr<comm::AverageCheck> check_;
  int64_t checked_rounds_ = 0;  // names the checks of a run without fault tolerance (rounds_ names the others)
  std::function<bool(const std::string&)> start_round_;
  int64_t rounds_ = 0;
  int64_t round_rejected_ = 0;
  struct Outcome {
    bool stop = false;
    std::vector<int> joiners;
  };
  std::mutex outcomes_mutex_;
  std::deque<Outcome> outcomes_;  // decided by the communication thread, not yet collected
  std::vector<int> joiners_;      // of the last collected round
  bool stop_decided_ = false;     // training thread
  std::atomic<int64_t> reformations_{0};
  std::atomic<bool> stop_wish_{false};
  std::atomic<int64_t> rejected_{0};
};

}  // namespace tributary
