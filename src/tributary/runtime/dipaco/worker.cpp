#include "tributary/runtime/dipaco/worker_impl.h"

namespace tributary {
namespace dipaco {

Worker::Worker(const RunConfig& config, const DistEnv& env, const TrainOptions& options)
    : config_(config),
      env_(env),
      device_(parse_device(config.train.device)),
      lead_(env.rank, env.rank == 0 && !env.joining),
      grid_(PathGrid::parse(config.dipaco.modules, config.model.num_levels, config.dipaco.private_stem,
                            "dipaco.modules")),
      module_ids_(grid_.modules()),
      rounds_(config.train.steps / config.dist.inner_steps),
      run_dir_(config.train.run_dir),
      slowdown_(config.dist.slow_workers, env.rank, env.world_size),
      // A restarted worker runs without the injected faults: they name its first life's steps.
      faults_(env.joining ? FaultPlan{} : options.faults, env.rank),
      schedule_{config.optim.lr, config.optim.warmup_steps, config.train.steps, config.optim.min_lr_ratio} {
  data_ = load_routed_paths(config_, grid_);

  if (slowdown_.factor() > 1)
    log::info("worker {} runs {}x slower (dist.slow_workers: a sleep after each inner step)", env_.rank,
              slowdown_.factor());
  const bool resuming = env_.joining ? rejoin() : start(options);
  report_ = std::make_unique<RunReport>(ReportSetup{.run_dir = run_dir_,
                                                    .lead = lead_.is(),
                                                    .resume_step = resuming ? round_ * config_.dist.inner_steps : -1,
                                                    .total_steps = config_.train.steps,
                                                    .world_size = env_.world_size,
                                                    .rank = env_.rank,
                                                    .own_metrics = fmt::format("metrics-rank{}.jsonl", env_.rank)});
  if (round_ > 0 && lead_.is()) log::info("DiPaCo: resuming after round {}", round_);
  if (lead_.is()) {
    write_file_atomic(run_dir_ / "config.toml", config_.to_toml());
    auto count = [&](const std::vector<std::string>& ids) { return held_->numel(ids); };
    log::info(
        "DiPaCo {} grid: {} paths over {} modules; {} parameters per path, {} in all; {} rounds of tau = {} "
        "inner steps; {} worker(s); routes '{}'",
        grid_.describe(), grid_.num_paths(), module_ids_.size(), count(grid_.modules_of_path(0)), count(module_ids_),
        rounds_, config_.dist.inner_steps, env_.world_size, config_.dipaco.routes);
  }
}

// A fresh run, or one resumed (--resume): every worker starts together. Returns whether it resumed.
bool Worker::start(const TrainOptions& options) {
  // Workers may each have their own run directory (path-local, asked for or chosen at start-up when the directories
  // are apart); only the lead's holds dipaco.json and the modules. A worker resuming in a directory without them
  // takes the round from the lead and its owned modules from its own outer-state files (the master copies); the rest
  // travels through the store.
  const bool from_lead = options.resume && !lead_.is() && !is_dipaco_run(run_dir_);
  std::optional<DipacoRun> resumed =
      from_lead ? std::nullopt
                : open_dipaco_run_dir(run_dir_, config_, options.resume, options.resume_from, options.overwrite);
  if (resumed) round_ = resumed->round;
  tally_.first_round = tally_.rounds = round_;
  const bool resuming = resumed.has_value() || from_lead;
  if (!resuming) clear_earlier_run(run_dir_, lead_.is());
  using std::chrono::milliseconds;
  ModuleSet initial = initial_modules(config_.model, grid_, static_cast<uint64_t>(config_.train.seed),
                                      resuming ? std::string() : config_.dipaco.init_from);
  if (resumed) adopt_modules(initial, resumed->modules, run_dir_);
  session_ = std::make_unique<Session>(config_, env_);  // the rendezvous (one process: an in-memory store)
  held_ =
      std::make_unique<HeldModules>(config_, grid_, env_.rank, env_.world_size, std::move(initial), session_->links());
  // Path-local uploads go point to point over the emulated links; the ring models its own.
  crew_ = std::make_unique<Crew>(*session_, config_.dipaco.path_local ? held_->link() : std::nullopt);

  const bool apart = env_.distributed() && run_dirs_apart();
  // dipaco.path_local, or directories apart; afterwards HeldModules::path_local() says it (it holds the depot).
  const bool path_local = config_.dipaco.path_local || apart;
  if (path_local && !config_.dipaco.path_local && held_->link())  // the uploads go over the emulated links
    crew_->regroup_as("dipaco/g0-local", held_->link());
  if (path_local && resuming) {
    round_ = agree_on_resumed_round(crew_->group(), round_, from_lead);
    tally_.first_round = tally_.rounds = round_;
  }
  held_->own(round_);
  if (resuming) load_outer_states(run_dir_, round_, held_->outer());
  if (!(path_local && resuming))  // path-local: a worker resumes its owned modules only
    held_->check_identical(crew_->group(),
                           resumed ? fmt::format("when resuming after round {}", round_) : std::string("at start"));
  if (path_local)
    held_->go_path_local(crew_->store(), milliseconds(int64_t(config_.dist.store_timeout_s * 1000)), round_);
  if (resuming && held_->feedback())
    load_feedback(run_dir_, round_, env_.rank, *held_->feedback(), held_->numel_by_index());
  const bool on_request = config_.dipaco.path_state == "holder";
  state_ = std::make_unique<PathState>(
      run_dir_, held_->depot(),
      PathStateOptions{env_.rank, on_request, milliseconds(int64_t(config_.dist.heartbeat_timeout_s * 1000))});
  if (held_->path_local() && on_request && env_.distributed()) state_->serve(session_->reconnect());
  if (path_local && resuming) republish_path_state(*state_, crew_->group(), grid_.num_paths(), round_);
  // Every worker got through start-up (the checks above are collectives): launch may go on without a dead one now.
  if (env_.distributed() && env_.rank == 0) {
    crew_->store().set(kPathLocalKey, held_->path_local() ? "1" : "0");  // what a restarted worker checks first
    crew_->store().set(kRunStartedKey, "1");
  }
  return resuming;
}

// A restarted worker (launch --max-restarts) becomes a member again at a round boundary: it asks to join, the members
// admit it after the round in which it asked (between_units, the same collectives in the same order as here), and it
// takes that round's state from the files every round leaves (resume.h): the modules, and the outer state of the
// modules it owns again, written after the round by the members that stood in for it. From its next round on it
// claims path tasks like any member. Path-local runs (modules and path state in the store, a run directory per
// machine) cannot take a worker back yet: it says so before it asks. Returns true (its metrics resume as a resume's).
bool Worker::rejoin() {
  using std::chrono::milliseconds;
  session_ = std::make_unique<Session>(config_, env_);  // the rendezvous: the same config and data as the run's
  crew_ = std::make_unique<Crew>(*session_, std::nullopt);
  if (crew_->store().check({kPathLocalKey}) && crew_->store().get(kPathLocalKey) == "1")
    fail(
        "worker {}: a path-local DiPaCo worker (dipaco.path_local, or run directories apart) cannot rejoin a running "
        "run yet: the others go on without it (launch --max-failures), or stop the run and continue it with --resume",
        env_.rank);
  log::info("worker {}: waiting to rejoin the DiPaCo run at the end of a round", env_.rank);
  if (!crew_->join(milliseconds(int64_t(config_.dist.store_timeout_s * 1000)))) {
    log::warn("worker {}: the run finished before it could rejoin", env_.rank);
    round_ = rounds_;
    outside_ = true;
    return true;
  }
  const DipacoRun run = load_resumable_dipaco_run(run_dir_, config_);  // the round the members just finished
  round_ = run.round;
  tally_.first_round = tally_.rounds = round_;
  ModuleSet modules = initial_modules(config_.model, grid_, static_cast<uint64_t>(config_.train.seed), "");
  adopt_modules(modules, run.modules, run_dir_);
  held_ =
      std::make_unique<HeldModules>(config_, grid_, env_.rank, env_.world_size, std::move(modules), session_->links());
  state_ = std::make_unique<PathState>(run_dir_, nullptr, PathStateOptions{.self = env_.rank});
  follow_members(round_);  // its modules' outer state from the round's files
  lead_.follow(crew_->membership().members());
  held_->check_identical(crew_->group(), fmt::format("when worker {} rejoined after round {}", env_.rank, round_));
  log::info("worker {} rejoined the DiPaCo run after round {} as worker {} of {} (epoch {})", env_.rank, round_,
            crew_->membership().rank(), crew_->membership().size(), crew_->membership().epoch());
  return true;
}

// After the members changed (a departure, an admission) as of round `round`: who owns which module, whose path
// state is live, and the group and its exchange over the members. A module this worker takes over (its owner died,
// or the members' count moved it; a joiner's own again) goes on from the outer state its last owner wrote after the
// last complete round (momentum included): the step is the one that owner would have taken. Where no such file is in
// this worker's run directory (the first round; a path-local owner's own directory) momentum restarts at zero.
void Worker::follow_members(int64_t round) {
  const std::vector<int>& members = crew_->membership().members();
  const OuterStates taken = held_->set_members(members, round);
  state_->set_live(members);
  crew_->regroup(held_->path_local() ? held_->link() : std::nullopt, held_->link());
  const std::vector<std::string> fresh = take_over_outer_states(run_dir_, round, taken);
  if (round > 0 && !fresh.empty())
    log::warn(
        "DiPaCo round {}: worker {} takes over module(s) {} without their outer state (momentum restarts at "
        "zero): their owner's files are not in this worker's run directory",
        round + 1, env_.rank, fmt::join(fresh, ", "));
}

// Between rounds: the restarted workers that asked to join during the round become members (rejoin() is their side).
// A joiner that dies meanwhile is dropped by the next round's settle, as any member would be.
void Worker::between_units(const UnitDone&) {
  const std::vector<int> joiners = crew_->admit();
  if (joiners.empty()) return;
  try {
    follow_members(round_);
    held_->check_identical(crew_->group(), fmt::format("after worker(s) {} rejoined", fmt::join(joiners, ", ")));
  } catch (const NetworkError& e) {
    log::warn("DiPaCo: admitting worker(s) {} failed ({}); the next round re-forms without the dead",
              fmt::join(joiners, ", "), comm::error_text(e));
    return;
  }
  if (lead_.is()) {
    const std::vector<int>& members = crew_->membership().members();
    log::warn("DiPaCo: worker(s) {} rejoined after round {}; {} worker(s) go on: {}", fmt::join(joiners, ", "), round_,
              members.size(), fmt::join(members, ", "));
    report_->write({{"step", round_ * config_.dist.inner_steps}, {"event", "join"}, {"workers", joiners}});
  }
}

// The owners' ring keeps every path's AdamW state and early-stopping copy in the shared run directory; path-local
// workers move them through the run's store, so each machine may keep its own directory. Every worker learns which
// workers see the lead's directory (one probe file, one all-gather), and all act alike: apart, a ring run goes
// path-local (the same outer steps, the paper's data flow: ~1e-6 from the ring's sums), and says so.
bool Worker::run_dirs_apart() {
  comm::Group& group = crew_->group();
  const CheckpointPeers peers{.rank = group.rank(),
                              .size = group.size(),
                              .barrier = [&group] { group.barrier(); },
                              .all_gather = [&group](const torch::Tensor& t) { return group.all_gather(t); }};
  if (lead_.is()) fs::create_directories(run_dir_);  // a fresh run's: its files come later
  const std::vector<int> apart = ranks_apart_from_lead(peers, run_dir_);
  if (apart.empty()) return false;
  if (lead_.is())
    log::info(
        "train.run_dir '{}' is not shared with worker(s) {} (another machine, no shared filesystem): path-local{}, "
        "each keeps its own; this one holds the modules, the metrics and summary.json",
        run_dir_.string(), fmt::join(apart, ", "),
        config_.dipaco.path_local ? ""
                                  : " (dipaco.path_local = false asks for the owners' ring, which keeps every path's "
                                    "state in one shared directory; the paths' state moves through the run's store "
                                    "instead)");
  return true;
}

// A round is DiPaCo's unit of resumable progress: a stop (signal or --stop-after-step) waits for the round's end.
StopAgreement::Vote Worker::stop_vote() {
  return [this](bool local_stop) {
    if (!env_.distributed()) return local_stop;
    std::vector<torch::Tensor> vote = {torch::full({1}, local_stop ? 1.0f : 0.0f)};
    crew_->group().all_reduce_sum(vote);
    return vote[0].item<float>() > 0;
  };
}

TrainSummary Worker::finish(bool stopped_early) {
  TrainSummary summary;
  summary.kind = RunKind::kDipaco;
  summary.sync = SyncKind::kModules;
  summary.run_dir = summary.checkpoint = run_dir_;  // what `eval` and `export-path` read
  if (outside_) return summary;
  if (stopped_early && lead_.is())
    log::info("stopped after round {} (step {}); continue with --resume", round_, round_ * config_.dist.inner_steps);
  const int64_t tau = config_.dist.inner_steps;
  summary.elapsed_s = seconds_since(start_);
  summary.outer_steps = tally_.rounds;
  summary.steps = tally_.rounds * tau;
  // Every path trains tau steps a round: the tokens of the tasks that counted (dropped ones did not); tokens/s over
  // this invocation's rounds.
  const int64_t task_tokens = tau * config_.train.batch_size * config_.model.context;
  summary.tokens = (tally_.rounds * grid_.num_paths() - tally_.tasks_dropped) * task_tokens;
  const int64_t here = (tally_.rounds - tally_.first_round) * grid_.num_paths() - tally_.tasks_dropped;
  summary.tokens_per_s = summary.elapsed_s > 0 ? double(here * task_tokens) / summary.elapsed_s : 0.0;
  summary.num_parameters = held_->numel(module_ids_);
  summary.bytes_sent = tally_.bytes_sent;
  summary.bytes_recv = tally_.bytes_recv;
  summary.comm_s = tally_.comm_s;
  summary.world_size = env_.world_size;
  summary.reformations = crew_->membership().epoch();
  summary.stopped_early = stopped_early;
  summary.lead = lead_.is();
  if (lead_.is()) {
    state_->gather_best(grid_.num_paths());
    auto routed = evaluate_routed(run_dir_, false, config_.dipaco.eval_units, device_);
    auto early = evaluate_routed(run_dir_, true, config_.dipaco.eval_units, device_);
    summary.evaluated = true;
    summary.val_loss = routed.loss;
    summary.val_ppl = std::exp(routed.loss);
    summary.val_loss_early = early.loss;
    // Routed validation scores tokens after the routing prefix: no bits per byte, no unigram baseline; no MFU either
    // (the paths' compute is not measured against a peak).
    summary.details = {{"modules", grid_.describe()},
                       {"paths", grid_.num_paths()},
                       {"rounds", tally_.rounds},
                       {"val_loss_early_stopped", early.loss},
                       {"val_ppl_early_stopped", std::exp(early.loss)},
                       {"eval_tokens", routed.num_tokens},
                       {"units_per_path", routed.units_per_path},
                       {"loss_per_path", routed.loss_per_path},
                       {"tasks_dropped", tally_.tasks_dropped},
                       {"val_bpb", nullptr},
                       {"unigram_bpb", nullptr},
                       {"mfu", nullptr},
                       {"peak_flops", nullptr}};
    report_->write_summary(summary, "dipaco", config_.dist.compression);
    log::info(
        "DiPaCo {}: routed val loss {:.4f} (ppl {:.3f}) on tokens after the {}-token prefix; early-stopped "
        "{:.4f} (ppl {:.3f})",
        grid_.describe(), routed.loss, summary.val_ppl, kRoutingPrefix, early.loss, std::exp(early.loss));
  }
  if (env_.distributed()) {
    if (lead_.is()) crew_->finish();  // a worker still waiting to rejoin gives up
    crew_->group().barrier();         // the leader hosts the store: others leave only after the evaluation
  }
  return summary;
}

void Worker::train_task(int64_t p, int64_t round) {
  const auto& tc = config_.train;
  const int64_t T = config_.model.context, tau = config_.dist.inner_steps;
  const auto task_start = Clock::now();
  const ModuleSet view = held_->path_view(p, round);  // path-local: fetched now, dropped when the task ends
  Transformer model(config_.model, grid_.path_modules(p));
  load_path(model, grid_, view, p);
  model.to(device_);
  model.train();
  NamedTensors params = named_parameters_of(model);
  AdamW optimizer(params, {.beta1 = config_.optim.beta1,
                           .beta2 = config_.optim.beta2,
                           .eps = config_.optim.eps,
                           .weight_decay = config_.optim.weight_decay});
  const bool keep_state = config_.dipaco.inner_state == "travel";
  if (keep_state)
    if (auto f = state_->inner(p, round - 1)) optimizer.load_state(*f, std::stoll(f->metadata().at("steps")));
  BatchLoader loader(
      data_[p].train,
      {.batch_size = tc.batch_size, .context = T, .seed = static_cast<uint64_t>(tc.seed + p), .stride = T + 1},
      fmt::format("path {} shard", p));
  const uint64_t consumed = static_cast<uint64_t>(round * tau * tc.batch_size);
  const uint64_t per_epoch = static_cast<uint64_t>(loader.num_windows());
  loader.set_position({consumed / per_epoch, consumed % per_epoch});
  // The inner steps are the trainer's dense step (runtime/step_runner.h) on the path's model.
  DenseStep inner({model, params, optimizer, loader, nullptr, device_, 1, config_.optim.grad_clip,
                   config_.train.precision == "bf16"});
  double loss_sum = 0;
  for (int64_t i = 0; i < tau; ++i) {
    const int64_t step = round * tau + i;
    try {
      const auto step_start = Clock::now();
      loss_sum += inner.run(step, schedule_.lr(step)).loss;
      slowdown_.after_step(seconds_since(step_start));
    } catch (const Error& e) {
      fail("path {}: {} (or lower dist.outer_lr)", p, e.what());
    }
    faults_.after_step(++inner_steps_done_);  // counts this worker's steps over all its tasks
  }
  // Pseudo-gradients per module, weighted by the shard size.
  {
    torch::NoGradGuard no_grad;
    for (auto& [module, tensors] : split_by_module(params, grid_, p)) {
      const auto& g = view.at(module);
      std::vector<torch::Tensor> delta;
      for (size_t k = 0; k < tensors.size(); ++k) {
        TRIB_CHECK_EQ(g[k].first, tensors[k].first, "(module tensor order)");
        delta.push_back(g[k].second - tensors[k].second.detach().to(torch::kCPU, torch::kFloat32));
      }
      accs_[module].add(data_[p].weight, delta);
    }
  }
  // Early stopping: keep the path's parameters from the round with the lowest held-out loss.
  double holdout = 0;
  if (data_[p].holdout.defined()) {
    holdout = evaluate_units(model, data_[p].holdout, kRoutingPrefix, device_).mean();
    if (holdout < state_->best_holdout(p)) state_->save_best(p, round, holdout, tensors_to_safetensors(params));
  }
  if (keep_state)
    state_->save_inner(p, round,
                       tensors_to_safetensors(optimizer.state(), {{"steps", std::to_string(optimizer.num_steps())}}));
  const double dt = seconds_since(task_start);
  compute_s_ += dt;
  // step/tokens count one path's inner steps (every path takes the same number), so `tributary plot` works.
  report_->write({{"round", round},
                  {"path", p},
                  {"worker", env_.rank},
                  {"step", (round + 1) * tau},
                  {"tokens", (round + 1) * tau * tc.batch_size * T},
                  {"loss", loss_sum / double(tau)},
                  {"holdout_loss", holdout},
                  {"task_s", dt},
                  {"tokens_per_s", double(tau * tc.batch_size * T) / dt}});
  log::info("round {:>3}/{} | path {:>3} | loss {:.4f} | held-out {:.4f} | {:.1f} s", round + 1, rounds_, p,
            loss_sum / double(tau), holdout, dt);
}

// The quorum's decision on the round's tasks (comm/membership.h: every member votes once it ran out of tasks, the
// first decision written wins). A round without a death settles at once; otherwise the survivors re-form (a new epoch
// and group) and the dead workers' tasks are lost: re-queued as the next generation or dropped (dipaco.on_failure).
Verdict Worker::settle(int64_t round, int64_t gen, const std::vector<int64_t>& round_tasks) {
  const std::optional<Departure> departure = crew_->settle(round, gen, round_tasks);
  if (!departure) return {};
  const std::vector<int>& left = departure->left;
  const std::vector<int64_t>& lost = departure->lost;
  const std::vector<int>& members = crew_->membership().members();
  Verdict verdict;
  if (!lost.empty() && config_.dipaco.on_failure == "requeue") {
    verdict.again = true;
    verdict.tasks = lost;
  } else {
    verdict.dropped = lost;
  }
  follow_members(round);
  if (lead_.follow(members)) {  // the leader died: this worker writes the run's files from this round on
    log::warn("DiPaCo: worker {} leads the run from round {} on (the leader died)", env_.rank, round + 1);
    report_->take_lead(round * config_.dist.inner_steps);
    report_->write({{"step", round * config_.dist.inner_steps}, {"event", "lead"}, {"lead_worker", env_.rank}});
  }
  if (lead_.is()) {
    log::warn(
        "DiPaCo round {}: worker(s) {} left the run (dead, or silent past dist.heartbeat_timeout_s); {} task(s) "
        "lost{}{}",
        round + 1, fmt::join(left, ", "), lost.size(), lost.empty() ? "" : ": ", fmt::join(lost, ", "));
    log::warn("DiPaCo: continuing with {} worker(s): {}", members.size(), fmt::join(members, ", "));
  }
  return verdict;
}

// Tasks until the queue is empty; then the leader's verdict: done, or a new generation of re-queued tasks; then the
// exchange. Path-local: the owners apply the exchange only once a verdict after it finds every member alive; a death
// during it re-queues the dead worker's tasks like one during the tasks, and the exchange runs again without it.
Worker::RoundWork Worker::tasks_and_exchange(int64_t round) {
  std::vector<int64_t> round_tasks(static_cast<size_t>(grid_.num_paths()));
  std::iota(round_tasks.begin(), round_tasks.end(), 0);
  RoundWork work;
  int64_t gen = 0;
  Verdict verdict{.again = true, .tasks = round_tasks};
  std::vector<int64_t> prefer = std::exchange(trained_, {});
  if (!held_->path_local()) prefer.clear();  // a shared directory holds every path's state alike
  const auto settle_next = [&] {
    verdict = settle(round, gen++, round_tasks);
    work.dropped.insert(work.dropped.end(), verdict.dropped.begin(), verdict.dropped.end());
  };
  const ExchangeGate gate = [&] {
    const int epoch = crew_->membership().epoch();
    settle_next();
    return !verdict.again && crew_->membership().epoch() == epoch;
  };
  for (bool exchanged = false; !exchanged;) {
    for (; verdict.again; settle_next()) {
      const std::vector<int64_t> tasks = verdict.tasks;
      while (auto p = crew_->queue().claim(round, gen, tasks, prefer)) {
        trained_.push_back(*p);
        train_task(*p, round);
        crew_->queue().done(round, *p);
        work.tasks += 1;
      }
    }
    faults_.in_exchange(round + 1);
    const auto comm_start = Clock::now();
    try {
      std::tie(work.sent, work.recv) =
          held_->reduce(round, (round + 1) * config_.dist.inner_steps, accs_, crew_->group(), crew_->exchange(), gate);
      if (!held_->path_local()) held_->check_identical(crew_->group(), fmt::format("after round {}", round + 1));
      exchanged = true;
    } catch (const ExchangeAborted& e) {
      log::warn("DiPaCo round {}: a worker died during the exchange ({}); it runs again with worker(s) {}", round + 1,
                comm::error_text(e), fmt::join(crew_->membership().members(), ", "));
    }
    work.comm_s += seconds_since(comm_start);
  }
  return work;
}

UnitDone Worker::next() {
  const int64_t round = round_++;
  const auto round_start = Clock::now();
  accs_.clear();
  compute_s_ = 0;
  const RoundWork work = tasks_and_exchange(round);
  tally_.tasks_run += work.tasks;
  tally_.tasks_dropped += static_cast<int64_t>(work.dropped.size());
  // Path-local: the upload plus what went through the store (module values, path state), per direction.
  const DepotBytes depot = held_->take_depot_bytes();
  const double state_put = depot.state_put + state_->take_served_bytes();  // served: sent to the store for an asker
  const double sent = work.sent + depot.published + state_put;
  const double recv = work.recv + depot.fetched + depot.state_got;
  tally_.bytes_sent += sent;
  tally_.bytes_recv += recv;
  tally_.comm_s += work.comm_s;
  tally_.rounds = round + 1;
  nlohmann::json line{{"outer_step", round + 1},
                      {"round", round + 1},
                      {"step", (round + 1) * config_.dist.inner_steps},
                      {"bytes_sent", sent},
                      {"bytes_recv", recv},
                      {"comm_s", work.comm_s},
                      {"compute_s", compute_s_},
                      {"tasks", work.tasks},
                      {"dropped", work.dropped},
                      {"members", crew_->membership().members()},
                      {"modelled_link_s", held_->modelled_s()},
                      {"round_s", seconds_since(round_start)},
                      {"elapsed_s", seconds_since(start_)}};
  if (held_->path_local()) {
    line["bytes_up"] = work.sent;  // pseudo-gradients (+ weights, + the touched mask) to the owners
    line["bytes_published"] = depot.published;
    line["bytes_fetched"] = depot.fetched;
    line["bytes_state"] = state_put + depot.state_got;
    line["bytes_state_put"] = state_put;
    line["bytes_state_got"] = depot.state_got;  // what the path state cost this worker to fetch (0 for its own paths)
    line["fetch_s"] = depot.fetch_s;
  }
  report_->write(line);
  save_outer_states(run_dir_, round + 1, held_->outer());  // resume.h: before dipaco.json says the round is done
  if (held_->feedback()) save_feedback(run_dir_, round + 1, env_.rank, *held_->feedback());
  if (env_.distributed()) crew_->group().barrier();
  if (lead_.is()) save_round_as_leader(round);  // the round is a checkpoint: it is done once its files are
  if (lead_.is())
    log::info("round {:>3}/{} done | {} task(s) here | {:.2f} MB sent | comm {:.1f} s of {:.1f} s{}", round + 1,
              rounds_, work.tasks, sent / 1e6, work.comm_s, seconds_since(round_start),
              work.dropped.empty() ? std::string() : fmt::format(" | dropped paths {}", fmt::join(work.dropped, ", ")));
  return {.step = round_ * config_.dist.inner_steps,
          .quiescent = true,
          .synced = true,
          .round = true,
          .elapsed_s = seconds_since(start_)};
}

// Every round is a checkpoint (next() wrote its files); the routed validation every dipaco.eval_every_rounds (the
// last round's is finish()'s).
Due Worker::due_after(const UnitDone& unit, bool stop) {
  const int64_t every = config_.dipaco.eval_every_rounds;
  const bool last = round_ == rounds_;
  return {.last = last, .stop = stop, .eval = every > 0 && round_ % every == 0 && !last, .checkpoint = true};
}

// The leader's module files (path-local: it fetches every module, the checkpoint's cost, not counted in the round's
// bytes).
void Worker::save_round_as_leader(int64_t round) {
  save_modules(run_dir_, config_, grid_, held_->all(round + 1), round + 1);
  held_->take_depot_bytes();
}

void Worker::when_due(const UnitDone& unit, const Due& due) {
  if (lead_.is() && due.eval) {
    const auto eval_start = Clock::now();
    const auto routed = evaluate_routed(run_dir_, false, config_.dipaco.eval_units, device_);
    eval_s_ += seconds_since(eval_start);
    // elapsed_s includes every evaluation so far (eval_s): the others wait for the leader at the next settle.
    report_->write({{"round", round_},
                    {"step", unit.step},
                    {"val_loss", routed.loss},
                    {"val_ppl", std::exp(routed.loss)},
                    {"eval_s", eval_s_},
                    {"elapsed_s", seconds_since(start_)}});
    log::info("round {:>3}/{} | routed val loss {:.4f} (ppl {:.3f})", round_, rounds_, routed.loss,
              std::exp(routed.loss));
  }
}

}  // namespace dipaco

std::unique_ptr<WorkSource> dipaco::make_path_rounds(const RunConfig& config, const TrainOptions& options) {
  const DistEnv& env = options.dist;
  if (env.distributed()) log::set_prefix(getenv("TRIBUTARY_LAUNCHED") ? "" : fmt::format("[rank {}] ", env.rank));
  configure_threads(config.train.threads, env.local_world_size);
  return std::make_unique<Worker>(config, env, options);
}

}  // namespace tributary
