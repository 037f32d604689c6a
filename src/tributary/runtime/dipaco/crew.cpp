#include "tributary/runtime/dipaco/crew.h"

#include <fmt/format.h>

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
  comm::GroupOptions group_opts = session.group_options();
  group_opts.link = std::move(upload_link);
  group_ = std::make_unique<comm::Group>(*store_, env.rank, env.world_size, group_opts, "dipaco/g0");
  exchange_options_.mac_key = comm::invocation_key(*store_);  // this invocation's MACs
  exchange_ = std::make_unique<comm::Exchange>(*group_, exchange_options_);
  queue_ = std::make_unique<TaskQueue>(*store_, env.rank);
  // A round waits for a slow worker as long as its heartbeat beats (up to dist.collective_timeout_s).
  membership_ = std::make_unique<comm::Membership>(*store_, heartbeat_store, env.rank, env.world_size,
                                                   config.dist.heartbeat_timeout_s, false,
                                                   session.group_options().collective_timeout);
}

std::optional<Departure> Crew::settle(int64_t round, int64_t gen, const std::vector<int64_t>& round_tasks) {
  if (membership_->decide(fmt::format("dipaco-r{}g{}", round, gen), true, false).commit) return std::nullopt;
  Departure departure;
  departure.left = membership_->reform();
  departure.lost = queue_->lost(round, round_tasks, membership_->members());
  return departure;
}

void Crew::regroup(std::optional<comm::LinkModel> upload_link, std::optional<comm::LinkModel> ring_link) {
  group_->reform(membership_->group_prefix() + "/dipaco", membership_->rank(), membership_->size(),
                 std::move(upload_link));
  exchange_options_.link = std::move(ring_link);
  exchange_ = std::make_unique<comm::Exchange>(*group_, exchange_options_);
}

void Crew::regroup_as(const std::string& prefix, std::optional<comm::LinkModel> upload_link) {
  group_->reform(prefix, group_->rank(), group_->size(), std::move(upload_link));
  exchange_ = std::make_unique<comm::Exchange>(*group_, exchange_options_);
}

}  // namespace tributary::dipaco
