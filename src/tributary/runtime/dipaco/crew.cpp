#include "tributary/runtime/dipaco/crew.h"

#include <unistd.h>

#include <fmt/format.h>

#include <utility>

#include "tributary/core/error.h"

#include "tributary/comm/wire_mac.h"

namespace tributary::dipaco {

Crew::Crew(const Session& session, std::optional<comm::LinkModel> upload_link)
    : exchange_options_{.codec = session.config().dist.compression,
                        .bucket_mb = session.config().dist.bucket_mb,
                        .link = session.links(),
                        .seed = static_cast<uint64_t>(session.config().train.seed)} {
  const RunConfig& config = session.config();
  const DistEnv& env = session.env();
  store_ = session.store();
  comm::Store heartbeat_store = session.reconnect();
  // A round waits for a slow worker as long as its heartbeat beats (up to dist.collective_timeout_s).
  membership_ = std::make_unique<comm::Membership>(
      *store_, heartbeat_store, env.rank, env.world_size, config.dist.heartbeat_timeout_s, env.joining,
      session.group_options().collective_timeout, "worker", session.membership_signer());
  comm::GroupOptions group_opts = session.group_options();
  group_opts.link = std::move(upload_link);
  // A worker that dies while a group forms (a joiner as the members admit it) ends the wait at its heartbeat
  // deadline, not at the collective deadline.
  group_opts.abandon_forming = [m = membership_.get()] { return m->member_dead(); };
  if (env.joining)
    group_ = std::make_unique<comm::Group>(*store_, 0, 1, group_opts,
                                           fmt::format("dipaco/joining-{}-{}", env.rank, ::getpid()));
  else
    group_ = std::make_unique<comm::Group>(*store_, env.rank, env.world_size, group_opts, "dipaco/g0");
  exchange_options_.mac_key = comm::invocation_key(*store_);  // this invocation's MACs
  exchange_ = std::make_unique<comm::Exchange>(*group_, exchange_options_);
  queue_ = std::make_unique<TaskQueue>(*store_, env.rank);
}

std::optional<Departure> Crew::settle(int64_t round, int64_t gen, const std::vector<int64_t>& round_tasks) {
  const comm::RoundDecision decision =
      membership_->should_commit(fmt::format("dipaco-r{}g{}", round, gen), true, false);
  if (decision.commit) {
    joiners_ = decision.joiners;
    return std::nullopt;
  }
  Departure departure;
  departure.left = decision.dropped;
  departure.lost = queue_->lost(round, round_tasks, membership_->members());
  return departure;
}

void Crew::regroup(std::optional<comm::LinkModel> upload_link, std::optional<comm::LinkModel> ring_link) {
  group_->reform(membership_->group_prefix() + "/dipaco", membership_->rank(), membership_->size(),
                 std::move(upload_link));
  exchange_options_.link = std::move(ring_link);
  exchange_ = std::make_unique<comm::Exchange>(*group_, exchange_options_);
}

std::vector<int> Crew::admit() {
  std::vector<int> joiners = std::exchange(joiners_, {});
  if (!joiners.empty()) membership_->admit(joiners);
  return joiners;
}

bool Crew::join(std::chrono::milliseconds timeout) {
  const comm::JoinResult joined = membership_->join(timeout);
  if (joined.kind == comm::JoinResult::kFinished) return false;
  // DiPaCo's members admit joiners at round boundaries only: none offers a heal mid-round.
  TRIB_CHECK(joined.kind == comm::JoinResult::kAdmitted, "a DiPaCo worker was offered a mid-round heal");
  return true;
}

void Crew::regroup_as(const std::string& prefix, std::optional<comm::LinkModel> upload_link) {
  group_->reform(prefix, group_->rank(), group_->size(), std::move(upload_link));
  exchange_ = std::make_unique<comm::Exchange>(*group_, exchange_options_);
}

}  // namespace tributary::dipaco
