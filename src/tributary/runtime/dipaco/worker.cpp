#include "tributary/runtime/dipaco/worker_impl.h"

namespace tributary {
namespace dipaco {

Worker::Worker(const RunConfig& config, const DistEnv& env, const TrainOptions& options)
    : config_(config),
      env_(env),
      device_(parse_device(config.train.device)),
      lead_(env.rank == 0),
      grid_(PathGrid::parse(config.dipaco.modules, config.model.num_levels, config.dipaco.private_stem,
                            "dipaco.modules")),
      module_ids_(grid_.modules()),
      rounds_(config.train.steps / config.dist.inner_steps),
      run_dir_(config.train.run_dir),
      slowdown_(config.dist.slow_workers, env.rank, env.world_size),
      faults_(options.faults, env.rank),
      schedule_{config.optim.lr, config.optim.warmup_steps, config.train.steps, config.optim.min_lr_ratio},
      exchange_options_{.codec = config.dist.compression,
                        .bucket_mb = config.dist.bucket_mb,
                        .link = wan_link_model_or_none(config.dist.wan, env.world_size),
                        .seed = static_cast<uint64_t>(config.train.seed)} {
  data_ = load_routed_paths(config_, grid_);

  if (slowdown_.factor() > 1)
    log::info("worker {} runs {}x slower (dist.slow_workers: a sleep after each inner step)", env_.rank,
              slowdown_.factor());
  // Path-local workers may each have their own run directory; only the lead's holds dipaco.json and the modules. A
  // worker resuming in a directory without them takes the round from the lead and its owned modules from its own
  // outer-state files (the master copies); the rest travels through the store.
  const bool from_lead = options.resume && config_.dipaco.path_local && !lead_ && !is_dipaco_run(run_dir_);
  std::optional<DipacoRun> resumed =
      from_lead ? std::nullopt
                : open_dipaco_run_dir(run_dir_, config_, options.resume, options.resume_from, options.overwrite);
  if (resumed) start_round_ = resumed->round;
  const bool resuming = resumed.has_value() || from_lead;
  if (!resuming) clear_earlier_run(run_dir_, lead_);
  // Store, group, exchange, queue. A single process uses an in-memory store and a group of one.
  using std::chrono::milliseconds;
  std::optional<comm::Store> heartbeat_store;
  if (env_.distributed()) {
    store_ = rendezvous(config_, env_);
    heartbeat_store = comm::Store::connect(env_.master_addr, env_.master_port, env_.rank, env_.world_size, true,
                                           env_.store_prefix + "/tributary",
                                           milliseconds(int64_t(config_.dist.store_timeout_s * 1000)));
  } else {
    store_ = heartbeat_store = comm::Store::in_memory();
  }
  members_.resize(static_cast<size_t>(env_.world_size));
  std::iota(members_.begin(), members_.end(), 0);
  ModuleSet initial = initial_modules(config_.model, grid_, static_cast<uint64_t>(config_.train.seed),
                                      resuming ? std::string() : config_.dipaco.init_from);
  if (resumed) adopt_modules(initial, resumed->modules, run_dir_);
  held_ = std::make_unique<HeldModules>(config_, grid_, env_.rank, env_.world_size, std::move(initial));
  comm::GroupOptions group_opts = group_options(config_);
  // Path-local uploads go point to point over the emulated links; the ring models its own (exchange_options_.link).
  if (config_.dipaco.path_local) group_opts.link = held_->link();
  group_ = std::make_unique<comm::Group>(*store_, env_.rank, env_.world_size, group_opts, "dipaco/g0");
  exchange_ = std::make_unique<comm::Exchange>(*group_, exchange_options_);
  queue_ = std::make_unique<TaskQueue>(*store_, *heartbeat_store, env_.rank, config_.dist.heartbeat_timeout_s);

  if (config_.dipaco.path_local && resuming) start_round_ = agree_on_resumed_round(*group_, start_round_, from_lead);
  held_->own(start_round_);
  if (resuming) load_outer_states(run_dir_, start_round_, held_->outer());
  if (!(config_.dipaco.path_local && resuming))  // path-local: a worker resumes its owned modules only
    held_->check_identical(
        *group_, resumed ? fmt::format("when resuming after round {}", start_round_) : std::string("at start"));
  if (config_.dipaco.path_local)
    held_->go_path_local(*store_, milliseconds(int64_t(config_.dist.store_timeout_s * 1000)), start_round_);
  if (resuming && held_->feedback())
    load_feedback(run_dir_, start_round_, env_.rank, *held_->feedback(), held_->numel_by_index());
  const bool on_request = config_.dipaco.path_state == "holder";
  state_ = std::make_unique<PathState>(
      run_dir_, held_->depot(),
      PathStateOptions{env_.rank, on_request, milliseconds(int64_t(config_.dist.heartbeat_timeout_s * 1000))});
  if (held_->path_local() && on_request && env_.distributed()) state_->serve(reconnect_store(config_, env_));
  if (config_.dipaco.path_local && resuming) republish_path_state(*state_, *group_, grid_.num_paths(), start_round_);
  // Every worker got through start-up (the checks above are collectives): launch may go on without a dead one now.
  if (env_.distributed() && env_.rank == 0) store_->set(kRunStartedKey, "1");
  metrics_ = std::make_unique<MetricsWriter>(
      run_dir_ / (lead_ ? std::string("metrics.jsonl") : fmt::format("metrics-rank{}.jsonl", env_.rank)),
      resuming ? start_round_ * config_.dist.inner_steps : -1, lead_ ? run_dir_ / "tb" : fs::path());
  if (lead_) {
    write_file_atomic(run_dir_ / "config.toml", config_.to_toml());
    auto count = [&](const std::vector<std::string>& ids) { return held_->numel(ids); };
    log::info(
        "DiPaCo {} grid: {} paths over {} modules; {} parameters per path, {} in all; {} rounds of tau = {} "
        "inner steps; {} worker(s); routes '{}'",
        grid_.describe(), grid_.num_paths(), module_ids_.size(), count(grid_.modules_of_path(0)), count(module_ids_),
        rounds_, config_.dist.inner_steps, env_.world_size, config_.dipaco.routes);
  }
}

bool Worker::stop_agreed(bool local_stop) {
  if (!env_.distributed()) return local_stop;
  std::vector<torch::Tensor> vote = {torch::full({1}, local_stop ? 1.0f : 0.0f)};
  group_->all_reduce_sum(vote);
  return vote[0].item<float>() > 0;
}

TrainSummary Worker::finish(bool stopped_early) {
  TrainSummary summary;
  summary.kind = RunKind::kDipaco;
  summary.run_dir = run_dir_;
  summary.elapsed_s = seconds_since(start_);
  summary.outer_steps = tally_.rounds;
  summary.steps = tally_.rounds * config_.dist.inner_steps;
  summary.bytes_sent = tally_.bytes_sent;
  summary.bytes_recv = tally_.bytes_recv;
  summary.comm_s = tally_.comm_s;
  summary.world_size = env_.world_size;
  summary.stopped_early = stopped_early;
  summary.lead = lead_;
  if (lead_) {
    state_->gather_best(grid_.num_paths());
    auto routed = evaluate_routed(run_dir_, false, config_.dipaco.eval_units, device_);
    auto early = evaluate_routed(run_dir_, true, config_.dipaco.eval_units, device_);
    summary.evaluated = true;
    summary.val_loss = routed.loss;
    summary.val_ppl = std::exp(routed.loss);
    summary.val_loss_early = early.loss;
    nlohmann::json j = {{"algorithm", "dipaco"},
                        {"modules", grid_.describe()},
                        {"paths", grid_.num_paths()},
                        {"rounds", tally_.rounds},
                        {"val_loss", routed.loss},
                        {"val_ppl", summary.val_ppl},
                        {"val_loss_early_stopped", early.loss},
                        {"val_ppl_early_stopped", std::exp(early.loss)},
                        {"eval_tokens", routed.num_tokens},
                        {"units_per_path", routed.units_per_path},
                        {"loss_per_path", routed.loss_per_path},
                        {"bytes_sent", tally_.bytes_sent},
                        {"bytes_recv", tally_.bytes_recv},
                        {"comm_s", tally_.comm_s},
                        {"tasks_dropped", tally_.tasks_dropped},
                        {"elapsed_s", summary.elapsed_s},
                        {"world_size", env_.world_size}};
    write_file_atomic(run_dir_ / "summary.json", j.dump(2) + "\n");
    log::info(
        "DiPaCo {}: routed val loss {:.4f} (ppl {:.3f}) on tokens after the {}-token prefix; early-stopped "
        "{:.4f} (ppl {:.3f})",
        grid_.describe(), routed.loss, summary.val_ppl, kRoutingPrefix, early.loss, std::exp(early.loss));
  }
  if (env_.distributed()) group_->barrier();  // the leader hosts the store: others leave only after the evaluation
  return summary;
}

}  // namespace dipaco

TrainSummary train_dipaco(const RunConfig& config, const TrainOptions& options) {
  const DistEnv& env = options.dist;
  if (env.distributed()) log::set_prefix(getenv("TRIBUTARY_LAUNCHED") ? "" : fmt::format("[rank {}] ", env.rank));
  configure_threads(config.train.threads, env.local_world_size);
  dipaco::Worker worker(config, env, options);
  const int64_t rounds = config.train.steps / config.dist.inner_steps, tau = config.dist.inner_steps;
  if (worker.start_round() > 0 && env.rank == 0) log::info("DiPaCo: resuming after round {}", worker.start_round());
  // A round is DiPaCo's unit of resumable progress: a stop (signal or --stop-after-step) waits for the round's end.
  StopAgreement stop([&](bool local) { return worker.stop_agreed(local); }, options.stop_after_step, worker.lead());
  bool stopped = false;
  for (int64_t round = worker.start_round(); round < rounds; ++round) {
    worker.run_round(round);
    if (round + 1 < rounds && stop.after_step((round + 1) * tau, true)) {
      if (worker.lead())
        log::info("stopped after round {} (step {}); continue with --resume", round + 1, (round + 1) * tau);
      stopped = true;
      break;
    }
  }
  return worker.finish(stopped);
}

}  // namespace tributary
