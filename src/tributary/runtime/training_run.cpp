// The trainer's source of work (training_run.h): built in order, since the seed fixes the initialisation and nothing
// may draw random numbers before the model; then resume, the replicas' start (or a joiner's heal) and the run's
// description; then driven unit by unit (one step and its sync), with its evaluations, checkpoints and summary.
#include "tributary/runtime/training_run.h"

#include <fmt/format.h>

#include <limits>

#include "tributary/artifacts/inference.h"
#include "tributary/config/run_layout.h"
#include "tributary/core/counted.h"
#include "tributary/core/error.h"
#include "tributary/core/log.h"
#include "tributary/launch/launcher.h"
#include "tributary/model/eval.h"
#include "tributary/perf/flops.h"
#include "tributary/runtime/replica_checkpoint.h"
#include "tributary/runtime/step_seconds.h"
#include "tributary/runtime/sync/loss_probe.h"
#include "tributary/runtime/sync/pipeline_sync.h"
#include "tributary/runtime/sync/replica_sync.h"
#include "tributary/runtime/training_priority.h"

namespace tributary::detail {
namespace {

// Who this process is among a fault-tolerant run's members: its rank, or, with islands (of ranks, or one pipeline
// each), its island when it is the island's rank 0 (the island's other ranks never lead).
int member_id(const Layout& layout, const RunConfig& config, int rank) {
  const bool islands = layout.kind() == RunKind::kIslands || layout.pipelines_per_island() > 0;
  if (!islands || !config.dist.fault_tolerant) return rank;
  return layout.islands().rank_in_island() == 0 ? int(layout.islands().island()) : -1;
}

}  // namespace

TrainingRun::TrainingRun(const RunConfig& config, const TrainOptions& options)
    : config_(config),
      options_(options),
      layout_(run_layout(config, options.dist)),
      device_(parse_device(config.train.device)),
      lead_(member_id(layout_, config, options.dist.rank), options.dist.lead()),
      schedule_{config.optim.lr, config.optim.warmup_steps, config.train.steps, config.optim.min_lr_ratio},
      faults_(options.faults, options.dist.rank) {
  const DistEnv& env = options_.dist;
  if (env.distributed()) log::set_prefix(getenv("TRIBUTARY_LAUNCHED") ? "" : fmt::format("[rank {}] ", env.rank));
  const int64_t threads = configure_threads(tc_.threads, env.local_world_size);
  slowdown_.emplace(config_.dist.slow_workers, env.rank, env.world_size);
  if (slowdown_->factor() > 1)
    log::info(
        "worker {} runs {}x slower (dist.slow_workers: a sleep after each step, or after each forward and "
        "backward of a pipeline stage)",
        env.rank, slowdown_->factor());
  if (lead_.is()) {
    check_blas();
    log::info("{}", layout_.describe());
  }
  if (layout_.distributed()) session_ = std::make_unique<Session>(config_, env, layout_.device_of_rank());
  sync_ = make_sync(session_.get(), layout_);
  if (const std::string kind = faults_.adversary(); !kind.empty() && kind != "poison" && sync_->replicas())
    sync_->replicas()->install_adversary(kind);
  data_.dataset.emplace(Dataset::open(config_.data.dir));
  ckpt_ = prepare_run(config_, options_, *data_.dataset);
  if (layout_.distributed() && !env.joining) {  // before anything is trained (a joiner takes the run's state)
    if (const auto peers = sync_->peers().checkpoint) {
      const int64_t step = check_run_dirs(*peers, tc_.run_dir, resumable_steps(ckpt_, options_));
      if (ckpt_) resume_at(*ckpt_, step);
    }
  }
  build_model_and_data();
  if (progress_.step >= tc_.steps)
    fail("the checkpoint is at step {} but train.steps = {}: nothing to do", progress_.step, tc_.steps);
  std::optional<PendingHeal> pending = start_sync();  // a joining worker may find the run over: it trains nothing
  share_ = sync_->share();
  flops_per_token_ = training_flops_per_token(config_.model, parts_.model->num_matmul_parameters());
  if (parts_.aux_heads)  // the auxiliary heads are computed and trained too
    flops_per_token_ += 6.0 * double(parts_.aux_heads->num_matmul_parameters()) +
                        6.0 * double(parts_.aux_heads->num_blocks() * config_.model.width * config_.model.context);
  tokens_per_step_ = tc_.batch_size * tc_.grad_accum * config_.model.context *
                     (pending ? pending->members_world  // the members' count until it is one
                              : share_.batches_per_step);
  summary_.run_dir = tc_.run_dir;
  summary_.num_parameters = parts_.model->num_parameters();
  const double bytes_per_token = data_.dataset->bytes_per_token("val");
  summary_.unigram_bpb = data_.dataset->unigram_val_bits_per_token() / bytes_per_token;
  describe(threads);
  start_report(bytes_per_token);
  if (ReplicaSync* synced = sync_->replicas(); synced && synced->admission()) {
    const int64_t n = share_.ranks_per_member;  // each reading its own shard
    members_ = std::make_unique<MembershipFollower>(*synced->admission(), *data_.loader, lead_, *report_,
                                                    n * tc_.batch_size * tc_.grad_accum * config_.model.context,
                                                    std::move(pending), n);
  }
  tokens_per_step_ = sync_->follow_lead(*data_.loader, tokens_per_step());
  start_training();
}

// The run's metrics, console lines and summary (the lead writes them; every rank counts its own traffic).
void TrainingRun::start_report(double bytes_per_token) {
  const DistEnv& env = options_.dist;
  report_ = std::make_unique<RunReport>(
      ReportSetup{.run_dir = tc_.run_dir,
                  .lead = lead_.is(),
                  .machine_console = env.distributed() && env.local_rank == 0,
                  .resume_step = ckpt_ ? progress_.step : -1,
                  .total_steps = tc_.steps,
                  .stops_at = options_.stop_after_step > 0 ? std::min(options_.stop_after_step, tc_.steps) : 0,
                  .log_every = tc_.log_every,
                  .world_size = env.world_size,
                  .distributed = layout_.distributed(),
                  .exchanges = rounds() != nullptr,
                  .rank = env.rank,
                  // a restarted worker keeps the lines of its first life
                  .worker_resume_step = ckpt_         ? progress_.step
                                        : env.joining ? std::numeric_limits<int64_t>::max()
                                                      : -1,
                  .flops_per_token = flops_per_token_,
                  .peak_flops = summary_.peak_flops,
                  .bytes_per_token = bytes_per_token});
}

// The step behind the seam, then the clocks: from here on the loop's units are timed.
void TrainingRun::start_training() {
  const StepPeers peers = sync_->step_peers();
  step_ =
      make_train_step({config_, *parts_.model, parts_.params, parts_.trained, parts_.aux_heads.get(), *parts_.optimizer,
                       *data_.loader, peers.rounds, peers.pipelines, device_, slowdown_->factor()});
  blocked_s_ = peers.blocked_s;
  if (step_.take_stage_stats) stages_.emplace(std::move(step_.take_stage_stats));
  parts_.model->train();
  // The start's own traffic (a resume's or a heal's state, the replica checks) counts in the run's totals, not in the
  // first log line's share of time in communication, which divides by the steps' time alone.
  if (ReplicaRounds* r = rounds()) count_traffic(r->take_stats());
  run_start_ = Clock::now();
  tokens_at_start_ = progress_.tokens;
}

void TrainingRun::build_model_and_data() {
  torch::manual_seed(static_cast<uint64_t>(tc_.seed));
  parts_.model = std::make_shared<Transformer>(config_.model);
  parts_.model->to(device_);
  parts_.params = named_parameters_of(*parts_.model);
  PipelineSync* pipelines = sync_->step_peers().pipelines;  // a pipeline stage trains its own part
  parts_.trained = pipelines ? pipeline::stage_params(parts_.params, pipelines->layout(), layout_.stage(),
                                                      config_.model.blocks_per_level(), config_.model.tie_embeddings)
                             : parts_.params;
  const LocalConfig& local = config_.local;
  if (local.chunks > 0) {  // drawn after the model: its initialisation is the plain trainer's
    parts_.aux_heads =
        std::make_shared<AuxHeads>(config_.model, local.chunks, local.aux_head == "blocks" ? local.aux_head_blocks : 0);
    parts_.aux_heads->to(device_);
    parts_.aux_params = named_parameters_of(*parts_.aux_heads);
    const std::string mine = pipelines ? fmt::format("aux.{}.", layout_.stage()) : "aux.";  // a stage: its head
    for (const auto& [name, t] : parts_.aux_params)
      if (name.rfind(mine, 0) == 0) parts_.trained.emplace_back(name, t);
  }
  const auto& o = config_.optim;
  parts_.optimizer = std::make_unique<AdamW>(
      parts_.trained, AdamWOptions{.beta1 = o.beta1, .beta2 = o.beta2, .eps = o.eps, .weight_decay = o.weight_decay});
  auto& streams = data_.train_strata;
  if (config_.data.shards == "domains" && !data_.dataset->domains().empty()) {
    for (auto& tokens : data_.dataset->load_domains("train"))
      streams.push_back(std::make_shared<const std::vector<uint32_t>>(std::move(tokens)));
  } else {
    streams.push_back(std::make_shared<const std::vector<uint32_t>>(data_.dataset->load_tokens("train")));
  }
  data_.val_tokens = std::make_shared<const std::vector<uint32_t>>(data_.dataset->load_tokens("val"));
  // Each replica reads its own share of the windows (rank-strided), so N replicas x batch b see the windows one
  // process with batch N*b would; with data.shards = "domains", its share of its domain's.
  DataShard shard = sync_->share().data;
  auto train_tokens = streams.front();
  std::string split_name = fmt::format("'{}' train", config_.data.dir);
  if (streams.size() > 1) {
    const int64_t count = int64_t(streams.size());
    const int64_t domain = shard.rank % count;
    train_tokens = streams[size_t(domain)];
    split_name = fmt::format("'{}' train, domain {}", config_.data.dir, domain);
    log::info("replica {} of {} reads only domain {} ('{}', data.shards = domains): {} tokens", shard.rank, shard.world,
              domain, data_.dataset->domains()[size_t(domain)], train_tokens->size());
    shard = {.rank = int(shard.rank / count), .world = int((shard.world - 1 - domain) / count + 1)};
  }
  data_.num_train_tokens = train_tokens->size();
  data_.loader = std::make_unique<BatchLoader>(train_tokens,
                                               LoaderOptions{.batch_size = tc_.batch_size,
                                                             .context = config_.model.context,
                                                             .seed = static_cast<uint64_t>(tc_.seed),
                                                             .rank = shard.rank,
                                                             .world_size = shard.world,
                                                             .poisoned = faults_.adversary() == "poison"},
                                               split_name);
  // fail now, not at the first evaluation, if val is too small
  BatchLoader(data_.val_tokens, {.batch_size = tc_.batch_size, .context = config_.model.context, .shuffle = false},
              fmt::format("'{}' val", config_.data.dir));
  if (!ckpt_ && !tc_.init_from.empty()) init_from(*parts_.model, tc_.init_from);
  if (ckpt_)
    progress_ =
        restore(*ckpt_, *parts_.model, *parts_.optimizer, *data_.loader, options_.dist.rank, options_.dist.world_size);
  if (ckpt_ && parts_.aux_heads)  // a pipeline rank's own copy (DiLoCo replicas differ between outer steps)
    load_parameters(
        *parts_.aux_heads,
        ckpt_->tensors(pipelines && options_.dist.rank != 0 ? replica_aux_file(options_.dist.rank) : kAuxHeadsFile));
}

std::optional<PendingHeal> TrainingRun::start_sync() {
  const bool joining = options_.dist.joining;
  // Per-replica peak: all ranks measure at once, each with its own threads (a joiner takes the run's figure).
  Started started = sync_->start(
      {.trained = parts_.trained,
       .params = &parts_.params,
       .optimizer = *parts_.optimizer,
       .loader = *data_.loader,
       .progress = progress_,
       .total_steps = tc_.steps,
       .ckpt = ckpt_ ? &*ckpt_ : nullptr,
       .joining = joining,
       .lead = lead_.is(),
       .device = device_,
       .step_seconds = [this] { return measure_step_seconds(*parts_.model, config_, device_, slowdown_->factor()); },
       .loss_probe = config_.dist.score != "loss" ? ProbeMaker() : [this](std::function<NamedTensors()> globals) {
         return std::unique_ptr<UpdateProbe>(std::make_unique<LossProbe>(
             config_.model, device_, data_.train_strata, config_.dist.probe_windows, std::move(globals)));
       }});
  summary_.peak_flops = started.peak_flops;
  summary_.peak_source = started.peak_words;
  lower_training_priority(config_.dist.compute_nice, options_.dist.rank);  // every thread of the sync runs first
  // A run that cannot outlive a worker says on the store that it got through start-up (a fault-tolerant sync says
  // so itself): without it launch takes a later death for one before start-up and starts the run again from
  // nothing, throwing away what it trained.
  if (session_ && session_->env().rank == 0 && !joining && !config_.dist.fault_tolerant) {
    comm::Store store = session_->reconnect();
    if (!store.check({kRunStartedKey})) store.set(kRunFixedKey, "1");
  }
  if (ckpt_ && rounds() && !joining) load_codec_state();
  return std::move(started.pending);
}

// The error feedback is each rank's own: the same workers take theirs back; another number restarts it from zero.
void TrainingRun::load_codec_state() {
  const std::string codec_file = replica_codec_file(options_.dist.rank);
  const bool same_world = ckpt_->state.value("world_size", 1) == options_.dist.world_size;
  if (same_world && ckpt_->has(codec_file)) {
    const auto file = ckpt_->tensors(codec_file);
    NamedTensors state;
    for (const auto& [name, view] : file.tensors()) state.emplace_back(name, to_torch(view));
    sync_->replicas()->load_codec_state(state, (ckpt_->dir / codec_file).string());
  } else if (!same_world && ckpt_->has(replica_codec_file(0)) && lead_.is()) {
    log::info("dist.compression = {}: resuming with another number of workers, the error feedback starts from zero",
              config_.dist.compression);
  }
}

void TrainingRun::describe(int64_t threads) const {
  if (!lead_.is()) return;
  const auto& m = config_.model;
  log::info("model: {} parameters ({} in matmuls), {} x {}, width {}, context {}, vocab {}",
            thousands(double(summary_.num_parameters)), thousands(double(parts_.model->num_matmul_parameters())),
            counted(m.num_levels, "level"), counted(m.blocks_per_level(), "block"), m.width, m.context, m.vocab_size);
  // One replica's (a pipeline's, a rank's) tokens per step, and every replica's together as `done:` counts them.
  const int64_t mine = tokens_per_step_ / share_.data.world;
  const std::string per_step = mine == tokens_per_step_
                                   ? fmt::format("{} tokens per step", thousands(double(mine)))
                                   : fmt::format("{} tokens per step per replica ({} per step in all)",
                                                 thousands(double(mine)), thousands(double(tokens_per_step_)));
  log::info("data: '{}' ({} train tokens, {} val tokens, tokenizer {}); {}; {} threads", config_.data.dir,
            thousands(double(data_.num_train_tokens)), thousands(double(data_.val_tokens->size())),
            data_.dataset->tokenizer_kind(), per_step, threads);
  log::info("MFU is against a matmul peak of {:.1f} GFLOP/s ({})", summary_.peak_flops / 1e9, summary_.peak_source);
  if (!share_.line.empty()) log::info("{}", share_.line);
  const auto& l = config_.local;
  if (parts_.aux_heads)
    log::info(
        "local parallelism: {} chunks of {} blocks ({}, overlap {}), auxiliary heads {} ({} private blocks), "
        "weight {}, {}",
        l.chunks, config_.model.num_layers / l.chunks, l.mode, l.mode == "overlapping" ? l.overlap_blocks : 0,
        l.aux_head, l.aux_head == "blocks" ? l.aux_head_blocks : 0, l.aux_weight,
        sync_->step_peers().pipelines ? "one chunk per pipeline stage" : "in one process");
  if (tc_.precision == "bf16")
    log::info("train.precision = bf16: the forward pass under autocast (bf16 matmuls), fp32 master weights and AdamW{}",
              device_.is_cpu() ? "; on a CPU without bf16 matmul units this is ~10x slower than fp32 (measured on "
                                 "the 2-core testbed): a numerics check, not a speed-up"
                               : "");
  if (tc_.cuda_graph)
    log::info("train.cuda_graph: three eager steps, then the step is captured once as a CUDA graph and replayed{}",
              averaging_gradients() ? " (the data-parallel warm-up's steps stay eager: they exchange)" : "");
  const ReplicaRounds* rounds = this->rounds();
  if (!rounds) return;
  const auto& d = config_.dist;
  log::info("{} replicas{}, {}{}, compression {}", rounds->size(), share_.replicas_of,
            rounds->ddp() ? "data parallel (gradients averaged every step)" : "DiLoCo",
            rounds->ddp()
                ? ""
                : fmt::format(" (H = {}, outer lr {}, momentum {})", d.inner_steps, d.outer_lr, d.outer_momentum),
            d.compression);
  if (!rounds->ddp() && !d.auto_note.empty()) log::info("{}", d.auto_note);
}

void TrainingRun::report_exchange(int64_t step, bool synced, double elapsed) {
  ReplicaSync* replicas = sync_->replicas();
  if (!replicas) return;
  ReplicaRounds& rounds = replicas->rounds();
  if (!(synced || (rounds.averaging_gradients() && report_->log_due(step)))) return;
  const auto c = rounds.take_stats();
  count_traffic(c);
  const int64_t rejected = replicas->take_rejected();  // -1: not guarded
  summary_.rejected += std::max<int64_t>(0, rejected);
  report_->exchange_done(step, rounds.ddp() ? step : rounds.outer_steps(), rounds.ddp() ? 1 : rounds.inner_steps_now(),
                         c, elapsed, rejected >= 0 ? rounds.size() : 0, rejected, replicas->take_scores());
}

void TrainingRun::count_traffic(const comm::CommStats& c) {
  if (stages_) stages_->add_sync_bytes(c.bytes_sent);
  summary_.bytes_sent += c.bytes_sent;
  summary_.bytes_recv += c.bytes_recv;
  summary_.comm_s += c.comm_s;
}

// A fault-tolerant run's checkpoint is taken by the living: when a member dies during it, the others' collectives
// fail (or are abandoned at its death), the members settle without it and take the checkpoint again (its staging
// starts over; the checkpoint before stays intact). A failure with every member alive is no death: it ends the run.
void TrainingRun::save(int64_t step, double elapsed) {
  const NamedTensors optim_state = parts_.optimizer->state();  // once: with ZeRO-1 the island reads it together
  for (int attempt = 0;; ++attempt) {
    try {
      if (attempt == 0) faults_.inside_checkpoint(step);
      const SaveRequest request{
          .config = config_,
          .dataset = *data_.dataset,
          .params = parts_.params,
          .optimizer = *parts_.optimizer,
          .loader = *data_.loader,
          .stage_state =
              [this](const fs::path& run_dir, int64_t at, const RankState& mine, CheckpointContents& contents) {
                return sync_->checkpoint_part(run_dir, at, mine, contents);
              },
          .aux_heads = &parts_.aux_params,
          .optimizer_state = &optim_state};
      auto path = save_run(request, step, progress_.tokens, elapsed);
      if (!path.empty()) summary_.checkpoint = path;
      return;
    } catch (const NetworkError& e) {
      if (!members_ || attempt >= 3) throw;
      log::warn("worker {}: the checkpoint of step {} failed ({}); the living settle and take it again",
                options_.dist.rank, step, e.what());
      if (!members_->before_checkpoint(step, attempt + 1)) throw;
    }
  }
}

// One unit: next batch -> step -> sync -> (membership) -> report.
UnitDone TrainingRun::next() {
  const auto step_start = Clock::now();
  const int64_t step = progress_.step;
  const double lr = schedule_.lr(step);
  const StepResult result = step_once(step, lr);
  progress_.step = step + 1;
  faults_.after_step(progress_.step);
  progress_.tokens += tokens_per_step();
  const bool averaged = averaging_gradients();  // data parallel, or DiLoCo's warm-up
  const AfterStep after = sync_->after_step(progress_.step, lr, parts_.trained, progress_.step == max_steps());
  over_ = after.over;
  const bool synced = after.landed;
  const bool round = synced || averaged;
  if (round && members_) members_->after_round(progress_.step);  // the members may change only at a round
  measure_stage();
  const double dt = seconds_since(step_start);
  train_seconds_ += dt;
  report_->step_done(dt, tokens_per_step(), result.reported ? std::optional(result.loss) : std::nullopt);
  const double now = elapsed();
  report_exchange(progress_.step, synced, now);
  if (result.reported) record(result, progress_.step, schedule_.lr(step - result.lag), now);
  return {.step = progress_.step,
          .quiescent = after.quiescent,
          .synced = synced,
          .round = round,
          .elapsed_s = now,
          .over = after.over};
}

ReplicaRounds* TrainingRun::rounds() const {
  ReplicaSync* replicas = sync_->replicas();
  return replicas ? &replicas->rounds() : nullptr;
}

bool TrainingRun::averaging_gradients() const {
  const ReplicaRounds* r = rounds();
  return r && r->averaging_gradients();
}

StopAgreement::Vote TrainingRun::stop_vote() { return sync_->peers().stop; }

StepResult TrainingRun::step_once(int64_t step, double lr) {
  const auto start = Clock::now();
  const double blocked_before = blocked_s_();
  StepResult result = step_.step->run(step, lr);
  // Time-paced islands (parallel.island_steps): a faster island takes more optimizer steps per tick, at the tick's
  // learning rate; the tick reports its last.
  for (int64_t k = 1; k < share_.steps_per_tick; ++k) result = step_.step->run(step, lr);
  // dist.slow_workers: a slower machine computes slower; the wait for the others (data parallel) is not its own
  if (!step_.slows_itself) slowdown_->after_step(seconds_since(start) - (blocked_s_() - blocked_before));
  return result;
}

void TrainingRun::measure_stage() {
  if (!stages_) return;
  const pipeline::PipelineStats s = stages_->after_step();
  summary_.bytes_sent += double(s.activation_bytes + s.gradient_bytes + s.data_parallel_bytes);
  summary_.comm_s += s.blocked_s;
}

Due TrainingRun::due_after(const UnitDone& unit, bool stop) {
  const int64_t step = unit.step;
  const bool last = step == max_steps() || unit.over;
  // DiLoCo replicas hold the global model only right after an outer step (the ranks that follow another's exchange
  // learn of it with `synced`): periodic checkpoints then (their model.safetensors is the global model), or at the
  // end. Every rank takes part in a multi-process checkpoint.
  const bool at_global = layout_.sync() != SyncKind::kDiloco || (averaging_gradients()) || unit.synced;
  const bool periodic = tc_.checkpoint_every > 0 && step % tc_.checkpoint_every == 0 && at_global && unit.quiescent;
  return {.last = last,
          .stop = stop,
          .eval = (tc_.eval_every > 0 && step % tc_.eval_every == 0) || last,
          .checkpoint = periodic || last || stop};
}

void TrainingRun::when_due(const UnitDone& unit, const Due& due) {
  const int64_t step = unit.step;
  if (due.eval || due.checkpoint) {
    faults_.before_checkpoint(step);
    if (members_) members_->before_checkpoint(step);  // a worker may have died since the last round
  }
  if (due.eval || due.checkpoint) sync_->before_read(parts_.params, parts_.aux_heads ? &parts_.aux_params : nullptr);
  if (lead_.is() && due.eval) {
    BatchLoader val(data_.val_tokens,
                    {.batch_size = tc_.batch_size, .context = config_.model.context, .shuffle = false},
                    fmt::format("'{}' val", config_.data.dir));
    const auto eval_start = Clock::now();
    const EvalResult result = evaluate(*parts_.model, val, tc_.eval_batches, device_);
    report_->evaluated(step, progress_.tokens, result, unit.elapsed_s, eval_seconds_, summary_);
    eval_seconds_ += seconds_since(eval_start);
  }
  if ((lead_.is() || layout_.distributed()) && due.checkpoint) save(step, unit.elapsed_s);
  if (due.last || due.stop)  // the numbers of the last steps, when they come late
    for (const StepResult& owed : step_.step->drain())
      record(owed, step, schedule_.lr(step - 1 - owed.lag), unit.elapsed_s);
}

// Between two steps: workers that asked to join in a round are admitted after its checkpoint; at any quiet step the
// lead heals those that asked since (ft/membership_follower.h).
void TrainingRun::between_units(const UnitDone& unit) {
  const auto heals = members_ ? members_->heals_due(unit.round) : MembershipFollower::Heals{};
  auto state = [&] {
    return heal_state(parts_.trained, *parts_.optimizer, *data_.loader, {unit.step, progress_.tokens, unit.elapsed_s});
  };
  // ZeRO-1 in a fault-tolerant island, a fault-tolerant pipeline: the member's ranks make the state a heal sends
  // together.
  const std::optional<HealState> gathered = sync_->heal_made_together(heals.any(), state);
  if (members_) members_->carry_out(unit.step, heals, [&] { return gathered ? *gathered : state(); });
  tokens_per_step_ = sync_->follow_lead(*data_.loader, tokens_per_step());
}

// A step's numbers into the summary and the log. A step that reports late (local stages) gives the numbers of the
// step `result.lag` steps before `step`, the one just run; `lr` is that earlier step's.
void TrainingRun::record(const StepResult& result, int64_t step, double lr, double now) {
  summary_.losses.push_back(result.loss);
  const int64_t of = step - result.lag;
  if (report_->log_due(of)) report_->log_step(of, progress_.tokens - result.lag * tokens_per_step(), result, lr, now);
}

TrainSummary TrainingRun::finish(bool stopped_early) {
  const int64_t step = progress_.step;
  if (stopped_early) {
    if (lead_.is())
      log::info("stopped after step {} (checkpoint '{}'); continue with --resume", step, summary_.checkpoint.string());
    summary_.stopped_early = true;
  }
  ReplicaRounds* rounds = this->rounds();
  if (rounds) count_traffic(rounds->take_stats());  // data parallel stopped between two log lines
  sync_->summarize(summary_);
  summary_.steps = step;
  summary_.lead = lead_.is();
  summary_.kind = layout_.kind();
  summary_.sync = layout_.sync();
  if (members_) summary_.reformations = members_->reformations();
  if (rounds) summary_.outer_steps = rounds->outer_steps();
  if (PipelineSync* pipelines = sync_->step_peers().pipelines)
    summary_.stages = stages_ ? stages_->gather(*pipelines, train_seconds_) : nlohmann::json::array();
  summary_.tokens = progress_.tokens;
  summary_.elapsed_s = elapsed();
  // The tokens the members trained while this process did (tokens_per_step() is the members' count at the end: a
  // run whose world shrank and grew again would count every step at the final size), against the launched
  // workers' peak (docs/architecture.md, "MFU").
  summary_.tokens_per_s = double(progress_.tokens - tokens_at_start_) / train_seconds_;
  summary_.mfu =
      std::min(1.0, summary_.tokens_per_s * flops_per_token_ / (summary_.peak_flops * options_.dist.world_size));
  report_->write_summary(summary_, layout_.name(), config_.dist.compression);
  return summary_;
}

}  // namespace tributary::detail
