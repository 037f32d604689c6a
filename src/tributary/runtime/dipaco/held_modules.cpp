#include "tributary/runtime/dipaco/held_modules.h"

#include <algorithm>
#include <numeric>

#include "tributary/core/error.h"
#include "tributary/core/hash.h"
#include "tributary/optim/module_owners.h"
#include "tributary/optim/module_ring.h"

namespace tributary {

HeldModules::HeldModules(const RunConfig& config, const PathGrid& grid, int rank, int world, ModuleSet initial,
                         std::optional<comm::LinkModel> links)
    : config_(config),
      grid_(grid),
      rank_(rank),
      world_(world),
      links_(std::move(links)),
      module_ids_(grid.modules()),
      members_(size_t(world)),
      global_(std::move(initial)),
      loop_(OuterLoopOptions{.inner_steps = config.dist.inner_steps,
                             .outer = {config.dist.outer_lr, config.dist.outer_momentum},
                             .norm_rescale = config.dipaco.norm_rescale}) {
  loop_.start_owned(module_ids_.size(), 0);
  std::iota(members_.begin(), members_.end(), 0);
  for (const auto& [id, tensors] : global_)
    for (const auto& [name, t] : tensors) {
      layout_[id].push_back(name);
      numel_[id] += t.numel();
    }
}

int HeldModules::owner_of(size_t module) const {
  const int first = static_cast<int>(module % size_t(world_));
  if (std::find(members_.begin(), members_.end(), first) != members_.end()) return first;
  return members_[module % members_.size()];
}

int HeldModules::group_rank_of(int worker) const {
  return static_cast<int>(std::find(members_.begin(), members_.end(), worker) - members_.begin());
}

bool HeldModules::owns(const std::string& id) const {
  const size_t i = size_t(std::find(module_ids_.begin(), module_ids_.end(), id) - module_ids_.begin());
  return i < module_ids_.size() && loop_.owned(i) != nullptr;
}

std::map<std::string, OuterOptimizer*> HeldModules::own(int64_t round) {
  std::map<std::string, OuterOptimizer*> taken;
  for (size_t i = 0; i < module_ids_.size(); ++i) {
    const std::string& id = module_ids_[i];
    if (owner_of(i) != rank_) {
      // A module this worker stood in for goes back to its owner (a rejoined worker), or on to another member (the
      // members changed again): one owner steps it and writes its outer state. Path-local: from now on fetched.
      if (loop_.owned(i) && depot_) global_.erase(id);
      loop_.disown(i);
      continue;
    }
    if (loop_.owned(i)) continue;
    // Path-local: a dead owner's module as it published it for this round.
    if (!global_.count(id)) global_[id] = depot_->fetch(round, id, layout_.at(id), 0, 0);
    loop_.own(i, global_.at(id));
    taken[id] = loop_.owned(i);
  }
  return taken;
}

std::map<std::string, OuterOptimizer*> HeldModules::outer() const {
  std::map<std::string, OuterOptimizer*> out;
  for (size_t i = 0; i < module_ids_.size(); ++i)
    if (OuterOptimizer* opt = loop_.owned(i)) out[module_ids_[i]] = opt;
  return out;
}

void HeldModules::go_path_local(const comm::Store& store, std::chrono::milliseconds fetch_timeout, int64_t round) {
  const auto& d = config_.dist;
  if (d.compression == "sparseloco")  // stateful: the payloads are ModuleFeedback's, codec_ stays unused
    feedback_ = std::make_unique<ModuleFeedback>(
        comm::SparseChunkOptions{.chunk = d.sparse_chunk, .k = d.sparse_topk, .bits = static_cast<int>(d.sparse_bits)},
        d.error_feedback_decay);
  codec_ =
      comm::make_codec(feedback_ ? "fp32" : d.compression, static_cast<uint64_t>(config_.train.seed) + uint64_t(rank_));
  depot_ = std::make_unique<ModuleDepot>(store, config_.dipaco.fetch_codec, fetch_timeout);
  depot_->set_link(link());
  publish_owned(round);
  for (auto it = global_.begin(); it != global_.end();)  // from here on, only what this worker owns
    it = owns(it->first) ? std::next(it) : global_.erase(it);
}

std::map<std::string, OuterOptimizer*> HeldModules::set_members(std::vector<int> members, int64_t round) {
  members_ = std::move(members);
  if (depot_) depot_->set_link(link());
  return own(round);
}

std::optional<comm::LinkModel> HeldModules::link() const {
  if (links_ && members_.size() != size_t(world_)) return links_->subset(members_);
  return links_;
}

ModuleSet HeldModules::path_view(int64_t p, int64_t round) {
  ModuleSet view;
  for (const auto& id : grid_.modules_of_path(p)) {
    if (global_.count(id)) {
      view[id] = global_.at(id);
      continue;
    }
    const size_t i = size_t(std::find(module_ids_.begin(), module_ids_.end(), id) - module_ids_.begin());
    view[id] = depot_->fetch(round, id, layout_.at(id), group_rank_of(owner_of(i)), group_rank_of(rank_));
  }
  return view;
}

ModuleSet HeldModules::all(int64_t round) {
  ModuleSet all = global_;
  for (const auto& id : module_ids_)
    if (!all.count(id)) all[id] = depot_->fetch(round, id, layout_.at(id), 0, 0);
  return all;
}

std::vector<int64_t> HeldModules::numel_by_index() const {
  std::vector<int64_t> out;
  for (const auto& id : module_ids_) out.push_back(numel_.at(id));
  return out;
}

int64_t HeldModules::numel(const std::vector<std::string>& ids) const {
  int64_t n = 0;
  for (const auto& id : ids) n += numel_.at(id);
  return n;
}

void HeldModules::check_identical(comm::Group& group, const std::string& when) const {
  Hasher h;
  for (const auto& [id, tensors] : global_) hash_tensors(h, tensors);
  auto all = group.all_gather(torch::tensor({static_cast<int64_t>(h.digest())}, torch::kInt64));
  for (size_t r = 1; r < all.size(); ++r)
    if (all[r].item<int64_t>() != all[0].item<int64_t>())
      fail("DiPaCo workers hold different global modules {} (worker {} vs {}); this is a bug or a corrupted exchange",
           when, members_[r], members_[0]);
}

void HeldModules::publish_owned(int64_t round) {
  for (const auto& [id, opt] : outer()) global_[id] = depot_->publish(round, id, opt->global());
}

std::pair<double, double> HeldModules::reduce(int64_t round, int64_t step,
                                              const std::map<std::string, ModuleAccumulator>& accumulated,
                                              comm::Group& group, comm::Exchange& exchange, ExchangeGate gate) {
  std::vector<int> owner;
  std::vector<const ModuleAccumulator*> contributions;
  for (size_t i = 0; i < module_ids_.size(); ++i) {
    owner.push_back(group_rank_of(owner_of(i)));
    const auto it = accumulated.find(module_ids_[i]);
    contributions.push_back(it == accumulated.end() ? nullptr : &it->second);
  }
  if (!depot_) {
    std::vector<NamedTensors*> replicas;
    for (const auto& id : module_ids_) replicas.push_back(&global_.at(id));
    OwnerRing ring(group, exchange, std::move(replicas));
    loop_.sync_owned(step, contributions, owner, ring);
    auto stats = exchange.take_stats();
    modelled_s_ = stats.modelled_s;
    return {stats.bytes_sent, stats.bytes_recv};
  }
  OwnerUpload upload(group, *codec_, feedback_.get(), std::move(gate), exchange.mac(),
                     fmt::format("{}|owners|round{}", group.prefix(), round));
  loop_.sync_owned(step, contributions, owner, upload);
  const OwnerUploadBytes bytes = upload.bytes();
  // Everyone has sent and received: nobody fetches this round's values any more.
  for (const auto& [id, opt] : outer()) depot_->forget(round, id);
  publish_owned(round + 1);
  return {bytes.sent + bytes.control, bytes.recv};
}

}  // namespace tributary
