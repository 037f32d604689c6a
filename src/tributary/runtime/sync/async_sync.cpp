#include "tributary/runtime/sync/async_sync.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <fstream>
#include <thread>

#include "tributary/core/clock.h"
#include "tributary/core/error.h"
#include "tributary/core/log.h"
#include "tributary/launch/launcher.h"
#include "tributary/model/tensor_io.h"

namespace tributary {

AsyncSync::AsyncSync(const Session& session)
    : AsyncSync(session, {.id = session.env().rank,
                          .count = session.env().world_size,
                          .lead = session.env().lead(),
                          .links = session.links(),
                          .signer = session.membership_signer()}) {}

AsyncSync::AsyncSync(const Session& session, AsyncMember member)
    : session_(session),
      rank_(member.id),
      replicas_(member.count),
      links_(member.links),
      signer_(member.signer),
      lead_(member.lead),
      pace_(session.config().dist.inner_steps, session.config().dist.round_seconds),
      board_(session.reconnect(), session.config().dist.compression, member.links, member.id, member.signer) {
  const RunConfig& c = session.config();
  tokens_per_step_ = member.ranks * c.train.batch_size * c.train.grad_accum * c.model.context;
  rules_ = {.replicas = replicas_,
            .min_quorum = c.dist.min_quorum > 0 ? c.dist.min_quorum : (replicas_ + 1) / 2,
            .grace_s = c.dist.grace_s,
            .max_staleness = c.dist.max_staleness,
            .token_budget = c.train.steps * replicas_ * tokens_per_step_,
            .round_tokens = c.dist.inner_steps * tokens_per_step_,
            .outer = {.lr = c.dist.outer_lr, .momentum = c.dist.outer_momentum},
            .dead_after_s = c.dist.heartbeat_timeout_s,
            .aggregate = {.rule = c.dist.aggregate,
                          .trim_fraction = c.dist.trim_fraction,
                          .norm_factor = c.dist.reject_norm_factor,
                          .clip_radius = c.dist.clip_radius,
                          .evict_after = int(c.dist.evict_after),
                          .min_score = c.dist.min_score}};
}

AsyncSync::~AsyncSync() {
  merger_.reset();  // its thread first: it may be writing merges.jsonl
  try {             // the communication thread's jobs use the board, which goes before the thread
    collect_posts(true);
    if (fetch_) fetch_->get();
  } catch (const std::exception&) {  // the store is gone: nothing left to deliver to
  }
}

Share AsyncSync::share() const {
  return {.data = {rank_, replicas_},
          .batches_per_step = replicas_,
          .line = fmt::format(
              "asynchronous DiLoCo: {} replicas post every {} without waiting; a merge closes at {} of them + "
              "{} s of grace (at once when all are in), a round's update weighted 1 / replicas / max(1, rounds merged "
              "since its start), "
              "older than {} merges refused; outer lr {}, momentum {}; compression {}",
              replicas_, pace_.describe(), rules_.min_quorum, rules_.grace_s, rules_.max_staleness, rules_.outer.lr,
              rules_.outer.momentum, session_.config().dist.compression),
          // a fast replica may take the run's steps several times over while a slow one lags
          .max_steps = 8 * session_.config().train.steps};
}

Started AsyncSync::start(const StartState& state) {
  if (state.ckpt) resume_from(*state.ckpt);
  judge_by_loss(state.loss_probe);
  Started started = Sync::start(state);
  measure_pace(state.step_seconds);
  enter(state.trained);
  return started;
}

// Every replica restored the lead's model, AdamW state, step and data position (run_state.h restore: an asynchronous
// checkpoint is the lead's alone); the merges go on from what it kept of the outer state.
void AsyncSync::resume_from(const LoadedCheckpoint& ckpt) {
  const std::string state_file = (ckpt.dir / "state.json").string();
  const nlohmann::json& saved = ckpt.state.value("async", nlohmann::json());
  if (!saved.is_object() || !saved.contains("tokens") || !saved["tokens"].is_number_integer() ||
      saved["tokens"].get<int64_t>() < 0)
    fail(
        "cannot resume '{}' as asynchronous DiLoCo: its '{}' has no \"async\" block with the tokens merged (a "
        "checkpoint of another algorithm): start a new run from its weights with --set train.init_from={}",
        ckpt.dir.string(), state_file, ckpt.dir.string());
  resumed_ = MergeStart{.tokens = saved["tokens"].get<int64_t>()};
  if (ckpt.has(kAsyncOuterFile)) {
    const safetensors::File momenta = ckpt.tensors(kAsyncOuterFile);
    for (const auto& [name, view] : momenta.tensors()) resumed_->momenta.emplace_back(name, to_torch(view));
  }
  if (lead_)
    log::info(
        "resuming asynchronous DiLoCo from '{}' (version {} of the run before, {} tokens merged): every replica starts "
        "from the lead's model, AdamW state and data position",
        ckpt.dir.string(), saved.value("version", int64_t{0}), resumed_->tokens);
}

bool AsyncSync::checkpoint_part(const fs::path& run_dir, int64_t step, const RankState& mine,
                                CheckpointContents& contents) {
  if (!lead_) return false;
  // What a resume of this checkpoint starts its merges from (resume_from).
  const MergeStart outer = thread_.run<MergeStart>([this] {
    // The version the lead's model is (before_read adopted it).
    if (const auto commit = board_.commit_of(base_))
      return MergeStart{commit->meta.at("tokens").get<int64_t>(), board_.fetch_momenta(*commit)};
    // Dropped by the merger meanwhile: the newest commit's history has its tokens, and its momenta are the newest.
    const auto newest = board_.commit_of(board_.latest());
    if (!newest) return MergeStart{};
    const nlohmann::json history = newest->meta.value("tokens_at", nlohmann::json::object());
    return MergeStart{history.value(std::to_string(base_), newest->meta.at("tokens").get<int64_t>()),
                      board_.fetch_momenta(*newest)};
  });
  contents.state["world_size"] = replicas_;
  contents.state["async"] = {{"version", base_}, {"tokens", outer.tokens}};
  if (!outer.momenta.empty()) contents.extra_tensors.emplace_back(kAsyncOuterFile, outer.momenta);
  return true;
}

// dist.round_seconds = -1: every member times one of its steps now (dist.slow_workers' factor included), and the round
// lasts dist.inner_steps steps of the median member, agreed once on the store; a member that starts later (restarted)
// takes the agreed length.
void AsyncSync::measure_pace(const std::function<double()>& step_seconds) {
  const RunConfig& c = session_.config();
  if (c.dist.round_seconds >= 0) return;
  const std::string agreed = std::string(UpdateBoard::kPrefix) + "round_seconds";
  const auto member_key = [](int id) { return fmt::format("{}step_seconds/{}", UpdateBoard::kPrefix, id); };
  const bool known = thread_.run<bool>([&] { return board_.store().check({agreed}); });
  const double mine = known ? 0.0 : step_seconds();
  std::vector<double> seconds;
  const double round_s = thread_.run<double>([&] {
    comm::Store& store = board_.store();
    if (!known) {
      store.set(member_key(rank_), fmt::format("{:.6f}", mine));
      std::vector<std::string> keys;
      for (int id = 0; id < replicas_; ++id) keys.push_back(member_key(id));
      store.wait(keys, std::chrono::milliseconds(int64_t(c.dist.store_timeout_s * 1000)),
                 "dist.round_seconds = -1: every replica's step time");
      for (const auto& key : keys) seconds.push_back(std::stod(store.get(key)));
      std::vector<double> sorted = seconds;
      std::nth_element(sorted.begin(), sorted.begin() + ptrdiff_t(sorted.size() / 2), sorted.end());
      store.set_once(agreed, fmt::format("{:.3f}", double(c.dist.inner_steps) * sorted[sorted.size() / 2]));
    }
    return std::stod(store.get(agreed));
  });
  pace_ = RoundPace(c.dist.inner_steps, round_s);
  if (lead_ && !seconds.empty())
    log::info(
        "dist.round_seconds = -1: a step takes {} s on the replicas; a round lasts {:.3f} s, {} steps of the median "
        "replica (set dist.round_seconds = {:.3f} to replay this pace)",
        fmt::format("{:.4f}", fmt::join(seconds, ", ")), round_s, c.dist.inner_steps, round_s);
}

void AsyncSync::enter(NamedTensors& trained) {
  for (const auto& [name, t] : trained) {
    anchor_.emplace_back(name, t.detach().to(torch::kCPU, torch::kFloat32).clone());
    global_.emplace_back(name, anchor_.back().second.clone());  // version 1: every replica initialised alike
    names_.push_back(name);
  }
  merger_ = std::make_unique<AsyncMerger>(
      UpdateBoard(session_.reconnect(), session_.config().dist.compression, links_, rank_, signer_),
      session_.reconnect(), rank_, rules_, anchor_, [this](const nlohmann::json& merge) { write_merge(merge); },
      resumed_.value_or(MergeStart{}));
  if (loss_probe_) {  // the merge's start is the merger's global model
    merger_->set_probe(loss_probe_([m = merger_.get()] { return m->global(); }),
                       uint64_t(session_.config().train.seed));
    if (lead_)
      log::info(
          "dist.score = loss: the merger rates each update by the loss it alone brings on a probe batch of {} windows "
          "drawn after the merge's updates arrived",
          session_.config().dist.probe_windows);
  }
  merger_->run();
  // Every rank met the others at the session's rendezvous: launch may restart the dead from now on.
  thread_.run<int>([this] {
    board_.store().set(kRunStartedKey, "1");
    return 0;
  });
  // A restarted replica (or one that started late) goes on from the newest version; a fresh one's is version 1,
  // the model every replica initialised alike.
  if (auto newest = thread_.run<std::optional<Fetched>>([this] { return fetch_newest(1, {}); })) {
    log::info("replica {} joins the asynchronous run at version {}", rank_, newest->version);
    adopt(std::move(*newest), trained);
  }
  if (pace_.time_paced()) {  // the members' rounds end together, so that their updates meet in one merge
    const double epoch = thread_.run<double>([this] {
      return std::stod(
          board_.store().set_once(std::string(UpdateBoard::kPrefix) + "epoch", fmt::format("{:.3f}", wall_seconds())));
    });
    pace_.start(epoch, wall_seconds());
  }
}

std::optional<AsyncSync::Fetched> AsyncSync::fetch_newest(int64_t have, const NamedTensors& have_params) {
  for (;;) {
    const int64_t v = board_.latest();
    if (v <= have) return std::nullopt;
    const auto commit = board_.commit_of(v);
    if (!commit) return std::nullopt;
    NamedTensors params = by_steps(have, have_params, v);
    if (params.empty()) params = board_.fetch_params(*commit, names_);
    if (params.empty()) continue;  // deleted meanwhile: a newer one exists
    const auto& consumed = commit->meta.at("consumed");
    const std::string mine = std::to_string(rank_);
    return Fetched{.version = v,
                   .done = commit->meta.value("done", false),
                   .merged_mine = consumed.contains(mine) ? consumed.at(mine).get<int64_t>() : 0,
                   .params = std::move(params)};
  }
}

NamedTensors AsyncSync::by_steps(int64_t have, const NamedTensors& have_params, int64_t version) {
  if (have_params.empty() || version - have > 2) return {};  // further behind: the whole version is less to fetch
  NamedTensors out;
  for (const auto& [name, t] : have_params) out.emplace_back(name, t.clone());
  for (int64_t v = have + 1; v <= version; ++v) {
    const auto commit = board_.commit_of(v);
    if (!commit) return {};
    const NamedTensors step = board_.fetch_step(*commit, names_);
    if (step.empty()) return {};
    for (size_t i = 0; i < out.size(); ++i)  // the merger's own arithmetic (async_merger.cpp): the same bits
      out[i].second = out[i].second - step[i].second;
  }
  return out;
}

void AsyncSync::poll_fetch() {
  const auto newest = [this] { return std::max(base_, staged_ ? staged_->version : 0); };
  if (fetch_ && fetch_->wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
    if (auto fetched = fetch_->get(); fetched && fetched->version > newest()) staged_ = std::move(fetched);
    fetch_.reset();
  }
  if (!fetch_)
    fetch_ = thread_.enqueue<std::optional<Fetched>>(
        [this, b = newest(), params = staged_ ? staged_->params : global_] { return fetch_newest(b, params); });
}

void AsyncSync::adopt(Fetched fetched, NamedTensors& trained, bool with_own) {
  torch::NoGradGuard no_grad;
  // The progress since the last post (none at a round's end) is carried over onto the new anchor.
  std::vector<torch::Tensor> unposted;
  for (size_t i = 0; i < anchor_.size(); ++i)
    unposted.push_back(anchor_[i].second - trained[i].second.detach().to(torch::kCPU, torch::kFloat32));
  for (size_t i = 0; i < anchor_.size(); ++i) anchor_[i].second.copy_(fetched.params[i].second);
  for (auto it = posts_.begin(); it != posts_.end();) {
    if (!it->number && it->sent.wait_for(std::chrono::seconds(0)) == std::future_status::ready)
      it->number = it->sent.get();
    if (it->number && *it->number < fetched.merged_mine) {  // in this version: its delta is not needed any more
      overlap_steps_ += steps_ - it->at_step;
      overlapped_ += 1;
      it = posts_.erase(it);
      continue;
    }
    if (with_own)
      for (size_t i = 0; i < anchor_.size(); ++i) anchor_[i].second.sub_(it->delta[i].second);
    ++it;
  }
  for (size_t i = 0; i < trained.size(); ++i) trained[i].second.copy_(anchor_[i].second - unposted[i]);
  base_ = fetched.version;
  global_ = std::move(fetched.params);
  over_ |= fetched.done;
  adopted_ += 1;
}

void AsyncSync::post(NamedTensors& trained, int64_t steps) {
  NamedTensors delta;
  for (size_t i = 0; i < trained.size(); ++i) {
    const torch::Tensor now = trained[i].second.detach().to(torch::kCPU, torch::kFloat32);
    delta.emplace_back(trained[i].first, anchor_[i].second - now);
    anchor_[i].second.copy_(now);
  }
  Posted posted{.delta = delta, .at_step = steps_};
  posted.sent =
      thread_.enqueue<int64_t>([this, delta = std::move(delta), base = base_, tokens = steps * tokens_per_step_] {
        return board_.post(delta, base, tokens, board_.merger_now());
      });
  posts_.push_back(std::move(posted));
  rounds_ += 1;
}

void AsyncSync::collect_posts(bool all) {
  for (auto& p : posts_)
    if (!p.number && (all || p.sent.wait_for(std::chrono::seconds(0)) == std::future_status::ready))
      p.number = p.sent.get();
}

AfterStep AsyncSync::after_step(int64_t step, double lr, NamedTensors& trained, bool last) {
  ++steps_;
  const bool round_end = pace_.step(wall_seconds());
  if (round_end) {
    collect_posts(false);
    post(trained, pace_.take());
  }
  poll_fetch();
  const bool adopted = staged_.has_value();
  if (staged_) adopt(*std::exchange(staged_, std::nullopt), trained);
  return {.landed = adopted, .quiescent = true, .over = round_end && over_};
}

// The lead reads the global model: mid-run, the newest version with its own posts not merged yet (its view, as at a
// round's end); at the run's end, the bare last version.
void AsyncSync::before_read(NamedTensors& params, NamedTensors* aux_params) {
  if (!lead_) return;
  if (pace_.steps() > 0 && !over_) post(params, pace_.take());  // the round so far is posted, not lost
  if (fetch_) {
    if (auto fetched = fetch_->get(); fetched && fetched->version > base_) staged_ = std::move(fetched);
    fetch_.reset();
  }
  const int64_t known = std::max(base_, staged_ ? staged_->version : 0);
  const NamedTensors known_params = staged_ ? staged_->params : global_;
  if (auto newest = thread_.run<std::optional<Fetched>>(
          [this, known, &known_params] { return fetch_newest(known, known_params); }))
    staged_ = std::move(newest);
  if (staged_) {
    const bool done = staged_->done;
    adopt(*std::exchange(staged_, std::nullopt), params, /*with_own=*/!done);
  }
}

void AsyncSync::write_merge(const nlohmann::json& merge) {
  std::vector<std::string> in;
  for (const auto& u : merge.at("merged"))
    in.push_back(fmt::format("{} (staleness {}, lag {:.2f} rounds, weight {:.2f})", u.at("replica").get<int>(),
                             u.at("staleness").get<int64_t>(), u.value("lag", 0.0), u.at("weight").get<double>()));
  log::info("merge {} by replica {}: {}{}; {} tokens merged{}", merge.at("version").get<int64_t>(), rank_,
            fmt::join(in, ", "),
            merge.at("late").empty()
                ? std::string()
                : fmt::format("; late: {}", fmt::join(merge.at("late").get<std::vector<int>>(), ", ")),
            merge.at("tokens").get<int64_t>(), merge.at("done").get<bool>() ? " (the run's tokens: done)" : "");
  nlohmann::json line = merge;
  line.erase("consumed");
  line.erase("tokens_at");
  line["time"] = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  // The run's first merge starts the file (a run directory reused with --overwrite); a successor, or a resumed run,
  // appends.
  const bool first = merge.at("version").get<int64_t>() == 2 && !resumed_;
  std::ofstream(fs::path(session_.config().train.run_dir) / "merges.jsonl", first ? std::ios::trunc : std::ios::app)
      << line.dump() << "\n";
}

void AsyncSync::summarize(TrainSummary& summary) {
  const MergerStats s = merger_ ? merger_->stats() : MergerStats{};
  summary.outer_steps = base_;
  summary.details["async"] = {
      {"rounds", rounds_},
      {"steps_per_round", rounds_ ? double(steps_) / double(rounds_) : 0.0},
      {"steps_from_post_to_merged_version", overlapped_ ? double(overlap_steps_) / double(overlapped_) : 0.0},
      {"adopted", adopted_},
      {"version", base_},
      {"merges_by_this_replica", s.merges},
      {"refused_by_this_replica", s.refused},
      {"takeovers", s.takeovers},
      {"bytes_posted", board_.bytes_posted()},
      {"bytes_fetched", board_.bytes_fetched()}};
  summary.bytes_sent += board_.bytes_posted();
  summary.bytes_recv += board_.bytes_fetched();
}

}  // namespace tributary
