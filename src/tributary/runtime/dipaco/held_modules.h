// What one DiPaCo worker holds of the global modules, and how a round's reduction updates them:
//   the owners' ring (default)   every module's global parameters (any worker may draw any path next); a round's
//                                sums go through one ring that leaves each owner with its modules' sums and brings
//                                every change back to everyone (optim/module_ring.h);
//   path-local (dipaco.path_local) only the owned modules; a task fetches its path's other modules from the depot
//                                (module_depot.h) and drops them; a round sends each touched module's sum to its owner
//                                only (optim/module_owners.h) and every owner publishes its new values.
// The modules are the sync units of an OuterLoop (optim/outer_loop.h) whose reduction is the owners' ring
// (optim/module_ring.h) or the path-local upload (optim/module_owners.h); the loop holds the owned modules' outer
// state and takes their steps.
// Owners: modules dealt round-robin over the initial workers; a dead owner's modules pass to a survivor, which
// restarts their momentum from zero (the state died with the owner; path-local, the values come from the depot).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tributary/artifacts/modules.h"
#include "tributary/comm/codec.h"
#include "tributary/comm/exchange.h"
#include "tributary/comm/group.h"
#include "tributary/optim/module_feedback.h"
#include "tributary/optim/module_outer.h"
#include "tributary/optim/module_owners.h"
#include "tributary/optim/outer.h"
#include "tributary/optim/outer_loop.h"
#include "tributary/runtime/dipaco/module_depot.h"

namespace tributary {

class HeldModules {
 public:
  // `initial`: every module (from the seed, init_from or the resumed run's files); this worker is `rank` of `world`;
  // `links`: the emulated links among every worker (the session's; none without dist.wan).
  HeldModules(const RunConfig& config, const PathGrid& grid, int rank, int world, ModuleSet initial,
              std::optional<comm::LinkModel> links);

  // Creates the outer optimizers of the modules this worker owns and lacks (returned: their outer state starts from
  // the global parameters and zero momentum), and drops those of modules it no longer owns.
  std::map<std::string, OuterOptimizer*> own(int64_t round);
  std::map<std::string, OuterOptimizer*> outer() const;  // the owned modules' outer state, by module id
  // Path-local: from round `round` on, keep only the owned modules; the others come from `store`.
  void go_path_local(const comm::Store& store, std::chrono::milliseconds fetch_timeout, int64_t round);
  bool path_local() const { return depot_ != nullptr; }
  // A re-formation (a departure or an admission): the members, as of round `round`; returns what own() returned.
  std::map<std::string, OuterOptimizer*> set_members(std::vector<int> members, int64_t round);
  std::optional<comm::LinkModel> link() const;  // the emulated links among the members (dist.wan), if any

  ModuleSet path_view(int64_t path, int64_t round);  // the modules of `path` as round `round` starts
  ModuleSet all(int64_t round);                      // every module (path-local: fetched), for the module files
  int64_t numel(const std::vector<std::string>& ids) const;
  // Ring: every worker holds the same modules (a hash all-gather; Error naming the workers otherwise).
  void check_identical(comm::Group& group, const std::string& when) const;

  // The round's reduction and outer steps (the loop's sync at `step`, the round's last); returns the bytes (sent,
  // received). Path-local: `gate` decides, once the messages are in, whether the owners apply the round
  // (optim/module_owners.h); ExchangeAborted when it says no, with nothing applied or published.
  std::pair<double, double> reduce(int64_t round, int64_t step,
                                   const std::map<std::string, ModuleAccumulator>& accumulated, comm::Group& group,
                                   comm::Exchange& exchange, ExchangeGate gate = nullptr);
  double modelled_s() const { return modelled_s_; }  // the ring's modelled link time in the last reduce
  DepotBytes take_depot_bytes() { return depot_ ? depot_->take_bytes() : DepotBytes{}; }
  ModuleDepot* depot() { return depot_.get(); }
  // Path-local SparseLoCo (dist.compression = sparseloco): this worker's error feedback per module, else nullptr.
  ModuleFeedback* feedback() { return feedback_.get(); }
  std::vector<int64_t> numel_by_index() const;  // each module's parameter count, in module index order

 private:
  int owner_of(size_t module) const;  // worker id
  bool owns(const std::string& id) const;
  int group_rank_of(int worker) const;
  void publish_owned(int64_t round);

  const RunConfig& config_;
  const PathGrid& grid_;
  int rank_, world_;
  std::optional<comm::LinkModel> links_;  // among every worker
  std::vector<std::string> module_ids_;
  std::vector<int> members_;
  ModuleSet global_;  // every module's global parameters (ring), or the owned modules' (path-local)
  OuterLoop loop_;    // one unit per module (in module_ids_ order); master copy + momentum of the owned ones
  std::map<std::string, std::vector<std::string>> layout_;  // each module's tensor names, in order
  std::map<std::string, int64_t> numel_;                    // each module's parameter count
  std::unique_ptr<comm::Codec> codec_;                      // path-local upload
  std::unique_ptr<ModuleFeedback> feedback_;                // path-local upload, sparseloco
  std::unique_ptr<ModuleDepot> depot_;
  double modelled_s_ = 0;
};

}  // namespace tributary
