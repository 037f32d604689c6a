#include "tributary/optim/merger_term.h"

#include "tributary/core/log.h"

namespace tributary {

MergerTerm::MergerTerm(UpdateBoard& board, comm::Store heartbeat, int self, int replicas, double dead_after_s)
    : board_(board),
      heartbeat_(std::move(heartbeat), UpdateBoard::kPrefix, self),
      liveness_(board.store(), UpdateBoard::kPrefix, self, dead_after_s),
      self_(self),
      replicas_(replicas),
      dead_after_s_(dead_after_s) {
  if (self_ == replicas_ - 1) board_.claim_term(0);
}

std::vector<int> MergerTerm::alive() {
  std::vector<int> out;
  for (int r = 0; r < replicas_; ++r)
    if (r == self_ || !liveness_.dead(r)) out.push_back(r);
  return out;
}

bool MergerTerm::held() {
  while (board_.term_holder(term_ + 1)) ++term_;
  if (term_ < 0) {  // the last rank has not started yet: after a heartbeat deadline anyone may take term 0
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - born_).count();
    if (waited < dead_after_s_) return false;
    board_.claim_term(0);
    term_ = 0;
  }
  int holder = board_.term_holder(term_).value_or(-1);
  if (holder != self_ && (holder < 0 || liveness_.dead(holder))) {
    const int before = holder;
    holder = board_.claim_term(term_ + 1);
    ++term_;
    if (holder == self_)
      log::warn("replica {}: the merger (replica {}) fell silent; replica {} merges from now on (term {})", self_,
                before, self_, term_);
  }
  return holder == self_;
}

}  // namespace tributary
