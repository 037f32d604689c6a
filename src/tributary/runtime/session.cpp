#include "tributary/runtime/session.h"

#include <algorithm>
#include <map>
#include <numeric>

#include "tributary/runtime/rendezvous.h"
#include "tributary/runtime/wan.h"

namespace tributary {
namespace {

std::vector<int> every_rank(int world_size) {  // rank r emulates device r
  std::vector<int> ranks(static_cast<size_t>(std::max(world_size, 0)));
  std::iota(ranks.begin(), ranks.end(), 0);
  return ranks;
}

}  // namespace

Session::Session(const RunConfig& config, const DistEnv& env, const std::vector<int>& device_of_rank)
    : config_(config),
      env_(env),
      store_(env.distributed() ? rendezvous(config, env, &identity_) : comm::Store::in_memory()),
      links_(wan_link_model_or_none(config.dist.wan, device_of_rank)) {}

Session::Session(const RunConfig& config, const DistEnv& env) : Session(config, env, every_rank(env.world_size)) {}

std::shared_ptr<comm::MessageSigner> Session::membership_signer(int self, std::function<int(int)> rank_of) const {
  if (!identity_) return nullptr;
  std::vector<std::string> admitted;
  if (!config_.dist.admission.empty()) admitted = comm::read_admission_list(config_.dist.admission);
  if (!rank_of) rank_of = [](int id) { return id; };
  // The signer keeps every key it saw (comm/signed_messages.h); published_key's pins are not kept between calls. Its
  // reads take a connection of their own: the session's may be held by a long wait of the main thread.
  return std::make_shared<comm::MessageSigner>(identity_, self < 0 ? env_.rank : self,
                                               [store = reconnect(), admitted, rank_of](int id) mutable {
                                                 const int rank = rank_of(id);
                                                 if (rank < 0) return std::string();  // no such member
                                                 std::map<int, std::string> pins;
                                                 return published_key(store, admitted, rank, pins);
                                               });
}

comm::Store Session::reconnect(const std::string& scope) const {
  if (!env_.distributed()) return store_;  // one process: its in-memory store is the only one
  return connect_scope(config_, env_, scope);
}

std::optional<comm::LinkModel> Session::links_among(const std::vector<int>& ranks) const {
  if (!links_) return std::nullopt;
  return links_->subset(ranks);
}

comm::GroupOptions Session::group_options(const std::vector<int>& ranks) const {
  comm::GroupOptions options = tributary::group_options(config_);
  if (!ranks.empty()) options.link = links_among(ranks);
  return options;
}

}  // namespace tributary
