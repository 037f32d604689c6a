#include "tributary/comm/lagged_vote.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <exception>

namespace tributary::comm {

LaggedVote::LaggedVote(const Store& store, int rank, int world_size, GroupOptions options,
                   int lag)
    : group_(store, rank, world_size, std::move(options), "stop-vote"), lag_(std::max(0, lag)) {}

LaggedVote::~LaggedVote() {
  // Every rank started the same ballots, so on a normal end they complete; after an error (a dead peer) waiting
  // could take the whole collective deadline, so only drain when no exception is on its way.
  if (std::uncaught_exceptions() > 0) return;
  for (auto& b : ballots_) {
    try {
      b.pending.wait();
    } catch (const std::exception&) {
    }
  }
}

bool LaggedVote::step(bool local_stop) {
  auto value = torch::tensor({local_stop ? 1.0f : 0.0f});
  auto pending = group_.all_reduce_sum_async(value);
  ballots_.push_back({value, std::move(pending)});
  if (static_cast<int>(ballots_.size()) <= lag_) return false;
  Ballot oldest = std::move(ballots_.front());
  ballots_.pop_front();
  oldest.pending.wait();
  return oldest.value.item<float>() > 0;
}

}  // namespace tributary::comm
