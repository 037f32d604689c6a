// DiPaCo's task queue (arXiv 2403.10616 §3) on the run's store (comm/store.h): a round's (path, shard) tasks are
// claimed one at a time with an atomic counter, so fast workers take more tasks than slow ones and everyone stays busy.
//
// Who is alive is not the queue's business: a round's tasks are settled by the run's quorum (comm/membership.h, the
// one every fault-tolerant run uses). Once the members agreed who is left, every task that a worker outside them
// claimed or finished this round is lost (its pseudo-gradients lived in its memory), and so is a task nobody claimed:
// lost() says which, the same on every member (a dead worker's keys no longer change, a live one's were written
// before it voted).
//
// Keys (under the store's "dipaco/" prefix): r{R}/g{G}/next, r{R}/claim/{path}, r{R}/done/{path}.
#pragma once

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "tributary/comm/store.h"

namespace tributary {

// The settled state of a round's tasks, the same on every member.
struct Verdict {
  bool again = false;            // lost tasks were re-queued as the next generation: run `tasks` and settle again
  std::vector<int64_t> tasks;    // again: the re-queued tasks
  std::vector<int64_t> dropped;  // tasks lost and not re-run (skip, or nobody left)
};

class TaskQueue {
 public:
  TaskQueue(comm::Store store, int worker);

  // The next unclaimed task of (round, generation) from `tasks`, or nothing when all are claimed. `prefer`: paths this
  // worker would rather take first while they are unclaimed (generation 0 only) — those it trained last round, whose
  // AdamW state it wrote itself and need not fetch (path_state.h). A claim is one set_once per path, so a path
  // taken by preference is skipped by the others' turn in the queue.
  std::optional<int64_t> claim(int64_t round, int64_t gen, const std::vector<int64_t>& tasks,
                               const std::vector<int64_t>& prefer = {});
  void done(int64_t round, int64_t path);
  // The tasks of `round_tasks` (every task of the round, all generations) that no worker of `members` finished or
  // holds claimed.
  std::vector<int64_t> lost(int64_t round, const std::vector<int64_t>& round_tasks, const std::vector<int>& members);

 private:
  comm::Store store_;
  int64_t mine_round_ = -1;
  std::set<int64_t> mine_;  // the paths this worker claimed in generation 0 of round mine_round_
  int worker_;
};

}  // namespace tributary
