// DiPaCo's task queue (arXiv 2403.10616 §3) on the run's store (comm/store.h): a round's (path, shard) tasks are
// claimed one at a time with an atomic counter, so fast workers take more tasks than slow ones and everyone stays busy.
//
// Liveness (comm/heartbeat.h): every worker bumps a heartbeat counter every 0.5 s from its own thread (its own store
// connection). When a worker runs out of tasks it says so; the leader (the lowest-ranked member) then
// settles the round: a member whose heartbeat has not moved for `dead_after` seconds is dead, and every task it
// claimed or finished this round is lost (its pseudo-gradients lived in its memory). Lost tasks are re-queued as a
// new generation of the round (requeue) or dropped (skip); the verdict names the surviving members. Waiting has no
// deadline of its own as long as the leader sees heartbeats: a slow worker is waited for, a dead one is not. A dead
// leader is no exception: the members waiting for its verdict see its heartbeat stop and the next live member decides.
//
// Keys (under the store's "dipaco/" prefix): hb/{worker}, r{R}/g{G}/next, r{R}/claim/{path}, r{R}/done/{path},
// r{R}/g{G}/idle/{worker}, r{R}/g{G}/verdict.
#pragma once

#include <torch/torch.h>

#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tributary/comm/heartbeat.h"
#include "tributary/comm/store.h"

namespace tributary {

struct Verdict {
  bool again = false;            // lost tasks were re-queued as the next generation: run `tasks` and settle again
  std::vector<int64_t> tasks;    // again: the re-queued tasks
  std::vector<int> members;      // workers alive at the verdict, ascending
  std::vector<int64_t> dropped;  // tasks lost and not re-run (skip, or nobody left)
};

class TaskQueue {
 public:
  // `heartbeat_store`: a second connection used only by the heartbeat thread.
  TaskQueue(comm::Store store, comm::Store heartbeat_store, int worker, double dead_after_s);
  ~TaskQueue();

  // The next unclaimed task of (round, generation) from `tasks`, or nothing when all are claimed. `prefer`: paths this
  // worker would rather take first while they are unclaimed (generation 0 only) — those it trained last round, whose
  // AdamW state it wrote itself and need not fetch (path_state.h). A claim is one set_once per path, so a path
  // taken by preference is skipped by the others' turn in the queue.
  std::optional<int64_t> claim(int64_t round, int64_t gen, const std::vector<int64_t>& tasks,
                               const std::vector<int64_t>& prefer = {});
  void done(int64_t round, int64_t path);
  // Called by every member once claim() returned nothing. `round_tasks`: every task of the round (all generations).
  Verdict settle(int64_t round, int64_t gen, const std::vector<int>& members, const std::vector<int64_t>& round_tasks,
                 bool requeue);

 private:
  Verdict decide(int64_t round, int64_t gen, const std::vector<int>& members, const std::vector<int64_t>& round_tasks,
                 bool requeue);
  std::string get(const std::string& key);
  void set(const std::string& key, const std::string& value);
  bool has(const std::string& key);

  comm::Store store_;
  int64_t mine_round_ = -1;
  std::set<int64_t> mine_;  // the paths this worker claimed in generation 0 of round mine_round_
  int worker_;
  double dead_after_s_;
  comm::Heartbeat heartbeat_;
};

}  // namespace tributary
