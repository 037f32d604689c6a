// Where a DiPaCo path's state lives between its tasks (a path moves from worker to worker, round after round):
//   inner AdamW state   RUN_DIR/inner/path-{p}.round-{r}.safetensors   (the state after round r)
//   early stopping      RUN_DIR/best/path-{p}.safetensors + .json      (parameters and held-out loss of its best round)
// With files only (the owners' ring, the default) the workers must share RUN_DIR. With a depot (dipaco.path_local)
// each worker writes the files into its own RUN_DIR and the state moves between workers through the run's store:
//   holder (dipaco.path_state, the default)  the store holds only who has each state and the early-stopping records
//            (holdout loss, round, holder); a worker that needs a state asks its holder, which serves it from its
//            RUN_DIR on a thread of its own (state_server.h). A dead holder's state is lost.
//   store    every task's state and every improved early-stopping copy is put into the store (2-3x the path's
//            parameters per task, mostly never fetched); it outlives its holder.
// A fresh store (--resume) learns them back from every worker's directory (republish_*), and the leader gathers every
// path's best copy before the early-stopped evaluation.
// Inner state is kept per (path, round): a task re-run after its worker died starts from the previous round's state
// even if the dead worker had already saved this round's.
// A worker that trains a path again reads the state it saved itself from its own RUN_DIR instead of asking for it (or,
// with `store`, fetching it); the task queue lets it claim last round's paths first (task_queue.h).
#pragma once

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tributary/core/fs.h"
#include "tributary/core/safetensors.h"

namespace tributary {

class ModuleDepot;
class StateServer;
namespace comm {
class Store;
}

struct PathStateOptions {
  int self = 0;                                  // this worker's rank (the holder it names)
  bool on_request = true;                        // dipaco.path_state = holder; false: store
  std::chrono::milliseconds ask_timeout{10000};  // a holder silent this long is dead (dist.heartbeat_timeout_s)
};

class PathState {
 public:
  // depot: null = files in the shared run directory (options unused).
  PathState(fs::path run_dir, ModuleDepot* depot, PathStateOptions options = {});
  ~PathState();
  // on_request: answer the others' requests from now on, on `connection` (a store connection of its own).
  void serve(comm::Store connection);
  double take_served_bytes();  // state this worker served since the last call (0 without serve())
  // The live workers (ascending): state held by any other worker is lost without asking (on_request).
  void set_live(std::vector<int> members) { live_ = std::move(members); }

  // Path p's AdamW state after round `round`, or nothing (no such round yet).
  std::optional<safetensors::File> inner(int64_t path, int64_t round);
  void save_inner(int64_t path, int64_t round, const std::string& bytes);  // forgets round - 2
  // The lowest held-out loss path p reached so far (+inf before its first task, or when a dead worker held the copy).
  double best_holdout(int64_t path);
  void save_best(int64_t path, int64_t round, double holdout, const std::string& params);
  // The leader: every path's best copy into its own RUN_DIR/best (a no-op without a depot).
  void gather_best(int64_t num_paths);
  // --resume with a run directory per worker: a fresh store holds no path state, and the files a path needs may sit in
  // another worker's directory. Each worker puts what its own directory holds back into the store: every path's inner
  // state after round `round` (the state its next task loads), and its early-stopping copies unless the store already
  // has a later one (call in turn, worker after worker: the latest round wins). No-ops without a depot.
  void republish_inner(int64_t num_paths, int64_t round);
  void republish_best(int64_t num_paths);

 private:
  fs::path inner_file(int64_t path, int64_t round) const;
  fs::path best_json(int64_t path) const;
  std::optional<std::string> lookup(const std::string& what) const;  // for the server: "inner/p{}/r{}" | "best/p{}"
  std::optional<std::string> from_holder(int holder, const std::string& what);  // its own: read here
  bool is_live(int worker) const {
    return live_.empty() || std::find(live_.begin(), live_.end(), worker) != live_.end();
  }

  fs::path run_dir_;
  ModuleDepot* depot_;
  PathStateOptions options_;
  std::unique_ptr<StateServer> server_;
  std::vector<int> live_;                             // empty: everyone is
  std::set<std::pair<int64_t, int64_t>> saved_here_;  // (path, round) of the inner states this process saved
};

}  // namespace tributary
