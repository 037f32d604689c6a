// One DiPaCo worker's connection to the others, formed over the run's session (runtime/session.h): the group of the
// members and its exchange (the owners' ring, over the emulated WAN links), the task queue, and the membership that
// agrees after every round's tasks on who is left — the round's quorum (comm::Membership: one heartbeat, the first
// decision written wins). A single process has an in-memory store and a group of one. When a member dies the
// membership re-forms under its next epoch, and the group and its exchange follow (regroup). Internal to dipaco/.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <vector>

#include "tributary/comm/exchange.h"
#include "tributary/comm/group.h"
#include "tributary/comm/membership.h"
#include "tributary/comm/store.h"
#include "tributary/config/run_config.h"
#include "tributary/launch/dist_env.h"
#include "tributary/runtime/dipaco/task_queue.h"
#include "tributary/runtime/session.h"

namespace tributary::dipaco {

// Who a round lost: the members that left, and the tasks of the round they held.
struct Departure {
  std::vector<int> left;
  std::vector<int64_t> lost;
};

class Crew {
 public:
  // `upload_link`: the group's emulated links (path-local uploads go point to point over them; none otherwise). A
  // restarted worker (DistEnv::joining) has a group of one until the members admit it (join()).
  Crew(const Session& session, std::optional<comm::LinkModel> upload_link);

  comm::Store& store() { return *store_; }
  comm::Group& group() { return *group_; }
  comm::Exchange& exchange() { return *exchange_; }
  TaskQueue& queue() { return *queue_; }
  const comm::Membership& membership() const { return *membership_; }  // who the members are, epoch by epoch

  // The membership's decision on the tasks of `round`'s generation `gen` (all of `round_tasks` so far): none when every
  // member is alive; otherwise the members re-formed without the dead (membership().members()), and what they lost. The
  // group is the old one until regroup().
  std::optional<Departure> settle(int64_t round, int64_t gen, const std::vector<int64_t>& round_tasks);
  // The group and its exchange under the membership's epoch (after a departure) or under `prefix` (the same members
  // with other links); `upload_link` as above, `ring_link` the exchange's emulated links over the members.
  void regroup(std::optional<comm::LinkModel> upload_link, std::optional<comm::LinkModel> ring_link);
  void regroup_as(const std::string& prefix, std::optional<comm::LinkModel> upload_link);

  // Between rounds, on every member: the workers that asked to join and that the round's last committed decision
  // listed become members (the next epoch: the members, then them; the lead stays first). Returns them (none: nothing
  // changed). The group is the old one until regroup().
  std::vector<int> admit();
  // A restarted worker: waits (up to `timeout`) until the members admit it after a round — true, and
  // membership().members() lists it, last — or until the run finished without it (false). RunLost when no member is
  // left to take it in. The group is its own until regroup().
  bool join(std::chrono::milliseconds timeout);
  // The lead, when the run ends: workers still waiting to join give up.
  void finish() { membership_->finish(); }

 private:
  comm::ExchangeOptions exchange_options_;
  std::optional<comm::Store> store_;
  std::unique_ptr<comm::Membership> membership_;  // before the group: its formation asks it who is dead
  std::unique_ptr<comm::Group> group_;
  std::unique_ptr<comm::Exchange> exchange_;
  std::unique_ptr<TaskQueue> queue_;
  std::vector<int> joiners_;  // listed by the round's last committed decision; admit() takes them in
};

}  // namespace tributary::dipaco
