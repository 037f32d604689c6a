#include "tributary/runtime/dipaco/crew.h"

#include <fmt/format.h>

#include <chrono>

#include "tributary/comm/wire_mac.h"
#include "tributary/runtime/rendezvous.h"
#include "tributary/runtime/wan.h"

namespace tributary::dipaco {

Crew::Crew(const RunConfig& config, const DistEnv& env, std::optional<comm::LinkModel> upload_link)
    : exchange_options_{.codec = config.dist.compression,
                        .bucket_mb = config.dist.bucket_mb,
                        .link = wan_link_model_or_none(config.dist.wan, env.world_size),
                        .seed = static_cast<uint64_t>(config.train.seed)} {
  using std::chrono::milliseconds;
  std::optional<comm::Store> heartbeat_store;
  if (env.distributed()) {
    store_ = rendezvous(config, env);
    heartbeat_store = comm::Store::connect(env.master_addr, env.master_port, env.rank, env.world_size, true,
                                           env.store_prefix + "/tributary",
                                           milliseconds(int64_t(config.dist.store_timeout_s * 1000)));
  } else {
    store_ = heartbeat_store = comm::Store::in_memory();
  }
  comm::GroupOptions group_opts = group_options(config);
  group_opts.link = std::move(upload_link);
  group_ = std::make_unique<comm::Group>(*store_, env.rank, env.world_size, group_opts, "dipaco/g0");
  exchange_options_.mac_key = comm::invocation_key(*store_);  // this invocation's MACs
  exchange_ = std::make_unique<comm::Exchange>(*group_, exchange_options_);
  queue_ = std::make_unique<TaskQueue>(*store_, env.rank);
  // A round waits for a slow worker as long as its heartbeat beats (up to dist.collective_timeout_s).
  quorum_ = std::make_unique<comm::Membership>(*store_, *heartbeat_store, env.rank, env.world_size,
                                               config.dist.heartbeat_timeout_s, false,
                                               group_options(config).collective_timeout);
}

std::optional<Departure> Crew::settle(int64_t round, int64_t gen, const std::vector<int64_t>& round_tasks) {
  if (quorum_->decide(fmt::format("dipaco-r{}g{}", round, gen), true, false).commit) return std::nullopt;
  Departure departure;
  departure.left = quorum_->reform();
  departure.lost = queue_->lost(round, round_tasks, quorum_->members());
  return departure;
}

void Crew::regroup(std::optional<comm::LinkModel> upload_link, std::optional<comm::LinkModel> ring_link) {
  group_->reform(quorum_->group_prefix() + "/dipaco", quorum_->rank(), quorum_->size(), std::move(upload_link));
  exchange_options_.link = std::move(ring_link);
  exchange_ = std::make_unique<comm::Exchange>(*group_, exchange_options_);
}

void Crew::regroup_as(const std::string& prefix, std::optional<comm::LinkModel> upload_link) {
  group_->reform(prefix, group_->rank(), group_->size(), std::move(upload_link));
  exchange_ = std::make_unique<comm::Exchange>(*group_, exchange_options_);
}

}  // namespace tributary::dipaco
