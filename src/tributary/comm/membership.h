// Who is in a fault-tolerant group, round by round (torchft's quorum, PCCL's re-formed group, on the run's store).
//
// Members have stable ids (their launch ranks); an epoch is one membership, and the process group of an epoch lives
// under its own store prefix (group_prefix()), so survivors re-form without the dead. Every member runs a heartbeat
// (comm/heartbeat.h); a member whose heartbeat is stale for dead_after_s is dead to the others.
//
// A round (an outer step's reduction, a data-parallel step) is committed or discarded as a whole:
//   vote     every member says whether its collective succeeded (and whether it wants to stop);
//   decide   once every member voted or is dead, the first proposal written wins (Store::set_once), so all members
//            act on one decision: commit iff every member of the epoch voted ok. A discarded round is redone by the
//            survivors of the next epoch; nothing of it is applied.
//   reform   after a discarded round each survivor registers for the next epoch and waits until every member of
//            the old one registered or is dead; the first list written is the new membership. A process left out
//            (it was frozen past the deadline) gets an Error: it must not go on as a replica.
// Every wait ends: a member either answers or its heartbeat goes stale.
//
// Keys (under "ft/"): hb/{id}, e{E}/{round}/vote/{id}, e{E}/{round}/failures, e{E}/{round}/decision,
// e{E}/join/{id}, e{E}/members.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tributary/comm/heartbeat.h"
#include "tributary/comm/store.h"

namespace tributary::comm {

struct RoundDecision {
  bool commit = false;
  bool stop = false;         // some member asked to stop (the run stops after this round, on every member)
  std::vector<int> missing;  // members that did not vote ok (failed, or dead)
};

class Membership {
 public:
  // `heartbeat_store`: a second connection for the heartbeat thread. Every one of `world_size` ids starts a member.
  Membership(Store store, Store heartbeat_store, int id, int world_size, double dead_after_s);

  int id() const { return id_; }
  int epoch() const { return epoch_; }
  const std::vector<int>& members() const { return members_; }
  int rank() const;  // this process's index in members()
  int size() const { return static_cast<int>(members_.size()); }
  std::string group_prefix() const { return "ft/group-e" + std::to_string(epoch_); }
  double dead_after_s() const { return liveness_.dead_after_s(); }

  // While a collective of `round` is in flight: true once it cannot succeed (a member is dead, or one already voted
  // that its collective failed), so the caller abandons it instead of waiting for the collective deadline.
  bool should_abandon(const std::string& round);
  RoundDecision decide(const std::string& round, bool ok, bool stop_wish);
  // The next epoch: the members alive now. Returns the members that were dropped.
  std::vector<int> reform();

 private:
  std::string key(const std::string& round, const std::string& what) const;

  Store store_;
  Heartbeat heartbeat_;
  Liveness liveness_;
  int id_;
  int epoch_ = 0;
  std::vector<int> members_;
};

}  // namespace tributary::comm
