#include "tributary/runtime/ft/admission.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tributary/core/error.h"
#include "tributary/core/log.h"
#include "tributary/runtime/rendezvous.h"

namespace tributary {
namespace {

std::string heal_key(int epoch) { return fmt::format("ft/heal/e{}", epoch); }

std::vector<torch::Tensor> tensors_of(const NamedTensors& a, const NamedTensors& b) {
  std::vector<torch::Tensor> out;
  for (const auto& [name, t] : a) out.push_back(t);
  for (const auto& [name, t] : b) out.push_back(t);
  return out;
}

// The group of two a mid-round heal travels over: a dead peer is given up after a heartbeat deadline, not a
// collective's.
comm::GroupOptions heal_group_options(const RunConfig& config) {
  auto options = group_options(config);
  options.collective_timeout = std::chrono::milliseconds(static_cast<int64_t>(config.dist.heartbeat_timeout_s * 1000));
  return options;
}

// The robust rule's verdicts in a heal's meta (the sealed store): a joiner that did not hold them would accept an
// evicted participant's update, or rate one afresh, and apply another aggregate than the members.
nlohmann::json verdicts_json(const ResilientAverage& reducer) {
  const auto v = reducer.verdicts();
  if (!v) return nullptr;
  nlohmann::json out = {{"exchanges", v->exchanges},
                        {"evicted", nlohmann::json::object()},
                        {"strikes", nlohmann::json::object()},
                        {"ratings", nlohmann::json::object()}};
  for (const auto& [id, why] : v->evicted) out["evicted"][std::to_string(id)] = why;
  for (const auto& [id, n] : v->strikes) out["strikes"][std::to_string(id)] = n;
  for (const auto& [id, r] : v->ratings) out["ratings"][std::to_string(id)] = r;
  return out;
}

void adopt_verdicts(ResilientAverage& reducer, const nlohmann::json& meta) {
  const auto& j = meta.value("verdicts", nlohmann::json());
  if (j.is_null() || !reducer.verdicts()) return;
  RobustAggregate::Verdicts v;
  v.exchanges = j.at("exchanges").get<int64_t>();
  for (const auto& [id, why] : j.at("evicted").items()) v.evicted[std::stoi(id)] = why.get<std::string>();
  for (const auto& [id, n] : j.at("strikes").items()) v.strikes[std::stoi(id)] = n.get<int>();
  for (const auto& [id, r] : j.at("ratings").items()) v.ratings[std::stoi(id)] = r.get<double>();
  reducer.adopt_verdicts(std::move(v));
}

NamedTensors params_of(const HealState& state, size_t count) {
  return NamedTensors(state.tensors.begin(), state.tensors.begin() + static_cast<std::ptrdiff_t>(count));
}

}  // namespace

Admission::Admission(const RunConfig& config, comm::Membership& membership, comm::Store store, ReplicaChannel channel,
                     HealableRounds& sync)
    : config_(config), membership_(membership), store_(std::move(store)), channel_(channel), sync_(sync) {
  if (const auto key = comm::invocation_key(store_)) mac_.emplace(*key);
}

void Admission::seal_state(nlohmann::json& meta, const std::vector<torch::Tensor>& tensors,
                           const std::string& place) const {
  if (mac_) meta["state_mac"] = mac_->tag_hex(tensors, place);
}

void Admission::check_state(const nlohmann::json& meta, const std::vector<torch::Tensor>& tensors,
                            const std::string& place) const {
  if (!mac_ || (meta.contains("state_mac") && meta.at("state_mac") == mac_->tag_hex(tensors, place))) return;
  throw NetworkError(fmt::format(
      "{} {}: the state the lead sent to heal it ({}) does not carry the run's MAC: it was changed in flight "
      "(someone on the path between the workers) or sent by a process without the run's secret. Nothing of it is "
      "used; the worker stops and its launch may restart it (docs/distributed.md, threat model)",
      membership_.noun(), membership_.id(), place));
}

void Admission::round_ended() { joiners_ = channel_.reducer.take_joiners(); }

bool Admission::settle(const std::string& round) {
  if (pending_ || membership_.members().empty()) return false;  // a joiner not admitted yet takes no part
  TRIB_CHECK(sync_.quiescent(), "the members settle only while no exchange is in flight");
  return channel_.thread.run<bool>([&] { return channel_.reducer.settle(round); });
}

void Admission::admit(const HealState& state) {
  TRIB_CHECK(sync_.quiescent(), "joiners are admitted only while no exchange is in flight");
  const std::vector<int> joiners = std::exchange(joiners_, {});
  membership_.admit(joiners);
  try {
    channel_.reducer.follow_membership();
  } catch (const NetworkError& e) {  // a member died as the group formed: the next round drops it (a joiner whose
    // group did not form stops; its launch may restart it)
    log::warn("{0} {1}: admitting {0}(s) {2} failed ({3}); the next round re-forms without the dead",
              membership_.noun(), membership_.id(), fmt::join(joiners, ", "), e.what());
    return;
  }
  admissions_ += 1;
  auto tensors = tensors_of(state.tensors, sync_.outer_state());
  if (rank() == 0) {
    nlohmann::json meta = state.meta;
    meta["outer"] = sync_.progress();
    meta["rounds"] = channel_.reducer.rounds();
    meta["verdicts"] = verdicts_json(channel_.reducer);
    seal_state(meta, tensors, heal_key(membership_.epoch()));
    store_.set(heal_key(membership_.epoch()), meta.dump());
  }
  // The broadcast reaches every member: the others keep what they hold (their own inner optimizer state; the
  // parameters and the outer state are the global ones on every member after an outer step, equal anyway), so
  // nothing a stranger changes on the way to them is used.
  std::vector<torch::Tensor> own;
  if (rank() != 0)
    for (const auto& t : tensors) own.push_back(t.detach().clone());
  try {
    channel_.thread.run<int>([&] {
      torch::NoGradGuard no_grad;            // parameters are filled in place (grad mode is per thread)
      channel_.group.broadcast(tensors, 0);  // rank 0 is the first old member: joiners come last
      for (size_t i = 0; i < own.size(); ++i) tensors[i].copy_(own[i]);
      return 0;
    });
    sync_.check_identical(params_of(state, state.num_params),
                          fmt::format("after {}(s) {} joined", membership_.noun(), fmt::join(joiners, ", ")));
  } catch (const NetworkError& e) {  // a member or joiner died meanwhile: the next round finds out who, and drops it
    log::warn("{0} {1}: admitting {0}(s) {2} failed ({3}); the next round re-forms without the dead",
              membership_.noun(), membership_.id(), fmt::join(joiners, ", "), e.what());
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < own.size(); ++i) tensors[i].copy_(own[i]);
    return;
  }
  if (rank() == 0)
    log::warn("{}(s) {} joined at step {}: {} {}(s) {} go on as epoch {}", membership_.noun(), fmt::join(joiners, ", "),
              state.meta.value("step", int64_t{0}), channel_.group.size(), membership_.noun(),
              fmt::join(membership_.members(), ", "), membership_.epoch());
}

nlohmann::json Admission::join(NamedTensors& params, HealState state) {
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(config_.dist.store_timeout_s * 1000));
  log::info("{} {}: waiting to join the run", membership_.noun(), membership_.id());
  const comm::JoinResult joined = membership_.join(timeout);
  if (joined.kind == comm::JoinResult::kFinished) {
    log::warn("{} {}: the run finished before it could join", membership_.noun(), membership_.id());
    return {{"finished", true}};
  }
  if (joined.kind == comm::JoinResult::kOffered) return join_healed(joined.offer, params, state);
  channel_.reducer.follow_membership();
  store_.wait({heal_key(membership_.epoch())}, timeout, "the lead did not send the joining state");
  auto meta = nlohmann::json::parse(store_.get(heal_key(membership_.epoch())));
  // The members' phase: data parallel, DiLoCo's data-parallel warm-up, or DiLoCo (whose outer state comes along).
  sync_.enter(meta.value("step", int64_t{0}), params);
  auto tensors = tensors_of(state.tensors, sync_.outer_state());
  channel_.thread.run<int>([&] {
    torch::NoGradGuard no_grad;
    channel_.group.broadcast(tensors, 0);
    return 0;
  });
  check_state(meta, tensors, heal_key(membership_.epoch()));
  sync_.adopt_progress(meta.at("outer"));
  channel_.reducer.set_rounds(meta.at("rounds").get<int64_t>());
  adopt_verdicts(channel_.reducer, meta);
  sync_.check_identical(params, fmt::format("when {} {} joined", membership_.noun(), membership_.id()));
  log::info("{} {} joined at step {} as rank {} of {} (epoch {})", membership_.noun(), membership_.id(),
            meta.value("step", int64_t{0}), rank(), channel_.group.size(), membership_.epoch());
  return meta;
}

// --- Mid-round heal (DiLoCo's phase) -----------------------------------------------------------------------------
// A joiner asks; the lead, at its next step boundary with nothing in flight, writes an offer (the meta: step, tokens,
// loader position, the outer loop's progress, the next round's number, the pair group's prefix) and sends its live
// parameters, AdamW state and the outer state over a group of two on its communication thread (copies: training goes
// on meanwhile). The joiner trains on from the lead's step; before the next round's collective the lead proposes the
// members (Membership::start_round): its old self out, the healed joiner in. So a replacement contributes to the
// round in which it started, instead of waiting for a round boundary to be admitted and a whole round to train.

bool Admission::heal_wanted() {
  // quiescent() first: with nothing in flight the communication thread does not touch the membership.
  return sync_.diloco_phase() && !pending_ && sync_.quiescent() && membership_.rank() == 0 &&
         !channel_.reducer.stop_decided() && membership_.asked();
}

std::vector<int> Admission::offer_heal(const HealState& state) {
  std::vector<int> offered;
  for (const comm::JoinRequest& request : membership_.offerable()) {
    offered.push_back(request.id);
    const std::string prefix = fmt::format("ft/heal-{}-{}", request.id, request.number);
    nlohmann::json meta = state.meta;
    meta["outer"] = sync_.progress();
    meta["rounds"] = channel_.reducer.rounds();
    meta["prefix"] = prefix;
    meta["members_world"] = channel_.group.size();
    meta["verdicts"] = verdicts_json(channel_.reducer);
    std::vector<torch::Tensor> copies;
    for (const auto& t : tensors_of(state.tensors, sync_.outer_state())) copies.push_back(t.detach().clone());
    seal_state(meta, copies, prefix);
    membership_.offer(request, meta.dump());
    log::info("{0} {1}: healing {0} {2} at step {3}; it joins at round x{4}", membership_.noun(), membership_.id(),
              request.id, state.meta.value("step", int64_t{0}), channel_.reducer.rounds());
    channel_.thread.enqueue<int>(
        [this, copies = std::move(copies), prefix, options = heal_group_options(config_), id = request.id]() mutable {
          try {
            comm::Group pair(store_, 0, 2, options, prefix);
            pair.broadcast(copies, 0);
            // A worker healed again (its first replacement died before the round) is proposed once, as its latest.
            healed_.erase(std::remove(healed_.begin(), healed_.end(), id), healed_.end());
            healed_.push_back(id);
          } catch (const Error& e) {  // the joiner died meanwhile: it is not proposed; its launch may restart it
            log::warn("{0} {1}: healing {0} {2} failed ({3}); it is not admitted", membership_.noun(), membership_.id(),
                      id, e.what());
          }
          return 0;
        });
  }
  return offered;
}

bool Admission::start_round(const std::string& round) {
  const std::vector<int> healed = std::exchange(healed_, {});
  const bool was_pending = pending_;
  if (!membership_.start_round(round, healed)) return false;
  pending_ = false;
  if (membership_.rank() == 0)
    log::warn("{0}(s) healed during the round joined at step {1} (round {2}): {3} {0}(s) {4} go on as epoch {5}",
              membership_.noun(), sync_.step_now(), round, membership_.size(), fmt::join(membership_.members(), ", "),
              membership_.epoch());
  if (was_pending)
    log::info("{} {} joined at step {} (round {}) as rank {} of {} (epoch {})", membership_.noun(), membership_.id(),
              sync_.step_now(), round, membership_.rank(), membership_.size(), membership_.epoch());
  return true;
}

nlohmann::json Admission::join_healed(const std::string& offer, NamedTensors& params, HealState& state) {
  auto meta = nlohmann::json::parse(offer);
  sync_.enter(meta.value("step", int64_t{0}), params);
  TRIB_CHECK(sync_.diloco_phase(), "heals are offered in DiLoCo's phase only");
  auto tensors = tensors_of(state.tensors, sync_.outer_state());
  channel_.thread.run<int>([&] {
    torch::NoGradGuard no_grad;
    comm::Group pair(store_, 1, 2, heal_group_options(config_), meta.at("prefix").get<std::string>());
    pair.broadcast(tensors, 0);
    return 0;
  });
  check_state(meta, tensors, meta.at("prefix").get<std::string>());
  sync_.adopt_progress(meta.at("outer"));
  channel_.reducer.set_rounds(meta.at("rounds").get<int64_t>());
  adopt_verdicts(channel_.reducer, meta);
  pending_ = true;
  meta["pending"] = true;
  log::info("{} {} healed from the lead at step {}: it trains on and joins at round x{}", membership_.noun(),
            membership_.id(), meta.value("step", int64_t{0}), meta.at("rounds").get<int64_t>());
  return meta;
}

}  // namespace tributary
