// Live healing of fault-tolerant replicas (replicas.h): a restarted worker joins at a round boundary (after an outer
// step — Streaming DiLoCo's overlapped ones when they land, so nothing is in flight — or after any data-parallel step,
// the warm-up's included) and receives everything it needs from the lead over the group — no checkpoint reload, no
// restart of the others.
// Both sides run the same collectives in the same order: re-form (Membership::admit / join), the lead's meta through
// the store, one broadcast of the state tensors and the outer state (DiLoCo's), the replica hash check on what every
// member holds alike (DiLoCo's global parameters, data parallel's parameters).
#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tributary/core/error.h"
#include "tributary/core/log.h"
#include "tributary/runtime/rendezvous.h"
#include "tributary/runtime/replicas.h"

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
  options.collective_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(config.dist.heartbeat_timeout_s * 1000));
  return options;
}

NamedTensors params_of(const HealState& state, size_t count) {
  return NamedTensors(state.tensors.begin(), state.tensors.begin() + static_cast<std::ptrdiff_t>(count));
}

}  // namespace

void Replicas::admit(const HealState& state) {
  TRIB_CHECK(quiescent(), "joiners are admitted only while no exchange is in flight");
  const std::vector<int> joiners = std::exchange(joiners_, {});
  membership_->admit(joiners);
  try {
    reducer_->follow_membership();
  } catch (const NetworkError& e) {  // a member died as the group formed: the next round drops it (a joiner whose
    // group did not form stops; its launch may restart it)
    log::warn("worker {}: admitting worker(s) {} failed ({}); the next round re-forms without the dead",
              membership_->id(), fmt::join(joiners, ", "), e.what());
    return;
  }
  admissions_ += 1;
  if (rank() == 0) {
    nlohmann::json meta = state.meta;
    meta["outer"] = progress();
    meta["rounds"] = reducer_->rounds();
    store_->set(heal_key(membership_->epoch()), meta.dump());
  }
  // The broadcast reaches every member: the others keep their own inner optimizer state (the parameters are the
  // global ones on every member after an outer step, so they are equal anyway).
  std::vector<torch::Tensor> own;
  if (rank() != 0)
    for (const auto& [name, t] : state.tensors) own.push_back(t.detach().clone());
  auto tensors = tensors_of(state.tensors, outer_state());
  try {
    thread_->run<int>([&] {
      torch::NoGradGuard no_grad;  // parameters are filled in place (grad mode is per thread)
      group_->broadcast(tensors, 0);  // rank 0 is the first old member: joiners come last
      for (size_t i = 0; i < own.size(); ++i) state.tensors[i].second.copy_(own[i]);
      return 0;
    });
    check_->now(outer_ ? outer_->globals() : params_of(state, state.num_params),
                fmt::format("after worker(s) {} joined", fmt::join(joiners, ", ")));
  } catch (const NetworkError& e) {  // a member or joiner died meanwhile: the next round finds out who, and drops it
    log::warn("worker {}: admitting worker(s) {} failed ({}); the next round re-forms without the dead",
              membership_->id(), fmt::join(joiners, ", "), e.what());
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < own.size(); ++i) state.tensors[i].second.copy_(own[i]);
    return;
  }
  if (rank() == 0)
    log::warn("worker(s) {} joined at step {}: {} worker(s) {} go on as epoch {}", fmt::join(joiners, ", "),
              state.meta.value("step", int64_t{0}), size(), fmt::join(membership_->members(), ", "),
              membership_->epoch());
}

nlohmann::json Replicas::join(NamedTensors& params, HealState state) {
  TRIB_CHECK(membership_, "only fault-tolerant replicas are joined");
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(config_.dist.store_timeout_s * 1000));
  log::info("worker {}: waiting to join the run", membership_->id());
  const comm::JoinResult joined = membership_->join(timeout);
  if (joined.kind == comm::JoinResult::kFinished) {
    log::warn("worker {}: the run finished before it could join", membership_->id());
    return {{"finished", true}};
  }
  if (joined.kind == comm::JoinResult::kOffered) return join_healed(joined.offer, params, state);
  reducer_->follow_membership();
  store_->wait({heal_key(membership_->epoch())}, timeout, "the lead did not send the joining state");
  auto meta = nlohmann::json::parse(store_->get(heal_key(membership_->epoch())));
  // The members' phase: data parallel, DiLoCo's data-parallel warm-up, or DiLoCo (whose outer state comes along).
  in_warmup_ = !ddp_ && meta.value("step", int64_t{0}) < config_.dist.warmup_ddp_steps;
  if (ddp_ || in_warmup_) {
    start_data_parallel(params);
  } else {
    start_outer_loop(params, config_.dist.warmup_ddp_steps);
  }
  auto tensors = tensors_of(state.tensors, outer_state());
  thread_->run<int>([&] {
    torch::NoGradGuard no_grad;
    group_->broadcast(tensors, 0);
    return 0;
  });
  if (outer_) outer_->adopt_progress(meta.at("outer"));
  reducer_->set_rounds(meta.at("rounds").get<int64_t>());
  check_->now(outer_ ? outer_->globals() : params, fmt::format("when worker {} joined", membership_->id()));
  log::info("worker {} joined at step {} as rank {} of {} (epoch {})", membership_->id(),
            meta.value("step", int64_t{0}), rank(), size(), membership_->epoch());
  return meta;
}

// --- Mid-round heal (DiLoCo's phase) -----------------------------------------------------------------------------
// A joiner asks; the lead, at its next step boundary with nothing in flight, writes an offer (the meta: step, tokens,
// loader position, the outer loop's progress, the next round's number, the pair group's prefix) and sends its live
// parameters, AdamW state and the outer state over a group of two on its communication thread (copies: training goes
// on meanwhile). The joiner trains on from the lead's step; before the next round's collective the lead proposes the
// members (Membership::open_round): its old self out, the healed joiner in. So a replacement contributes to the
// round in which it started, instead of waiting for a round boundary to be admitted and a whole round to train.

bool Replicas::heal_wanted() {
  // quiescent() first: with nothing in flight the communication thread does not touch the membership.
  return membership_ && outer_ && !in_warmup_ && !pending_ && quiescent() && membership_->rank() == 0 &&
         !reducer_->stop_decided() && membership_->asked();
}


void Replicas::offer_heal(const HealState& state) {
  for (const comm::JoinRequest& request : membership_->offerable()) {
    const std::string prefix = fmt::format("ft/heal-{}-{}", request.id, request.number);
    nlohmann::json meta = state.meta;
    meta["outer"] = progress();
    meta["rounds"] = reducer_->rounds();
    meta["prefix"] = prefix;
    meta["members_world"] = size();
    std::vector<torch::Tensor> copies;
    for (const auto& t : tensors_of(state.tensors, outer_state())) copies.push_back(t.detach().clone());
    membership_->offer(request, meta.dump());
    log::info("worker {}: healing worker {} at step {}; it joins at round x{}", membership_->id(), request.id,
              state.meta.value("step", int64_t{0}), reducer_->rounds());
    thread_->enqueue<int>([this, copies = std::move(copies), prefix, options = heal_group_options(config_),
                           id = request.id]() mutable {
      try {
        comm::Group pair(*store_, 0, 2, options, prefix);
        pair.broadcast(copies, 0);
        // A worker healed again (its first replacement died before the round) is proposed once, as its latest.
        healed_.erase(std::remove(healed_.begin(), healed_.end(), id), healed_.end());
        healed_.push_back(id);
      } catch (const Error& e) {  // the joiner died meanwhile: it is not proposed; its launch may restart it
        log::warn("worker {}: healing worker {} failed ({}); it is not admitted", membership_->id(), id, e.what());
      }
      return 0;
    });
  }
}

bool Replicas::open_round(const std::string& round) {
  const std::vector<int> healed = std::exchange(healed_, {});
  const bool was_pending = pending_;
  if (!membership_->open_round(round, healed)) return false;
  pending_ = false;
  if (membership_->rank() == 0)
    log::warn("worker(s) healed during the round joined at step {} (round {}): {} worker(s) {} go on as epoch {}",
              step_now_.load(), round, membership_->size(), fmt::join(membership_->members(), ", "),
              membership_->epoch());
  if (was_pending)
    log::info("worker {} joined at step {} (round {}) as rank {} of {} (epoch {})", membership_->id(),
              step_now_.load(), round, membership_->rank(), membership_->size(), membership_->epoch());
  return true;
}

nlohmann::json Replicas::join_healed(const std::string& offer, NamedTensors& params, HealState& state) {
  auto meta = nlohmann::json::parse(offer);
  start_outer_loop(params, config_.dist.warmup_ddp_steps);  // offers come in DiLoCo's phase only
  auto tensors = tensors_of(state.tensors, outer_state());
  thread_->run<int>([&] {
    torch::NoGradGuard no_grad;
    comm::Group pair(*store_, 1, 2, heal_group_options(config_), meta.at("prefix").get<std::string>());
    pair.broadcast(tensors, 0);
    return 0;
  });
  outer_->adopt_progress(meta.at("outer"));
  reducer_->set_rounds(meta.at("rounds").get<int64_t>());
  pending_ = true;
  meta["pending"] = true;
  log::info("worker {} healed from the lead at step {}: it trains on and joins at round x{}", membership_->id(),
            meta.value("step", int64_t{0}), meta.at("rounds").get<int64_t>());
  return meta;
}

}  // namespace tributary
