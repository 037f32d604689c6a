// Who leads a run whose members change (fault tolerance: the trainer's replicas, DiPaCo's workers): the first member,
// the group's rank 0 — the lowest surviving launch rank, since members keep their order and joiners come after them
// (a rejoined worker 0 does not take the lead back). Every member derives it from the same membership, so there is
// nothing to vote on. The lead writes the run's files: metrics.jsonl, the evaluations, summary.json, DiPaCo's
// module files.
#pragma once

#include <vector>

namespace tributary {

class Lead {
 public:
  Lead(int self, bool leads) : self_(self), leads_(leads) {}
  bool is() const { return leads_; }
  // After a change of members: true when this worker has just taken over from a lead that left.
  bool follow(const std::vector<int>& members) {
    const bool now = !members.empty() && members.front() == self_;
    const bool took_over = now && !leads_;
    leads_ = now;
    return took_over;
  }

 private:
  int self_;
  bool leads_;
};

}  // namespace tributary
