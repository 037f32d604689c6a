#include "tributary/optim/async_merger.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <set>

#include "tributary/core/error.h"
#include "tributary/core/log.h"
#include "tributary/core/safetensors.h"
#include "tributary/optim/probe_jury.h"

namespace tributary {
namespace {

std::string shape_text(const torch::Tensor& t) { return fmt::format("[{}]", fmt::join(t.sizes(), ", ")); }

}  // namespace

AsyncMerger::AsyncMerger(UpdateBoard board, comm::Store heartbeat, int self, MergeRules rules,
                         const NamedTensors& initial, std::function<void(const nlohmann::json&)> on_merge,
                         MergeStart start)
    : board_(std::move(board)),
      term_(board_, std::move(heartbeat), self, rules.replicas, rules.dead_after_s),
      self_(self),
      rules_(rules),
      start_(std::move(start)),
      on_merge_(std::move(on_merge)) {
  for (const auto& [name, t] : initial) {
    initial_.emplace_back(name, t.detach().to(torch::kCPU, torch::kFloat32).clone());
    names_.push_back(name);
  }
  if (rules_.aggregate.judges_updates()) robust_ = std::make_unique<RobustAggregate>(rules_.aggregate);
}

AsyncMerger::~AsyncMerger() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void AsyncMerger::run() {
  thread_ = std::thread([this] {
    while (!stop_ && !done_) {
      try {
        if (!poll()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      } catch (const std::exception& e) {  // the store went away: the run is over for this process
        if (!stop_) log::warn("replica {}: the asynchronous merger stops: {}", self_, e.what());
        return;
      }
    }
  });
}

MergerStats AsyncMerger::stats() const {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  return stats_;
}

// The newest term and its holder (MergerTerm); a candidate that lost it reloads from the last commit when it holds
// one again.
bool AsyncMerger::elect() {
  const bool mine = term_.held();
  if (!mine) loaded_ = false;
  merging_ = mine;
  return mine;
}

// The merger's state from the last committed version (a fresh run: version 1, the initial model).
void AsyncMerger::take_over() {
  int64_t v = board_.latest();
  while (board_.commit_of(v + 1)) ++v;  // a commit whose merger died before it counted it
  pending_.clear();
  quorum_since_.reset();
  consumed_.clear();
  if (v == 0) {
    outer_ = std::make_unique<OuterOptimizer>(initial_, rules_.outer);
    if (!start_.momenta.empty()) outer_->load_momenta(start_.momenta, "the resumed checkpoint's outer momenta");
    nlohmann::json meta = {{"term", term_.term()},
                           {"tokens", start_.tokens},
                           {"consumed", nlohmann::json::object()},
                           {"merged", nlohmann::json::array()},
                           {"late", nlohmann::json::array()},
                           {"done", false}};
    tokens_at_ = {{1, start_.tokens}};
    meta["tokens_at"] = tokens_at_json();
    if (!board_.publish(1, self_, outer_->global(), outer_->state(), {}, meta)) return;  // another merger did
    version_ = 1;
  } else {
    const CommittedVersion c = *board_.commit_of(v);
    NamedTensors both = board_.fetch_params(c, names_);
    const NamedTensors momenta = board_.fetch_momenta(c);
    both.insert(both.end(), momenta.begin(), momenta.end());
    outer_ = std::make_unique<OuterOptimizer>(initial_, rules_.outer);
    outer_->load_state(safetensors::File::parse(tensors_to_safetensors(both), fmt::format("version {}", v)), v - 1);
    version_ = v;
    for (const auto& [r, n] : c.meta.at("consumed").items()) consumed_[std::stoi(r)] = n.get<int64_t>();
    tokens_at_.clear();
    const nlohmann::json history = c.meta.value("tokens_at", nlohmann::json::object());
    for (const auto& [ver, n] : history.items()) tokens_at_[std::stoll(ver)] = n.get<int64_t>();
    tokens_at_[v] = c.meta.at("tokens").get<int64_t>();
    if (c.meta.value("done", false)) done_ = true;
    if (term_.term() > 0) {
      std::lock_guard<std::mutex> lock(stats_mutex_);
      stats_.takeovers += 1;
    }
    log::info("replica {} merges from version {} ({} tokens merged so far)", self_, v, merged_tokens());
  }
  loaded_ = true;
}

std::string AsyncMerger::refusal(const PostedUpdate& u) const {
  if (!u.error.empty()) return u.error;
  if (u.tokens <= 0) return fmt::format("it claims {} tokens", u.tokens);
  if (u.base_version < 1 || u.base_version > version_)
    return fmt::format("it trained from version {}, which no merger published (the newest is {})", u.base_version,
                       version_);
  if (version_ - u.base_version > rules_.max_staleness)
    return fmt::format(
        "it is stale: it trained from version {}, the merger is at {} (dist.max_staleness = {}); the replica goes on "
        "from the newest version",
        u.base_version, version_, rules_.max_staleness);
  const NamedTensors& model = outer_->global();  // the post's tensors are in its order (UpdateBoard::read)
  for (size_t i = 0; i < model.size(); ++i) {
    const auto& [name, t] = model[i];
    const torch::Tensor& d = u.delta[i].second;
    if (d.sizes() != t.sizes())
      return fmt::format("its tensor '{}' has shape {}, the model's is {}", name, shape_text(d), shape_text(t));
    if (!torch::isfinite(d).all().item<bool>()) return fmt::format("its tensor '{}' holds NaN or Inf", name);
  }
  return "";
}

void AsyncMerger::collect() {
  for (int r = 0; r < rules_.replicas; ++r) {
    const int64_t posted = board_.posted(r);
    for (int64_t& n = consumed_[r]; n < posted; ++n) {
      PostedUpdate u = board_.read(r, n, names_);
      if (const std::string why = refusal(u); !why.empty()) {
        log::warn("merger (replica {}): refused update {} of replica {}: {}; nothing of it reaches the model", self_, n,
                  r, why);
        board_.forget(r, n);  // consumed: the store keeps nothing a stranger sent
        std::lock_guard<std::mutex> lock(stats_mutex_);
        stats_.refused += 1;
        continue;
      }
      pending_.push_back({std::move(u), 0});
    }
  }
}

bool AsyncMerger::due() {
  if (pending_.empty()) return false;
  std::set<int> in;
  for (const auto& p : pending_) in.insert(p.update.replica);
  const std::vector<int> living = term_.alive();
  bool all_in = true;
  for (int r : living) all_in &= in.count(r) > 0;
  if (all_in) return true;
  const int64_t quorum = std::min<int64_t>(rules_.min_quorum, std::max<int64_t>(1, int64_t(living.size())));
  if (int64_t(in.size()) < quorum) return false;
  if (!quorum_since_) quorum_since_ = std::chrono::steady_clock::now();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - *quorum_since_).count() >= rules_.grace_s;
}

void AsyncMerger::set_probe(std::unique_ptr<UpdateProbe> probe, uint64_t seed) {
  probe_ = std::move(probe);
  probe_seed_ = seed;
}

NamedTensors AsyncMerger::global() const { return outer_ ? outer_->global() : NamedTensors{}; }

std::vector<torch::Tensor> AsyncMerger::robust_merge() {
  const NamedTensors& model = outer_->global();
  std::vector<torch::Tensor> flats;
  std::vector<int> ids;
  for (const auto& p : pending_) {
    std::vector<torch::Tensor> parts;
    for (const auto& [name, d] : p.update.delta) parts.push_back(d.reshape({-1}).to(torch::kFloat32));
    flats.push_back(torch::cat(parts));
    ids.push_back(p.update.replica);
  }
  // Loss scores: each update alone at a round's weight (1 / replicas) on a batch none of them could know.
  std::vector<double> improvements;
  const bool scored = probe_ && rules_.aggregate.loss_scores && !flats.empty() && probe_->applies(flats[0].numel());
  if (scored) {
    std::vector<const torch::Tensor*> asked = {nullptr};
    for (const auto& f : flats) asked.push_back(&f);
    const auto losses =
        probe_->losses(asked, 1.0 / double(rules_.replicas), probe_batch_seed(probe_seed_, flats, version_));
    for (size_t i = 0; i < flats.size(); ++i) improvements.push_back(losses[0] - losses[i + 1]);
  }
  const Aggregated a = robust_->combine(flats, ids, scored ? &improvements : nullptr);
  std::vector<bool> refused(pending_.size(), false);
  for (const Refusal& r : a.refused) {
    refused[size_t(r.participant)] = true;
    const Pending& p = pending_[size_t(r.participant)];
    log::warn("merger (replica {}): refused update {} of replica {} (dist.aggregate = {}): {}", self_, p.update.number,
              p.update.replica, rules_.aggregate.rule, r.reason);
    board_.forget(p.update.replica, p.update.number);
  }
  for (int id : a.evicted)
    log::warn("merger (replica {}): replica {} evicted: its updates are refused from now on (dist.evict_after = {})",
              self_, id, rules_.aggregate.evict_after);
  double total = 0;
  std::vector<Pending> kept;
  for (size_t k = 0; k < pending_.size(); ++k)
    if (!refused[k]) {
      total += pending_[k].weight;
      kept.push_back(std::move(pending_[k]));
    }
  {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    stats_.refused += int64_t(a.refused.size());
  }
  pending_ = std::move(kept);
  // The rule's value stands for the accepted updates: it moves the model as far as their weighted sum would.
  std::vector<torch::Tensor> out;
  int64_t offset = 0;
  for (const auto& [name, t] : model) {
    out.push_back(a.value.narrow(0, offset, t.numel()).view(t.sizes()) * total);
    offset += t.numel();
  }
  return out;
}

double AsyncMerger::lag_since(int64_t version) const {
  // Every version an update may train from (max_staleness merges back, refusal()) is in the committed history.
  const auto it = tokens_at_.find(version);
  TRIB_CHECK(it != tokens_at_.end(), "version {} is not in the merger's token history (at version {})", version,
             version_);
  return double(merged_tokens() - it->second) / (double(rules_.round_tokens) * double(rules_.replicas));
}

nlohmann::json AsyncMerger::tokens_at_json() const {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [v, n] : tokens_at_) out[std::to_string(v)] = n;
  return out;
}

void AsyncMerger::merge() {
  const NamedTensors& model = outer_->global();
  // A round's update counts 1 / replicas, as in synchronous DiLoCo's average, whichever merge it lands in (two
  // merges of two updates move the model as far as one of four), less only when more than a round was merged since
  // it started.
  const double full = double(rules_.round_tokens) * double(rules_.replicas);
  for (auto& p : pending_) {
    p.staleness = version_ - p.update.base_version;
    p.lag = lag_since(p.update.base_version);
    p.weight = double(p.update.tokens) / std::max(1.0, p.lag) / full;
  }
  std::vector<torch::Tensor> average;
  if (robust_) {
    average = robust_merge();
    if (pending_.empty()) return;  // every update refused: nothing to merge
  } else {
    for (const auto& [name, t] : model) average.push_back(torch::zeros_like(t));
    for (const auto& p : pending_)
      for (size_t i = 0; i < model.size(); ++i) average[i].add_(p.update.delta[i].second, p.weight);
  }
  nlohmann::json merged = nlohmann::json::array();
  std::set<int> in;
  int64_t tokens = 0;
  for (const auto& p : pending_) {
    merged.push_back({{"replica", p.update.replica},
                      {"number", p.update.number},
                      {"staleness", p.staleness},
                      {"lag", p.lag},
                      {"weight", p.weight},
                      {"tokens", p.update.tokens}});
    in.insert(p.update.replica);
    tokens += p.update.tokens;
  }
  std::vector<int> late;
  for (int r : term_.alive())
    if (!in.count(r)) late.push_back(r);
  // The version the replicas will read: the previous one minus the step as they decode it (its rounding stays here).
  std::vector<torch::Tensor> before;
  for (const auto& [name, t] : model) before.push_back(t.clone());
  outer_->apply(average);
  NamedTensors step;
  for (size_t i = 0; i < model.size(); ++i) step.emplace_back(model[i].first, before[i] - model[i].second);
  step = board_.as_received(step);
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < model.size(); ++i) model[i].second.copy_(before[i] - step[i].second);
  }
  const int64_t next = version_ + 1;
  nlohmann::json consumed = nlohmann::json::object();
  for (const auto& [r, n] : consumed_) consumed[std::to_string(r)] = n;
  const int64_t total = merged_tokens() + tokens;
  const bool finished = rules_.token_budget > 0 && total >= rules_.token_budget;
  // The recent versions' tokens travel with the commit: a successor weighs the updates in flight as this one would.
  // (A commit lost to another merger reloads everything, this history included: take_over.)
  tokens_at_[next] = total;
  tokens_at_.erase(tokens_at_.begin(), tokens_at_.lower_bound(next - rules_.max_staleness - 1));
  nlohmann::json meta = {{"term", term_.term()}, {"tokens", total},  {"consumed", consumed},         {"merged", merged},
                         {"late", late},         {"done", finished}, {"tokens_at", tokens_at_json()}};
  if (!board_.publish(next, self_, outer_->global(), outer_->state(), step, meta)) {
    log::warn("replica {}: version {} was committed by another merger first; this one stands down", self_, next);
    loaded_ = false;  // reloads from the newest commit if it still holds the term
    return;
  }
  version_ = next;
  for (const auto& p : pending_) board_.forget(p.update.replica, p.update.number);
  if (const auto old = board_.commit_of(next - 3)) board_.forget_version(*old);
  pending_.clear();
  quorum_since_.reset();
  {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    stats_.merges += 1;
  }
  meta["version"] = next;
  meta["merger"] = self_;
  if (on_merge_) on_merge_(meta);
  if (finished) done_ = true;
}

bool AsyncMerger::poll() {
  if (done_ || !elect()) return false;
  if (!loaded_) take_over();
  if (!loaded_ || done_) return false;
  if (board_.commit_of(version_ + 1)) {  // another merger committed meanwhile (this one was frozen): reload
    loaded_ = false;
    return false;
  }
  collect();
  if (!due()) return false;
  const int64_t before = version_;
  merge();
  return version_ > before;  // false when the rule refused every update, or another merger committed first
}

}  // namespace tributary
