// Where a DiPaCo path's state lives between its tasks (a path moves from worker to worker, round after round):
//   inner AdamW state   RUN_DIR/inner/path-{p}.round-{r}.safetensors   (the state after round r)
//   early stopping      RUN_DIR/best/path-{p}.safetensors + .json      (parameters and held-out loss of its best round)
// With files only (the owners' ring, the default) the workers must share RUN_DIR. With a depot (dipaco.path_local)
// the state travels through the run's store and each worker also writes the files into its own RUN_DIR: a fresh store
// (--resume) gets them back from every worker's directory (republish_*), and the leader gathers every path's best copy
// before the early-stopped evaluation.
// Inner state is kept per (path, round): a task re-run after its worker died starts from the previous round's state
// even if the dead worker had already saved this round's.
// A worker that trains a path again reads the state it saved itself from its own RUN_DIR (the same bytes it put into
// the store) instead of fetching it; the task queue lets it claim last round's paths first (task_queue.h).
#pragma once

#include <optional>
#include <set>
#include <string>
#include <utility>

#include "tributary/core/fs.h"
#include "tributary/core/safetensors.h"

namespace tributary {

class ModuleDepot;

class PathState {
 public:
  PathState(fs::path run_dir, ModuleDepot* depot);  // depot: null = files in the shared run directory

  // Path p's AdamW state after round `round`, or nothing (no such round yet).
  std::optional<safetensors::File> inner(int64_t path, int64_t round);
  void save_inner(int64_t path, int64_t round, const std::string& bytes);  // forgets round - 2
  // The lowest held-out loss path p reached so far (+inf before its first task).
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

  fs::path run_dir_;
  ModuleDepot* depot_;
  std::set<std::pair<int64_t, int64_t>> saved_here_;  // (path, round) of the inner states this process saved
};

}  // namespace tributary
