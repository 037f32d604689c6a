// How a restarted worker becomes a member again of a fault-tolerant run's replicas (dist.fault_tolerant; torchft's
// heal). Who is in each round — the quorum — is comm::Membership's; the commit-or-redo decision of a round is the
// average's (optim/resilient_average.h, which re-forms the group without the dead); this admits and heals:
//   - at a round boundary (after an outer step — Streaming DiLoCo's overlapped ones when they land, so nothing is in
//     flight — or after any data-parallel step, the warm-up's included) the members admit the workers that asked to
//     join, and the lead sends them everything they need over the group: no checkpoint reload, no restart of the
//     others;
//   - in DiLoCo's phase the lead heals a joiner mid-round instead (offer_heal): the joiner trains on from the lead's
//     step and becomes a member right before the next round's collective, so a replacement contributes to the round
//     in which it started.
// Both sides run the same collectives in the same order: re-form (Membership::admit / join), the lead's meta through
// the store, one broadcast of the state tensors and the outer state (DiLoCo's), the replica hash check on what every
// member holds alike.
#pragma once

#include <atomic>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tributary/comm/membership.h"
#include "tributary/comm/store.h"
#include "tributary/comm/wire_mac.h"
#include "tributary/config/run_config.h"
#include "tributary/data/loader.h"
#include "tributary/model/tensor_io.h"
#include "tributary/runtime/ft/healable_rounds.h"
#include "tributary/runtime/ft/replica_channel.h"

namespace tributary {

// What a worker joining mid-run receives from the lead: `tensors` in place (the same names and shapes on both sides:
// parameters, inner optimizer state), and `meta` (step, tokens, loader position, ...).
struct HealState {
  NamedTensors tensors;
  nlohmann::json meta;
  size_t num_params = 0;  // the first num_params of `tensors` are the trained parameters
};

// A joiner healed mid-round (Admission::join's "pending"): the members' data position and step when the lead sent its
// state, and their number, until it becomes a member. Meanwhile it reads the windows at the lead's cursor in the
// *next* epoch's order (nobody reads them this epoch; they are read again if the run reaches that epoch); once a
// member, it takes the members' position (that position advanced by the steps since) and re-shards with them.
struct PendingHeal {
  LoaderPosition position;
  int64_t step = 0;
  int64_t members_world = 1;
};

class Admission {
 public:
  // `membership` and the channel are the replicas' (runtime/sync/replica_sync.h), `sync` the one it heals; `store` the
  // run's.
  Admission(const RunConfig& config, comm::Membership& membership, comm::Store store, ReplicaChannel channel,
            HealableRounds& sync);

  // Re-formations so far: rounds that dropped the dead, and admissions.
  int64_t reformations() const { return channel_.reducer.reformations() + admissions_; }
  void round_ended();  // ReplicaRounds's hook: the workers that asked to join in the round wait for admit()
  bool start_round(const std::string& round);  // ReplicaRounds's hook, on the communication thread

  // Members, right after a round: true when workers asked to join in it; admit() then re-forms the group with them
  // and sends them `state` and the outer state (none for data parallel).
  bool joiners_waiting() const { return !joiners_.empty() && !channel_.reducer.stop_decided(); }
  void admit(const HealState& state);
  // A restarted worker (DistEnv::joining) instead of ReplicaRounds::start: waits to be admitted at a round boundary,
  // receives the state into `state.tensors` and the outer loop's, and returns the lead's meta. Checks the replicas
  // identical (`params`: the parameters in `state.tensors`). In DiLoCo's phase the lead heals it mid-round instead:
  // the meta then says "pending" (it trains on alone and becomes a member right before the next round's collective;
  // "members_world": the members' number until then).
  nlohmann::json join(NamedTensors& params, HealState state);
  // Mid-round heal, the lead's side (DiLoCo's phase, nothing in flight): true when a worker asked to join;
  // offer_heal() then sends it `state` (the lead's live parameters and AdamW state: the joiner forks the lead's
  // trajectory with its own data) and the outer state over a group of two, on the communication thread.
  bool heal_wanted();
  std::vector<int> offer_heal(const HealState& state);  // the ids of the workers it healed
  bool pending() const { return pending_; }             // a joiner healed mid-round, not a member yet
  // Before a checkpoint (every member at the same step, nothing in flight): the members agree who is alive, as at the
  // end of a round (`round`: a name no other round has); when a member died since the last round the group re-forms
  // without it first, so that the checkpoint's collectives run over the living. True when the members changed.
  bool settle(const std::string& round);
  const std::vector<int>& members() const { return membership_.members(); }  // launch ranks, in the group's order
  const std::string& noun() const { return membership_.noun(); }             // what a member is, in messages
  int rank() const { return channel_.group.rank(); }                         // this process's place among the members
  int size() const { return channel_.group.size(); }                         // the members' number

 private:
  nlohmann::json join_healed(const std::string& offer, NamedTensors& params, HealState& state);
  // With the run's key, the heal's state travels over Gloo and its tag in the lead's meta (the sealed store): the
  // joiner uses only the state whose tag it checked (NetworkError otherwise).
  void seal_state(nlohmann::json& meta, const std::vector<torch::Tensor>& tensors, const std::string& place) const;
  void check_state(const nlohmann::json& meta, const std::vector<torch::Tensor>& tensors,
                   const std::string& place) const;

  const RunConfig& config_;  // the ReplicaSync's own, which outlives this
  comm::Membership& membership_;
  comm::Store store_;  // the heal's meta
  ReplicaChannel channel_;
  HealableRounds& sync_;
  std::vector<int> joiners_;  // admitted after the round that just ended
  std::vector<int> healed_;   // communication thread: healed mid-round, members at the next round
  std::atomic<bool> pending_{false};
  int64_t admissions_ = 0;
  std::optional<comm::WireMac> mac_;  // this invocation's key (none without a run secret)
};

}  // namespace tributary
