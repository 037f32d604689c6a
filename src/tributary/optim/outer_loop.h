// The outer loop of DiLoCo, Streaming DiLoCo and DiPaCo (data parallel is its H = 1 limit with an identity outer step
// and lives in parallel/data_parallel.h): every step, the units that are due send their pseudo-gradients to the
// reduction; a landed reduction takes the unit's outer Nesterov step. The reduction is a
// parameter: an average across replicas (Reducer: every replica steps its copy of each unit's outer optimizer) or,
// for DiPaCo's modules, an owner reduction (OwnerReducer: each unit's weighted sums reach its one owner, which alone
// holds and steps its outer optimizer; sync_owned()).
//
//   due       unit f (of F fragments; F = 1 is DiLoCo) syncs at offset + f*H/F + k*H, offset = the end of the
//             data-parallel warm-up; the ramp shortens the first rounds and QSR lengthens late ones
//             (optim/round_length.h)
//   send      pseudo-gradient = global - local, handed to `reduce` (asynchronous: a future)
//   land      now (overlap 0: every replica continues from the new global parameters), or tau = overlap_steps
//             later, merged: local = alpha * local + (1 - alpha) * global (Streaming DiLoCo, arXiv 2501.18512)
//   landed    `landed(globals, when, merged)` after every outer step (the replica hash check)
//   faults    a round is committed or redone whole inside the reduction (optim/resilient_average.h), so every outer
//             step that lands here is final
//   DiPaCo    one unit per module; every unit is due at the end of each round (H = tau); the pseudo-gradients are
//             accumulated per path outside the loop (sum_p w_p delta_p, optim/module_outer.h) and handed to
//             sync_owned(); the owner's step is Delta = s(n) * sum / sum_p w_p, then Nesterov
//
// Torch but no communication: the reducer is an interface, so the loop is tested with a fake one (no processes).
#pragma once

#include <functional>
#include <future>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tributary/core/safetensors.h"
#include "tributary/model/tensor_io.h"
#include "tributary/optim/owner_reducer.h"
#include "tributary/optim/reducer.h"
#include "tributary/optim/round_length.h"
#include "tributary/optim/sync_unit.h"

namespace tributary {

struct OuterLoopOptions {
  int64_t inner_steps = 50;   // H
  int64_t fragments = 1;      // F
  int64_t overlap_steps = 0;  // tau
  double merge_alpha = 0.5;
  int64_t ramp_steps = 0;  // rounds lengthen from 1 to H over the first ramp_steps steps (optim/round_length.h)
  double qsr_alpha = 0;
  OuterOptions outer;
  int64_t blocks_per_level = 1;       // to place blocks (levels.L.modules.M.blocks.B) on fragments
  int64_t num_layers = 1;             // for the error message when a fragment gets nothing
  std::string norm_rescale = "none";  // owner reductions: s(n) of optim/module_outer.h (dipaco.norm_rescale)
};

// Size: two kinds of units behind one loop, averaged (Reducer) and owned (DiPaCo's modules, sync_owned); one API for
// both is issue 41's open "one driver" work.
class OuterLoop {
 public:
  using Landed = std::function<void(const NamedTensors& globals, const std::string& when, bool merged)>;

  OuterLoop(const OuterLoopOptions& options, Reducer& reducer);  // `reducer` outlives the loop
  explicit OuterLoop(const OuterLoopOptions& options);           // units with owners: sync_owned() only
  void set_landed(Landed landed) { landed_ = std::move(landed); }

  // Splits the parameters into units (blocks strided over the fragments; embeddings, final norm and head with
  // fragment 0) whose first syncs count from `offset` (the end of the warm-up).
  void start(NamedTensors& params, int64_t offset);
  // Resume: each unit's last sync and outer state from a checkpoint (progress() and outer_state() saved).
  void load(const safetensors::File& outer, const nlohmann::json& progress);
  // A joining replica: each unit's last sync and outer-step count (its outer tensors were received in place).
  void adopt_progress(const nlohmann::json& progress);

  // Owner reductions (DiPaCo): `num_units` units without parameter indices, whose last syncs count from `offset`.
  void start_owned(size_t num_units, int64_t offset);
  void own(size_t unit, const NamedTensors& global);  // this worker owns `unit` from now on: outer state from `global`
  void disown(size_t unit) { units_.at(unit).outer.reset(); }  // another worker owns `unit` from now on
  OuterOptimizer* owned(size_t unit) const { return units_[unit].outer.get(); }  // nullptr unless owned here
  // One round: `contributions[u]` = this worker's sums of unit u (nullptr: none), `owner[u]` its owner's group rank.
  // Every unit syncs at `step`; each owner takes its units' steps. Collective over the reducer's group.
  void sync_owned(int64_t step, const std::vector<const ModuleAccumulator*>& contributions,
                  const std::vector<int>& owner, OwnerReducer& reducer);

  bool after_step(int64_t step, double lr, NamedTensors& params);  // true if an outer step landed
  bool finish(int64_t step, NamedTensors& params);  // lands what is in flight and syncs pending inner steps
  // Whether after_step(step, lr, ...) — and with `last`, finish(step, ...) — would send or land a unit.
  bool due(int64_t step, double lr, bool last) const;

  bool quiescent() const;  // nothing in flight
  int64_t outer_steps() const;
  int64_t inner_steps_now() const;  // H of the round now running (fragment 0's): the ramp's and QSR's choice
  // Of the units whose outer state this worker holds (all of them unless owned):
  NamedTensors globals() const;      // the global parameters
  NamedTensors outer_state() const;  // globals and momenta ("<param>.outer_momentum")
  nlohmann::json progress() const;   // per unit: last_sync, outer_steps
  const std::vector<SyncUnit>& units() const { return units_; }

 private:
  NamedTensors subset(const NamedTensors& params, const SyncUnit& u) const;
  void send(SyncUnit& u, int64_t step, NamedTensors& params, int64_t overlap_steps);
  void land(size_t index, NamedTensors& params);
  // after_step's two questions about a unit, which due() asks too: its update in flight lands now; it sends now.
  bool lands_at(const SyncUnit& u, int64_t step) const;
  bool sends_at(const SyncUnit& u, int64_t step, const RoundLength& length) const;
  const NamedTensors& owner_step(size_t unit, const std::vector<torch::Tensor>& sum, double weight, int64_t count);

  OuterLoopOptions options_;
  Reducer* reducer_;  // the average; nullptr for units with owners
  Landed landed_;
  std::vector<SyncUnit> units_;
  RoundLength length_;
  int64_t start_ = 0;  // the step DiLoCo began at (the ramp counts from it)
};

}  // namespace tributary
