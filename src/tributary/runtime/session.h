// One process's connection to its run, made once at the start: the rendezvous on the run's store (runtime/
// rendezvous.h: world size and resolved configs agreed, or refused naming the ranks), the emulated WAN links of
// dist.wan resolved over the layout's devices, and the groups' options from the config. Every group of the run — the
// replicas', the pipelines' and their stages', the islands' and their outer shards', DiPaCo's crew — is formed over a
// session, so none of them connects, checks configs or reads dist.wan itself. One process (no rendezvous) has an
// in-memory store and no links.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tributary/comm/group.h"
#include "tributary/comm/identity.h"
#include "tributary/comm/link_model.h"
#include "tributary/comm/signed_messages.h"
#include "tributary/comm/store.h"
#include "tributary/config/run_config.h"
#include "tributary/launch/dist_env.h"

namespace tributary {

class Session {
 public:
  // `device_of_rank`: the cluster device each rank emulates (Layout::device_of_rank(); rank r is device r unless a
  // placement says otherwise). Collective over the run's ranks when distributed.
  Session(const RunConfig& config, const DistEnv& env, const std::vector<int>& device_of_rank);
  // Every rank is its own device.
  Session(const RunConfig& config, const DistEnv& env);

  const RunConfig& config() const { return config_; }
  const DistEnv& env() const { return env_; }
  // The run's store: the connection the rendezvous made (the run's keys), shared by every group formed over it.
  const comm::Store& store() const { return store_; }
  // A connection of its own to the run's store, for a thread that must not queue behind the others (a heartbeat, a
  // state server), or one under `scope` of the run's keys (kIslandsScope).
  comm::Store reconnect(const std::string& scope = "") const;

  // The emulated links between every pair of ranks; none without dist.wan.
  const std::optional<comm::LinkModel>& links() const { return links_; }
  // The links among `ranks`, in that order (a group's view of them); none without dist.wan.
  std::optional<comm::LinkModel> links_among(const std::vector<int>& ranks) const;
  // A group's options: dist.collective_timeout_s, and the emulated links among `ranks` (none: no emulated link).
  comm::GroupOptions group_options(const std::vector<int>& ranks = {}) const;
  // This participant's identity as published at the rendezvous (runtime/rendezvous.h, publish_identity); null
  // without one.
  const std::shared_ptr<const comm::Identity>& identity() const { return identity_; }
  // What signs this participant's membership messages and checks the others' with the keys they published
  // (dist.admission's list applied); null without an identity. The members' ids are launch ranks, or — for a quorum
  // of islands or pipelines — `self` is this process's member id and `rank_of(id)` the rank that speaks for member id
  // (-1: no such member).
  std::shared_ptr<comm::MessageSigner> membership_signer(int self = -1,
                                                         std::function<int(int)> rank_of = nullptr) const;

 private:
  RunConfig config_;
  DistEnv env_;
  std::shared_ptr<const comm::Identity> identity_;  // before store_: the rendezvous that makes store_ fills it
  comm::Store store_;
  std::optional<comm::LinkModel> links_;
};

}  // namespace tributary
