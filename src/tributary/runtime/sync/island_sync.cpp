#include "tributary/runtime/sync/island_sync.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "tributary/config/run_layout.h"
#include "tributary/core/error.h"
#include "tributary/core/log.h"
#include "tributary/launch/launcher.h"
#include "tributary/model/tensor_io.h"
#include "tributary/parallel/row_shards.h"
#include "tributary/runtime/rendezvous.h"
#include "tributary/runtime/sync/lead_following.h"

namespace tributary {
namespace {

// Fault tolerant, an island's other ranks wait for their rank 0 (at its next step, or for what it tells them) while
// it is in a round of the quorum, which may wait a whole collective deadline for a peer island (alive, but stuck)
// and then a heartbeat deadline: they give up on it only after that, so that a peer island's trouble never takes
// their island out with it. Rank 0 itself gives up on them at the collective deadline.
RunConfig following_rank_zero(RunConfig config) {
  config.dist.collective_timeout_s = 2 * config.dist.collective_timeout_s + config.dist.heartbeat_timeout_s;
  return config;
}

RunConfig data_parallel(RunConfig config) {
  config.dist.algorithm = "ddp";
  config.dist.compression = "fp32";    // a fast link: gradients as they are
  config.dist.reject_norm_factor = 0;  // a site's own machines: the outer exchange judges the island's update
  config.dist.aggregate = "mean";
  return config;
}

// The rows of an outer.safetensors (whole tensors) that `shard` holds, as the file its outer loop loads.
safetensors::File outer_rows(const safetensors::File& whole, const NamedTensors& shard, const RowShards& rows) {
  NamedTensors mine;
  for (const auto& [name, view] : shard)
    for (const std::string& key : {name, name + ".outer_momentum"})
      if (whole.contains(key)) mine.emplace_back(key, rows.mine(to_torch(whole.at(key))).contiguous());
  return safetensors::File::parse(tensors_to_safetensors(mine, {{"format", "tributary-outer"}}), whole.origin());
}

}  // namespace

IslandSync::IslandSync(const Session& session, const Layout& layout)
    : config_(session.config()),
      env_(session.env()),
      layout_(layout),
      shard_optimizer_(session.config().parallel.shard_optimizer),
      fault_tolerant_(session.config().dist.fault_tolerant),
      store_(session.store()),
      async_islands_(layout.sync() == SyncKind::kAsyncDiloco) {
  const RunConfig& config = session.config();
  const DistEnv& env = session.env();
  TRIB_CHECK(layout.kind() == RunKind::kIslands, "islands of a {} run", layout.name());
  if (fault_tolerant_ && env.island_life < 0)
    fail(
        "dist.fault_tolerant = true with parallel.islands: start every machine's workers with `tributary launch "
        "--restart-island --max-restarts N` (an island that loses a rank starts again as a whole)");
  if (fault_tolerant_ && env.rank == 0 && !env.joining)
    log::info("fault-tolerant islands: the quorum's members are the islands, each spoken for by its rank 0");
  const int64_t island = layout.islands().island(), size = layout.islands().size(island);
  const RunConfig& in_island =
      fault_tolerant_ && layout.islands().rank_in_island() > 0 ? following_rank_zero(config) : config;
  const comm::GroupOptions options = session.group_options();
  const std::string life = env.island_life > 0 ? fmt::format(".life{}", env.island_life) : "";
  island_ = std::make_unique<comm::Group>(store_, int(layout.islands().rank_in_island()), int(size),
                                          group_options(in_island), fmt::format("island.{}{}", island, life));
  if (size > 1)
    inside_ = std::make_unique<ReplicaSync>(data_parallel(in_island),
                                            ReplicaGroup{.store = store_,
                                                         .rank = int(layout.islands().rank_in_island()),
                                                         .size = int(size),
                                                         .link = std::nullopt,
                                                         .prefix = fmt::format("island-dp.{}{}", island, life),
                                                         .part = false});
  std::vector<int> leads;  // the rank that speaks for each island
  for (int64_t i = 0; i < layout.islands().count(); ++i) leads.push_back(int(layout.islands().begin(i)));
  if (async_islands_) {
    if (layout.islands().rank_in_island() == 0)
      async_ = std::make_unique<AsyncSync>(
          session, AsyncMember{.id = int(island),
                               .count = int(layout.islands().count()),
                               .ranks = size,
                               .lead = env.lead(),
                               .links = session.links_among(leads),
                               .signer = session.membership_signer(int(island), [leads](int i) {
                                 return i >= 0 && size_t(i) < leads.size() ? leads[size_t(i)] : -1;
                               })});
  } else if (layout.islands().outer_shard() >= 0) {
    const std::vector<int> peers = layout.islands().outer_shard_ranks();
    auto link = session.links_among(peers);
    if (fault_tolerant_)
      across_ = std::make_unique<ReplicaSync>(
          config, MemberGroup{.store = session.reconnect(kIslandsScope),
                              .heartbeat_store = session.reconnect(kIslandsScope),
                              .id = int(island),
                              .size = int(layout.islands().count()),
                              .joining = env.joining,
                              .link = std::move(link),
                              .noun = "island",
                              .signer = session.membership_signer(int(island), [leads](int i) {
                                return i >= 0 && size_t(i) < leads.size() ? leads[size_t(i)] : -1;
                              })});
    else
      across_ = std::make_unique<ReplicaSync>(
          config, ReplicaGroup{.store = store_,
                               .rank = int(island),
                               .size = int(layout.islands().count()),
                               .link = std::move(link),
                               .prefix = fmt::format("islands.shard{}", layout.islands().outer_shard())});
  }
  weigh_updates();
  if (env.joining) return;  // an island started again: its rank 0 speaks for it; nothing is collective over the run
  world_ = std::make_unique<comm::Group>(store_, env.rank, env.world_size, options, "world");  // start-up, checkpoints
  if (!fault_tolerant_ && !async_islands_)  // fault tolerant, the stop travels with the quorum's rounds
    stop_vote_ = std::make_unique<comm::LaggedVote>(store_, env.rank, env.world_size, options);
}

IslandSync::~IslandSync() = default;

Share IslandSync::share() const {
  const IslandShape& shape = layout_.islands();
  if (async_islands_)
    return {.data = {env_.rank, env_.world_size},
            .batches_per_step = shape.batches_per_tick(),
            .replicas_of = " (islands)",
            .line = !async_
                        ? ""
                        : fmt::format("{} islands: data parallel inside{}; across, {}", shape.count(),
                                      shard_optimizer_ ? ", AdamW moments sharded (ZeRO-1)" : "", async_->share().line),
            // a fast island may take the run's steps several times over while a slow one lags
            .max_steps = 8 * config_.train.steps};
  return {.data = {env_.rank, env_.world_size},
          .batches_per_step = shape.batches_per_tick(),
          .steps_per_tick = shape.steps_per_tick(),
          .ranks_per_member = shape.size(shape.island()),
          .replicas_of = " (islands) of each outer shard",
          // the replicas' line follows only where a rank syncs
          .line = !across_ ? ""
                           : fmt::format("{} islands: data parallel inside{}; across, {}", shape.count(),
                                         shard_optimizer_ ? ", AdamW moments sharded (ZeRO-1)" : "",
                                         shape.leads_exchange() ? "the islands' ranks 0 exchange the whole model "
                                                                  "(fault tolerant: the members are the islands)"
                                                                : "each rank's outer shard below")};
}

// parallel.island_steps = "auto" (runtime/step_seconds.h): the pace measured now, or the resumed checkpoint's.
void IslandSync::pace(const LoadedCheckpoint* ckpt, const std::function<double()>& step_seconds, bool lead) {
  const IslandShape& shape = layout_.islands();
  if (!shape.measured_pace()) return;
  std::vector<int64_t> steps;
  if (ckpt && ckpt->state.contains("island_steps")) {
    const auto& saved = ckpt->state["island_steps"];
    const bool valid =
        saved.is_array() && int64_t(saved.size()) == shape.count() &&
        std::all_of(saved.begin(), saved.end(), [](const nlohmann::json& n) {
          return n.is_number_integer() && n.get<int64_t>() >= 1 && n.get<int64_t>() <= IslandShape::kMaxPacedSteps;
        });
    if (!valid)
      fail("'{}': island_steps is not one step count (1..{}) per island; use another checkpoint",
           (ckpt->dir / "state.json").string(), IslandShape::kMaxPacedSteps);
    steps = saved.get<std::vector<int64_t>>();
  } else {
    const std::vector<double> seconds = all_seconds(step_seconds());
    steps = shape.paced_steps(seconds);
    if (lead)
      log::info(
          "parallel.island_steps = auto: a step takes {:.3f} s on the ranks ({}); the islands take {} optimizer "
          "step(s) per tick (set parallel.island_steps = '{}' to replay this pace)",
          *std::max_element(seconds.begin(), seconds.end()), fmt::format("{:.3f}", fmt::join(seconds, ", ")),
          fmt::join(steps, ", "), fmt::join(steps, ","));
  }
  RunConfig paced = config_;  // the config keeps "auto" (a resume compares it); the checkpoints keep the steps
  paced.parallel.island_steps = fmt::format("{}", fmt::join(steps, ","));
  const Layout now = run_layout(paced, env_);
  TRIB_CHECK(now.islands().sizes() == layout_.islands().sizes(), "a pace for other islands");
  layout_ = now;
  weigh_updates();
}

Started IslandSync::start(const StartState& s) {
  Started started = Sync::start(s);
  if (s.loss_probe) {  // whoever judges whole updates here: the leads' exchange, or this island's merger
    if (across_) across_->judge_by_loss(s.loss_probe);
    if (async_) async_->judge_by_loss(s.loss_probe);
  }
  pace(s.ckpt, s.step_seconds, s.lead);
  if (s.joining) {
    started.pending = join(s.trained, s.optimizer, s.loader, s.progress, s.total_steps);
    return started;
  }
  if (async_islands_) {
    // A resume: every rank restored the lead's model, AdamW state, step and data position (an asynchronous checkpoint
    // is the lead's alone, runtime/run_state.h), and each island's rank 0 goes on merging from what it kept.
    if (s.ckpt && async_) async_->resume_from(*s.ckpt);
    start_island(s.trained, s.optimizer, s.ckpt ? s.progress.step : 0, nullptr, nlohmann::json::array());
    if (async_) {
      async_->measure_pace(s.step_seconds);  // dist.round_seconds = -1: the island's rank 0 times a step
      async_->enter(s.trained);              // a restarted island's rank 0 adopts the newest version
    }
    std::vector<torch::Tensor> whole;
    for (auto& [name, t] : s.trained) whole.push_back(t.detach());
    from_lead(whole);
    return started;
  }
  const ReplicaResume resume = s.ckpt ? replica_resume(*s.ckpt) : ReplicaResume{};
  if (s.ckpt && !resume.outer)
    fail("the checkpoint at step {} has no DiLoCo outer state ({}): resume from an earlier one", s.progress.step,
         kOuterFile);
  start_island(s.trained, s.optimizer, s.progress.step, resume.outer ? &*resume.outer : nullptr, resume.progress);
  return started;
}

void IslandSync::summarize(TrainSummary& summary) {
  summary.bytes_inside = inside_ ? inside_->rounds().take_stats().bytes_sent : 0;
  summary.world_size = env_.world_size;
  summary.islands = layout_.islands().count();
  // Which ranks form which island, and how the islands exchange (the report's islands table).
  const IslandShape& shape = layout_.islands();
  nlohmann::json ranks = nlohmann::json::array();
  for (int64_t i = 0; i < shape.count(); ++i) {
    nlohmann::json members = nlohmann::json::array();
    for (int64_t r = 0; r < shape.size(i); ++r) members.push_back(shape.begin(i) + r);
    ranks.push_back(members);
  }
  summary.details["island_ranks"] = ranks;
  summary.details["islands_across"] = async_islands_ ? "asynchronous DiLoCo, each island's rank 0"
                                      : shape.leads_exchange()
                                          ? "DiLoCo, each island's rank 0 (fault tolerant)"
                                          : fmt::format("DiLoCo, sharded {} ways", shape.outer_shards());
  if (async_) async_->summarize(summary);
}

// An island of n ranks taking m optimizer steps per tick trained on n x m ranks' batches: its pseudo-gradient counts
// n x m x K / (sum over the K islands of n x m) times in the average (1 for equal lockstep islands).
void IslandSync::weigh_updates() {
  if (!across_) return;
  const IslandShape& shape = layout_.islands();
  across_->set_update_weight(double(shape.size(shape.island()) * shape.steps_per_tick()) * double(shape.count()) /
                             double(shape.batches_per_tick()));
}

std::vector<double> IslandSync::all_seconds(double mine) {
  const auto all = world_->all_gather(torch::full({1}, mine, torch::kFloat64));
  std::vector<double> out;
  for (const auto& t : all) out.push_back(t.item<double>());
  return out;
}

void IslandSync::gather_shards(const std::vector<torch::Tensor>& tensors, int64_t shards) {
  if (island_->size() == 1) return;
  RowShards(0, shards).all_gather(*island_, tensors);  // each rank sends its own shard (its island rank)
}

void IslandSync::from_lead(const std::vector<torch::Tensor>& tensors) {
  if (island_->size() == 1) return;
  std::vector<torch::Tensor> buffers;
  for (const auto& t : tensors) buffers.push_back(t.to(torch::kCPU).contiguous());
  island_->broadcast(buffers, 0);
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < tensors.size(); ++i)
    if (island_->rank() != 0) tensors[i].copy_(buffers[i]);
}

void IslandSync::shard(AdamW& optimizer) {
  if (!shard_optimizer_) return;
  const int64_t n = island_->size();
  optimizer.keep_rows(island_->rank(), n, [this, n](const std::vector<torch::Tensor>& t) { gather_shards(t, n); });
}

void IslandSync::start_island(NamedTensors& params, AdamW& optimizer, int64_t step, const safetensors::File* outer,
                              const nlohmann::json& progress) {
  params_ = params;
  // The checkpoint's count is rank 0's; a time-paced island took its own number of optimizer steps per tick.
  if (step > 0) optimizer.set_num_steps(step * layout_.islands().steps_per_tick());
  torch::NoGradGuard no_grad;
  if (island_->size() > 1) {
    // The island's rank 0 decides: a resume from another island shape (or from flat DiLoCo, whose replicas' AdamW
    // states differ) leaves the island's ranks with states that would drift apart under one averaged gradient.
    std::vector<torch::Tensor> state;
    for (auto& [name, t] : params) state.push_back(t.detach());
    for (auto& [name, t] : optimizer.state()) state.push_back(t);  // the optimizer's own tensors (not yet sharded)
    from_lead(state);
    inside_->rounds().start(params, step);  // checks the island's replicas are identical
    shard(optimizer);
  }
  if (fault_tolerant_) {  // every rank got here: a worker that dies from now on is restarted by its launch
    world_->barrier();
    if (layout_.rank() == 0) store_.set(kRunStartedKey, "1");
  }
  if (!across_) return;
  const RowShards rows(layout_.islands().outer_shard(), layout_.islands().outer_shards());
  outer_params_ = rows.mine(params);
  std::optional<safetensors::File> mine;
  if (outer) mine = outer_rows(*outer, outer_params_, rows);
  across_->rounds().start(outer_params_, step, mine ? &*mine : nullptr, progress);
  if (layout_.rank() == 0) {  // what ZeRO-1 and the sharded outer state leave on a rank (docs/benchmarks.md)
    double whole = 0, outer_held = 0;
    for (const auto& [name, t] : params) whole += double(t.nbytes());
    for (const auto& [name, t] : across_->rounds().outer_state()) outer_held += double(t.nbytes());
    log::info(
        "rank 0 holds {:.2f} MB of AdamW moments (the whole: {:.2f} MB) and {:.2f} MB of DiLoCo outer state "
        "(the whole: {:.2f} MB)",
        optimizer.held_bytes() / 1e6, 2 * whole / 1e6, outer_held / 1e6, 2 * whole / 1e6);
  }
}

std::optional<PendingHeal> IslandSync::join(NamedTensors& params, AdamW& optimizer, BatchLoader& loader,
                                            RunProgress& progress, int64_t total_steps) {
  TRIB_CHECK(fault_tolerant_, "an island joins only a fault-tolerant run");
  params_ = params;
  std::optional<PendingHeal> pending;
  if (across_) {
    pending = join_run(*across_->admission(), params, optimizer, loader, progress, total_steps);
    outer_params_ = RowShards(0, 1).mine(params);
  }
  // What rank 0 healed, to the island's other ranks: the step, tokens, elapsed time and optimizer steps, then the
  // parameters and AdamW state.
  auto meta = torch::tensor({progress.step, progress.tokens, optimizer.num_steps()}, torch::kInt64);
  auto elapsed = torch::full({1}, progress.elapsed_before, torch::kFloat64);
  std::vector<torch::Tensor> state = {meta, elapsed};
  for (auto& [name, t] : params) state.push_back(t.detach());
  for (auto& [name, t] : optimizer.state()) state.push_back(t);
  from_lead(state);
  progress.step = meta[0].item<int64_t>();
  progress.tokens = meta[1].item<int64_t>();
  optimizer.set_num_steps(meta[2].item<int64_t>());
  progress.elapsed_before = elapsed.item<double>();
  if (inside_ && progress.step < total_steps) {
    inside_->rounds().start(params, progress.step);  // identical in the island
    shard(optimizer);
  }
  return pending;
}

bool IslandSync::rank_zero_says(bool mine) { return fault_tolerant_ ? lead_says(*island_, mine) != 0 : mine; }

int64_t IslandSync::follow_lead(BatchLoader& loader, int64_t tokens_per_step) {
  if (!fault_tolerant_) return tokens_per_step;
  return follow_lead_loader(*island_, loader, tokens_per_step, island_->rank());
}

AfterStep IslandSync::async_after_step(int64_t step, double lr, NamedTensors& params, bool last) {
  AfterStep after = async_ ? async_->after_step(step, lr, params, last) : AfterStep{};
  if (island_->size() > 1) {  // the island's other ranks learn from its rank 0 what it adopted, and whether it is over
    std::vector<torch::Tensor> flags = {torch::tensor({int64_t(after.landed), int64_t(after.over)}, torch::kInt64)};
    island_->broadcast(flags, 0);
    after.landed = flags[0][0].item<int64_t>() != 0;
    after.over = flags[0][1].item<int64_t>() != 0;
    if (after.landed) {
      std::vector<torch::Tensor> whole;
      for (auto& [name, t] : params) whole.push_back(t.detach());
      from_lead(whole);
      inside_->rounds().check_identical(params, fmt::format("after adopting a global version at step {}", step));
    }
  }
  after.quiescent = true;
  return after;
}

void IslandSync::before_read(NamedTensors& params, NamedTensors* aux_params) {
  if (!async_islands_) return;
  if (async_) async_->before_read(params, aux_params);
  std::vector<torch::Tensor> whole;
  for (auto& [name, t] : params) whole.push_back(t.detach());
  from_lead(whole);
}

AfterStep IslandSync::after_step(int64_t step, double lr, NamedTensors& params, bool last) {
  if (async_islands_) return async_after_step(step, lr, params, last);
  bool landed = false;
  if (across_) {
    const AfterStep after = across_->rounds().step_ended(step, lr, outer_params_, last);
    landed = after.landed;
    quiescent_ = after.quiescent;
  }
  if ((!layout_.islands().equal() || fault_tolerant_) && island_->size() > 1) {
    // Ranks without a shard learn from their island's rank 0 (which has one) what happened across.
    std::vector<torch::Tensor> flags = {torch::tensor({int64_t(landed), int64_t(quiescent_)}, torch::kInt64)};
    island_->broadcast(flags, 0);
    landed = flags[0][0].item<int64_t>() != 0;
    quiescent_ = flags[0][1].item<int64_t>() != 0;
  }
  if (landed) {
    std::vector<torch::Tensor> whole;
    for (auto& [name, t] : params) whole.push_back(t.detach());
    if (layout_.islands().leads_exchange())
      from_lead(whole);
    else
      gather_shards(whole, layout_.islands().outer_shards());
    // The island's replicas are one again (a shard lost on the way would leave them apart, silently, for good).
    if (inside_) inside_->rounds().check_identical(params, fmt::format("after the outer step at step {}", step));
  }
  return {.landed = landed, .quiescent = quiescent_};
}

NamedTensors IslandSync::whole_outer_state(const NamedTensors& params) {
  // Whole-size tensors (global, then momentum, per parameter; the file sorts them by name), this rank's rows filled;
  // the island's all-gather fills the other shards' rows.
  std::map<std::string, torch::Tensor> mine;
  if (across_)
    for (auto& [key, t] : across_->rounds().outer_state()) mine.emplace(key, t);
  const RowShards rows(std::max<int64_t>(0, layout_.islands().outer_shard()), layout_.islands().outer_shards());
  NamedTensors whole;
  std::vector<torch::Tensor> tensors;
  for (const auto& [name, p] : params)
    for (const std::string& key : {name, name + ".outer_momentum"}) {
      auto t = torch::zeros(p.sizes(), torch::kFloat32);
      if (auto it = mine.find(key); it != mine.end()) rows.mine(t).copy_(it->second);
      whole.emplace_back(key, t);
      tensors.push_back(t);
    }
  gather_shards(tensors, layout_.islands().outer_shards());
  return whole;
}

bool IslandSync::stop_agreed(bool local_stop) {
  // An asynchronous island stops on its own, as an asynchronous replica does: any of its ranks' wish.
  if (async_islands_) return member_stop(*island_, local_stop, nullptr);
  if (!fault_tolerant_) return stop_vote_->step(local_stop);
  // Any rank's wish is its island's: rank 0 votes with it in the quorum's rounds, and tells the island the decision.
  return member_stop(*island_, local_stop, [this](bool wish) { return across_ && across_->stop_agreed(wish); });
}

bool IslandSync::checkpoint_part(const fs::path& run_dir, int64_t step, const RankState& mine,
                                 CheckpointContents& contents) {
  if (async_islands_) {
    // The lead's copy is the global model (before_read), and its island gathered the AdamW state with it (ZeRO-1):
    // the lead alone writes, with what a resume of its merges needs (AsyncSync::checkpoint_part).
    if (!async_ || !async_->checkpoint_part(run_dir, step, mine, contents)) return false;
    contents.state["world_size"] = env_.world_size;  // the ranks' (the async block counts islands)
    return true;
  }
  if (fault_tolerant_) {
    // The island leads' checkpoint, as the whole model's fault-tolerant replicas take it (the living ones). A lead's
    // loader reads one of n x members shards; as one of the members' shards it is n times further on.
    if (!across_) return false;
    const int64_t n = layout_.islands().size(layout_.islands().island());
    const LoaderPosition pos{mine.position.epoch, mine.position.cursor * uint64_t(n)};
    contents.state["loader"] = {{"epoch", pos.epoch}, {"cursor", pos.cursor}};
    const RankState lead{.params = mine.params, .optim_state = mine.optim_state, .position = pos};
    return across_->checkpoint_part(run_dir, step, lead, contents);
  }
  NamedTensors outer = whole_outer_state(params_);  // collective over the island: before rank 0 goes on alone
  const NamedTensors codec = across_ ? across_->codec_state() : NamedTensors{};
  RankState state = mine;
  state.codec = &codec;
  if (!stage_rank_state(group_peers(*world_), run_dir, step, state, contents)) return false;
  contents.state["replicas"] = across_->rounds().progress();       // rank 0 holds shard 0
  contents.state["island_steps"] = layout_.islands().all_steps();  // a measured pace goes on after a resume
  contents.extra_tensors.emplace_back(kOuterFile, std::move(outer));
  return true;
}

}  // namespace tributary
