#include "tributary/optim/outer_loop.h"

#include <cmath>

#include <fmt/format.h>

#include "tributary/core/error.h"
#include "tributary/model/param_name.h"

namespace tributary {

OuterLoop::OuterLoop(const OuterLoopOptions& options, Reducer& reducer)
    : options_(options), reducer_(&reducer), length_(options.inner_steps, options.ramp_steps, options.qsr_alpha) {}

OuterLoop::OuterLoop(const OuterLoopOptions& options)
    : options_(options), reducer_(nullptr), length_(options.inner_steps, options.ramp_steps, options.qsr_alpha) {}

NamedTensors OuterLoop::subset(const NamedTensors& params, const SyncUnit& u) const {
  NamedTensors out;
  for (size_t i : u.params) out.push_back(params[i]);
  return out;
}

void OuterLoop::start(NamedTensors& params, int64_t offset) {
  const int64_t num_fragments = options_.fragments;
  start_ = offset;
  units_.clear();
  units_.resize(static_cast<size_t>(num_fragments));
  // Blocks strided over the fragments; everything outside the blocks (embeddings, final norm, head) in fragment 0.
  for (size_t i = 0; i < params.size(); ++i) {
    const auto place = parse_param_name(params[i].first);
    const int64_t block = place ? place->model_block(options_.blocks_per_level) : -1;
    const int64_t f = block >= 0 ? block % num_fragments : 0;
    units_[size_t(f)].params.push_back(i);
  }
  for (int64_t f = 0; f < num_fragments; ++f) {
    auto& u = units_[size_t(f)];
    if (u.params.empty())
      fail("dist.fragments = {} but fragment {} holds no parameters (the model has {} blocks); use fewer fragments",
           num_fragments, f, options_.num_layers);
    u.outer = std::make_unique<OuterOptimizer>(subset(params, u), options_.outer);
    u.last_sync = offset + f * options_.inner_steps / num_fragments;  // first sync H steps later
  }
}

void OuterLoop::start_owned(size_t num_units, int64_t offset) {
  units_.clear();
  units_.resize(num_units);
  start_ = offset;
  for (auto& u : units_) u.last_sync = offset;
}

void OuterLoop::own(size_t unit, const NamedTensors& global) {
  units_.at(unit).outer = std::make_unique<OuterOptimizer>(global, options_.outer);
}

const NamedTensors& OuterLoop::owner_step(size_t unit, const std::vector<torch::Tensor>& sum, double weight,
                                          int64_t count) {
  OuterOptimizer& outer = *units_[unit].outer;
  // count 0: every path through the unit was dropped; the unit keeps its global parameters.
  if (count > 0) outer.apply(finalize(sum, weight, count, options_.norm_rescale));
  return outer.global();
}

void OuterLoop::sync_owned(int64_t step, const std::vector<const ModuleAccumulator*>& contributions,
                           const std::vector<int>& owner, OwnerReducer& reducer) {
  TRIB_CHECK_EQ(contributions.size(), units_.size(), "(contributions per unit)");
  TRIB_CHECK_EQ(owner.size(), units_.size(), "(owners per unit)");
  OwnedRound round{contributions,
                   owner,
                   {},
                   [this](size_t unit, const std::vector<torch::Tensor>& sum, double weight,
                          int64_t count) -> const NamedTensors& { return owner_step(unit, sum, weight, count); }};
  for (const auto& u : units_) round.owned.push_back(u.outer ? &u.outer->global() : nullptr);
  reducer.reduce(round);
  for (auto& u : units_) u.last_sync = step;
}

void OuterLoop::load(const safetensors::File& outer, const nlohmann::json& progress) {
  // dist.fragments is part of the config a resume must match, and outer.safetensors is written with them
  TRIB_CHECK_EQ(progress.size(), units_.size(), "(fragments in the checkpoint vs the run)");
  for (size_t f = 0; f < units_.size(); ++f) {
    units_[f].last_sync = progress[f].at("last_sync").get<int64_t>();
    units_[f].outer->load_state(outer, progress[f].at("outer_steps").get<int64_t>());
  }
}

void OuterLoop::adopt_progress(const nlohmann::json& progress) {
  TRIB_CHECK_EQ(progress.size(), units_.size(), "(fragments of the lead vs this replica)");
  for (size_t f = 0; f < units_.size(); ++f) {
    units_[f].last_sync = progress[f].at("last_sync").get<int64_t>();
    units_[f].outer->set_num_steps(progress[f].at("outer_steps").get<int64_t>());
  }
}

void OuterLoop::send(SyncUnit& u, int64_t step, NamedTensors& params, int64_t overlap_steps) {
  TRIB_CHECK(reducer_ != nullptr, "units with owners sync through sync_owned()");
  u.pending = reducer_->start(u.outer->pseudo_gradient(subset(params, u)), static_cast<int>(&u - units_.data()));
  u.apply_step = step + overlap_steps;
  u.merge = overlap_steps > 0;
  u.last_sync = step;
}

void OuterLoop::land(size_t index, NamedTensors& params) {
  SyncUnit& u = units_[index];
  auto averaged = reducer_->wait(std::move(u.pending));  // rethrows a failed exchange
  u.apply_step = -1;
  auto local = subset(params, u);
  torch::NoGradGuard no_grad;
  if (!u.merge) {
    u.outer->step(averaged, local);  // every replica continues from the new global parameters
  } else {
    // The replicas trained tau more steps meanwhile: merge them with the new global parameters.
    u.outer->apply(averaged);
    const double a = options_.merge_alpha;
    for (size_t i = 0; i < local.size(); ++i) {
      auto& p = local[i].second;
      p.mul_(a).add_(u.outer->global()[i].second.to(p.device(), p.scalar_type()), 1.0 - a);
    }
  }
  if (landed_) landed_(u.outer->global(), fmt::format("after outer step {}", outer_steps()), u.merge);
}

bool OuterLoop::after_step(int64_t step, double lr, NamedTensors& params) {
  length_.observe_lr(lr);
  bool landed = false;
  for (size_t f = 0; f < units_.size(); ++f) {
    auto& u = units_[f];
    if (lands_at(u, step)) {
      land(f, params);
      landed = true;
    }
    if (sends_at(u, step, length_)) {
      send(u, step, params, options_.overlap_steps);
      if (!u.merge) {
        land(f, params);
        landed = true;
      }
    }
  }
  return landed;
}

bool OuterLoop::due(int64_t step, double lr, bool last) const {
  RoundLength length = length_;  // as after_step leaves it once it has seen this step's learning rate
  length.observe_lr(lr);
  for (const auto& u : units_) {
    if (lands_at(u, step) || sends_at(u, step, length)) return true;
    if (last && (u.in_flight() || step > u.last_sync)) return true;  // finish()
  }
  return false;
}

bool OuterLoop::lands_at(const SyncUnit& u, int64_t step) const { return u.in_flight() && step >= u.apply_step; }

bool OuterLoop::sends_at(const SyncUnit& u, int64_t step, const RoundLength& length) const {
  return !u.in_flight() && step - u.last_sync >= length.of_round(u.last_sync - start_);
}

bool OuterLoop::finish(int64_t step, NamedTensors& params) {
  bool landed = false;
  for (size_t f = 0; f < units_.size(); ++f) {
    auto& u = units_[f];
    if (u.in_flight()) {
      land(f, params);
      landed = true;
    }
    if (step > u.last_sync) {  // pending inner steps: one last synchronous outer step
      send(u, step, params, /*overlap_steps=*/0);
      land(f, params);
      landed = true;
    }
  }
  return landed;
}

int64_t OuterLoop::inner_steps_now() const {
  return units_.empty() ? length_.now() : length_.of_round(units_[0].last_sync - start_);
}

bool OuterLoop::quiescent() const {
  for (const auto& u : units_)
    if (u.in_flight()) return false;
  return true;
}

int64_t OuterLoop::outer_steps() const {
  int64_t n = 0;
  for (const auto& u : units_)
    if (u.outer) n += u.outer->num_steps();
  return n;
}

NamedTensors OuterLoop::globals() const {
  NamedTensors out;
  for (const auto& u : units_)
    if (u.outer)
      for (const auto& g : u.outer->global()) out.push_back(g);
  return out;
}

NamedTensors OuterLoop::outer_state() const {
  NamedTensors out;
  for (const auto& u : units_) {
    if (!u.outer) continue;
    for (const auto& g : u.outer->global()) out.push_back(g);
    for (auto& m : u.outer->state()) out.push_back(std::move(m));
  }
  return out;
}

nlohmann::json OuterLoop::progress() const {
  nlohmann::json units = nlohmann::json::array();
  for (const auto& u : units_)
    units.push_back({{"last_sync", u.last_sync}, {"outer_steps", u.outer ? u.outer->num_steps() : 0}});
  return units;
}

}  // namespace tributary
