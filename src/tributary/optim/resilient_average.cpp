#include "tributary/optim/resilient_average.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include "tributary/core/error.h"
#include "tributary/core/log.h"

namespace tributary {

ResilientAverage::ResilientAverage(comm::CommThread& thread, comm::Exchange& exchange, comm::Group& group,
                                   comm::Membership* membership, AggregateOptions aggregate,
                                   std::optional<comm::LinkModel> link, Reformed reformed)
    : thread_(thread),
      exchange_(exchange),
      group_(group),
      membership_(membership),
      judge_(aggregate.judges_updates() ? std::make_unique<JudgedAverage>(std::move(aggregate)) : nullptr),
      link_(std::move(link)),
      reformed_(std::move(reformed)) {}

std::future<std::vector<torch::Tensor>> ResilientAverage::start(std::vector<torch::Tensor> tensors, int stream) {
  return thread_.enqueue<std::vector<torch::Tensor>>(
      [this, stream, t = std::move(tensors)]() mutable { return reduce(std::move(t), stream); });
}

void ResilientAverage::checked_average(std::vector<torch::Tensor>& tensors, int stream, double rescale,
                                       const std::string& round) {
  std::function<bool()> abandon;
  if (membership_) abandon = [this, &round] { return membership_->should_abandon(round); };
  if (check_) check_->before(group_, tensors, round, abandon);
  if (wire_tamper_) wire_tamper_(tensors);
  exchange_.average(tensors, stream);
  if (rescale != 1)
    for (auto& t : tensors) t.mul_(rescale);
  if (check_) check_->after(group_, tensors, rescale / double(group_.size()), round, abandon);
}

void ResilientAverage::guarded_average(std::vector<torch::Tensor>& tensors, int stream, const std::string& round) {
  if (judge_) {
    std::vector<int> ids;
    for (int r = 0; r < group_.size(); ++r) ids.push_back(membership_ ? membership_->members()[r] : r);
    round_rejected_ = judge_->average(exchange_, group_, tensors, ids, membership_ ? membership_->epoch() : 0,
                                      membership_ ? membership_->noun() : "rank", std::stoll(round.substr(1)) + 1,
                                      adversary_.get(), stream);
    return;
  }
  checked_average(tensors, stream, 1.0, round);
  if (adversary_) {  // on the ring it sees the average
    std::vector<torch::Tensor> parts;
    for (const auto& t : tensors) parts.push_back(t.detach().reshape({-1}));
    adversary_->saw(torch::cat(parts), stream);
  }
}

std::vector<torch::Tensor> ResilientAverage::wait(std::future<std::vector<torch::Tensor>> pending) {
  auto result = thread_.wait(std::move(pending));
  if (!membership_) return result;
  std::lock_guard<std::mutex> lock(outcomes_mutex_);
  TRIB_CHECK(!outcomes_.empty(), "a fault-tolerant round was collected without an outcome");
  stop_decided_ |= outcomes_.front().stop;
  joiners_ = std::move(outcomes_.front().joiners);
  outcomes_.pop_front();
  return result;
}

void ResilientAverage::follow_membership() {
  std::optional<comm::LinkModel> link;
  if (link_) link = link_->subset(membership_->members());
  // A member that dies while the group forms is noticed by its heartbeat (or its launch's report), not at Gloo's
  // rendezvous deadline (dist.collective_timeout_s): a chaos run stalled there for minutes.
  group_.set_abandon([this] { return membership_->member_dead(); });
  try {
    group_.reform(membership_->group_prefix(), membership_->rank(), membership_->size(), link);
  } catch (...) {
    group_.set_abandon({});
    throw;
  }
  group_.set_abandon({});
  exchange_.regroup(link);
}

std::vector<torch::Tensor> ResilientAverage::reduce(std::vector<torch::Tensor> tensors, int stream) {
  round_rejected_ = 0;
  if (weight_ != 1)
    for (auto& t : tensors) t.mul_(weight_);
  if (adversary_) adversary_->corrupt(tensors, stream);
  if (!membership_) {
    guarded_average(tensors, stream, fmt::format("a{}", checked_rounds_++));
    rejected_ += round_rejected_;
    return tensors;
  }
  const std::string round = fmt::format("x{}", rounds_++);
  bool formed = true;
  if (start_round_ && start_round_(round)) {
    reformations_ += 1;
    formed = form(round);
  }
  std::vector<torch::Tensor> original;
  for (const auto& t : tensors) original.push_back(t.clone());
  // A discarded round may have been judged by some members and not by others (their gather failed): the redo starts
  // every member from the same verdicts.
  const std::optional<RobustAggregate::Verdicts> judged_before = verdicts();
  for (;;) {
    bool ok = formed;
    group_.set_abandon([this, &round] { return membership_->should_abandon(round); });
    try {
      if (ok) guarded_average(tensors, stream, round);
    } catch (const NetworkError& e) {
      ok = false;
      log::warn("{} {}: round {} of epoch {} failed: {}", membership_->noun(), membership_->id(), round,
                membership_->epoch(), e.what());
    }
    group_.set_abandon({});
    const comm::RoundDecision decision = membership_->should_commit(round, ok, stop_wish_);
    if (decision.commit) {
      rejected_ += round_rejected_;  // the attempt that counted
      std::lock_guard<std::mutex> lock(outcomes_mutex_);
      outcomes_.push_back({decision.stop, decision.joiners});
      return tensors;
    }
    formed = follow_the_survivors(round, decision);
    for (size_t i = 0; i < tensors.size(); ++i) tensors[i].copy_(original[i]);
    if (judged_before) judge_->adopt(*judged_before, membership_->epoch());
  }
}

void ResilientAverage::adopt_verdicts(RobustAggregate::Verdicts v) {
  TRIB_CHECK(judge_, "(verdicts travel only between members judging by a robust rule)");
  judge_->adopt(std::move(v), membership_ ? membership_->epoch() : 0);
}

// Forming a group can fail like a collective (a member died meanwhile): that attempt of the round failed.
bool ResilientAverage::form(const std::string& round) {
  try {
    follow_membership();
    return true;
  } catch (const NetworkError& e) {
    log::warn("{} {}: round {} of epoch {} could not form its group: {}", membership_->noun(), membership_->id(), round,
              membership_->epoch(), e.what());
    return false;
  }
}

bool ResilientAverage::follow_the_survivors(const std::string& round, const comm::RoundDecision& decision) {
  const bool formed = form(round);
  reformations_ += 1;
  if (reformed_) reformed_(decision.dropped, *membership_);
  return formed;
}

bool ResilientAverage::settle(const std::string& round) {
  bool changed = false;
  while (true) {
    const comm::RoundDecision decision = membership_->should_commit(round, true, false);
    if (decision.commit) return changed;
    follow_the_survivors(round, decision);
    changed = true;
  }
}

}  // namespace tributary
