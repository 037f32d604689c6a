#include "tributary/runtime/dipaco/worker.h"

#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>

#include "tributary/comm/exchange.h"
#include "tributary/comm/group.h"
#include "tributary/core/clock.h"
#include "tributary/core/error.h"
#include "tributary/core/hash.h"
#include "tributary/core/log.h"
#include "tributary/data/dataset.h"
#include "tributary/data/loader.h"
#include "tributary/optim/adamw.h"
#include "tributary/optim/outer.h"
#include "tributary/optim/schedule.h"
#include "tributary/routing/router.h"
#include "tributary/routing/units.h"
#include "tributary/runtime/dipaco/routes.h"
#include "tributary/runtime/flops.h"
#include "tributary/runtime/wan.h"
#include "tributary/runtime/inference.h"
#include "tributary/runtime/metrics.h"
#include "tributary/runtime/dipaco/modules.h"
#include "tributary/runtime/json_file.h"
#include "tributary/runtime/rendezvous.h"
#include "tributary/runtime/run_report.h"
#include "tributary/runtime/slowdown.h"
#include "tributary/runtime/step_runner.h"
#include "tributary/runtime/dipaco/held_modules.h"
#include "tributary/runtime/dipaco/path_data.h"
#include "tributary/runtime/dipaco/path_state.h"
#include "tributary/runtime/dipaco/resume.h"
#include "tributary/runtime/dipaco/routed_eval.h"
#include "tributary/runtime/dipaco/task_queue.h"

namespace tributary {
namespace {

// One process of a DiPaCo run: its connection to the others (store, group, exchange, task queue), the global
// modules it holds, and the outer optimizers of the modules it owns. A round: tasks -> settle -> one ring -> save.
class Worker {
 public:
  Worker(const RunConfig& config, const DistEnv& env, const TrainOptions& options);
  int64_t start_round() const { return start_round_; }  // > 0 when resumed
  void run_round(int64_t round);
  DipacoSummary finish();

 private:
  void load_routed_data();
  void train_task(int64_t path, int64_t round);
  void settle(int64_t round, int64_t gen, const std::vector<int64_t>& round_tasks, Verdict& verdict);
  int group_rank_of(int worker) const {
    return static_cast<int>(std::find(members_.begin(), members_.end(), worker) - members_.begin());
  }

  RunConfig config_;
  DistEnv env_;
  torch::Device device_;
  bool lead_;  // the lowest live worker: writes the module files, metrics.jsonl (rank 0) and the summary
  PathGrid grid_;
  std::vector<std::string> module_ids_;
  int64_t rounds_;
  int64_t start_round_ = 0;
  fs::path run_dir_;
  Slowdown slowdown_;  // dist.slow_workers
  std::vector<PathData> data_;
  CosineSchedule schedule_;
  comm::ExchangeOptions exchange_options_;
  std::optional<comm::Store> store_;
  std::unique_ptr<comm::Group> group_;
  std::unique_ptr<comm::Exchange> exchange_;
  std::unique_ptr<TaskQueue> queue_;
  std::unique_ptr<MetricsWriter> metrics_;
  std::unique_ptr<HeldModules> held_;  // the global modules this worker holds, the outer state of those it owns
  std::unique_ptr<PathState> state_;   // inner AdamW state and early-stopping copies, per path
  std::vector<int> members_;           // live workers, ascending
  std::map<std::string, ModuleAccumulator> accs_;                 // this round's contributions, by module
  std::vector<int64_t> trained_;  // the paths this worker trained last round (path-local: claimed first, see claim())
  int64_t inner_steps_done_ = 0;
  double compute_s_ = 0;
  double eval_s_ = 0;  // the leader's routed validations during the run (dipaco.eval_every_rounds)
  Clock::time_point start_ = Clock::now();
  DipacoSummary summary_;
};

Worker::Worker(const RunConfig& config, const DistEnv& env, const TrainOptions& options)
    : config_(config), env_(env), device_(parse_device(config.train.device)), lead_(env.rank == 0),
      grid_(PathGrid::parse(config.dipaco.modules, config.model.num_levels, config.dipaco.private_stem,
                            "dipaco.modules")),
      module_ids_(grid_.modules()), rounds_(config.train.steps / config.dist.inner_steps),
      run_dir_(config.train.run_dir), slowdown_(config.dist.slow_workers, env.rank, env.world_size),
      schedule_{config.optim.lr, config.optim.warmup_steps, config.train.steps, config.optim.min_lr_ratio},
      exchange_options_{.codec = config.dist.compression, .bucket_mb = config.dist.bucket_mb, .link = wan_link_model_or_none(config.dist.wan, env.world_size),
                        .seed = static_cast<uint64_t>(config.train.seed)} {
  load_routed_data();

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
  queue_ = std::make_unique<TaskQueue>(*store_, *heartbeat_store, env_.rank, config_.dipaco.heartbeat_timeout_s);

  if (config_.dipaco.path_local && resuming) start_round_ = agree_on_resumed_round(*group_, start_round_, from_lead);
  held_->own(start_round_);
  if (resuming) load_outer_states(run_dir_, start_round_, held_->outer());
  if (!(config_.dipaco.path_local && resuming))  // path-local: a worker resumes its owned modules only
    held_->check_identical(*group_, resumed ? fmt::format("when resuming after round {}", start_round_)
                                            : std::string("at start"));
  if (config_.dipaco.path_local)
    held_->go_path_local(*store_, milliseconds(int64_t(config_.dist.store_timeout_s * 1000)), start_round_);
  if (resuming && held_->feedback())
    load_feedback(run_dir_, start_round_, env_.rank, *held_->feedback(), held_->numel_by_index());
  const bool on_request = config_.dipaco.path_state == "holder";
  state_ = std::make_unique<PathState>(
      run_dir_, held_->depot(),
      PathStateOptions{env_.rank, on_request, milliseconds(int64_t(config_.dipaco.heartbeat_timeout_s * 1000))});
  if (held_->path_local() && on_request && env_.distributed()) state_->serve(reconnect_store(config_, env_));
  if (config_.dipaco.path_local && resuming) republish_path_state(*state_, *group_, grid_.num_paths(), start_round_);
  metrics_ = std::make_unique<MetricsWriter>(
      run_dir_ / (lead_ ? std::string("metrics.jsonl") : fmt::format("metrics-rank{}.jsonl", env_.rank)),
      resuming ? start_round_ * config_.dist.inner_steps : -1, lead_ ? run_dir_ / "tb" : fs::path());
  if (lead_) {
    write_file_atomic(run_dir_ / "config.toml", config_.to_toml());
    auto count = [&](const std::vector<std::string>& ids) { return held_->numel(ids); };
    log::info("DiPaCo {} grid: {} paths over {} modules; {} parameters per path, {} in all; {} rounds of tau = {} "
              "inner steps; {} worker(s); routes '{}'",
              grid_.describe(), grid_.num_paths(), module_ids_.size(), count(grid_.modules_of_path(0)),
              count(module_ids_), rounds_, config_.dist.inner_steps, env_.world_size, config_.dipaco.routes);
  }
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
  AdamW optimizer(params, {.beta1 = config_.optim.beta1, .beta2 = config_.optim.beta2, .eps = config_.optim.eps,
                           .weight_decay = config_.optim.weight_decay});
  const bool keep_state = config_.dipaco.inner_state == "travel";
  if (keep_state)
    if (auto f = state_->inner(p, round - 1)) optimizer.load_state(*f, std::stoll(f->metadata().at("steps")));
  BatchLoader loader(data_[p].train,
                     {.batch_size = tc.batch_size, .context = T, .seed = static_cast<uint64_t>(tc.seed + p),
                      .stride = T + 1},
                     fmt::format("path {} shard", p));
  const uint64_t consumed = static_cast<uint64_t>(round * tau * tc.batch_size);
  const uint64_t per_epoch = static_cast<uint64_t>(loader.num_windows());
  loader.set_position({consumed / per_epoch, consumed % per_epoch});
  // The inner steps are the trainer's dense step (runtime/step_runner.h) on the path's model.
  DenseStep inner({model, params, optimizer, loader, nullptr, device_, 1, config_.optim.grad_clip});
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
    maybe_inject_failure(env_.rank, ++inner_steps_done_);  // counts this worker's steps over all its tasks
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
  metrics_->write(nlohmann::json{{"round", round}, {"path", p}, {"worker", env_.rank}, {"step", (round + 1) * tau},
                                 {"tokens", (round + 1) * tau * tc.batch_size * T}, {"loss", loss_sum / double(tau)},
                                 {"holdout_loss", holdout}, {"task_s", dt},
                                 {"tokens_per_s", double(tau * tc.batch_size * T) / dt}}
                      .dump());
  log::info("round {:>3}/{} | path {:>3} | loss {:.4f} | held-out {:.4f} | {:.1f} s", round + 1, rounds_, p,
            loss_sum / double(tau), holdout, dt);
}

// The leader's verdict on the round's tasks; survivors of a death re-form the group.
void Worker::settle(int64_t round, int64_t gen, const std::vector<int64_t>& round_tasks, Verdict& verdict) {
  verdict = queue_->settle(round, gen, members_, round_tasks, config_.dipaco.on_failure == "requeue");
  if (verdict.members == members_) return;
  members_ = verdict.members;
  held_->set_members(members_, round);
  state_->set_live(members_);
  group_->reform(fmt::format("dipaco/r{}g{}", round, gen), group_rank_of(env_.rank), static_cast<int>(members_.size()),
                 held_->path_local() ? held_->link() : std::nullopt);
  exchange_options_.link = held_->link();
  exchange_ = std::make_unique<comm::Exchange>(*group_, exchange_options_);
  if (!lead_ && members_.front() == env_.rank)
    log::warn("DiPaCo: worker {} leads the run from round {} on (the leader died)", env_.rank, round + 1);
  lead_ = members_.front() == env_.rank;  // the lowest live worker writes the run's files
  if (lead_) log::warn("DiPaCo: continuing with {} worker(s): {}", members_.size(), fmt::join(members_, ", "));
}

void Worker::run_round(int64_t round) {
  const auto round_start = Clock::now();
  accs_.clear();
  compute_s_ = 0;
  std::vector<int64_t> round_tasks(static_cast<size_t>(grid_.num_paths()));
  std::iota(round_tasks.begin(), round_tasks.end(), 0);
  // Tasks until the queue is empty; then the leader's verdict: done, or a new generation of re-queued tasks.
  int64_t tasks_here = 0;
  Verdict verdict{.again = true, .tasks = round_tasks};
  std::vector<int64_t> prefer = std::exchange(trained_, {});
  if (!held_->path_local()) prefer.clear();  // a shared directory holds every path's state alike
  for (int64_t gen = 0; verdict.again; ++gen) {
    const std::vector<int64_t> tasks = verdict.tasks;
    while (auto p = queue_->claim(round, gen, tasks, prefer)) {
      trained_.push_back(*p);
      train_task(*p, round);
      queue_->done(round, *p);
      tasks_here += 1;
    }
    settle(round, gen, round_tasks, verdict);
  }
  summary_.tasks_run += tasks_here;
  summary_.tasks_dropped += static_cast<int64_t>(verdict.dropped.size());

  const auto comm_start = Clock::now();
  const auto [reduce_sent, reduce_recv] = held_->reduce(round, (round + 1) * config_.dist.inner_steps, accs_, *group_, *exchange_);
  if (!held_->path_local()) held_->check_identical(*group_, fmt::format("after round {}", round + 1));
  const double comm_s = seconds_since(comm_start);
  // Path-local: the upload plus what went through the store (module values, path state), per direction.
  const DepotBytes depot = held_->take_depot_bytes();
  const double state_put = depot.state_put + state_->take_served_bytes();  // served: sent to the store for an asker
  const double sent = reduce_sent + depot.published + state_put;
  const double recv = reduce_recv + depot.fetched + depot.state_got;
  summary_.bytes_sent += sent;
  summary_.bytes_recv += recv;
  summary_.comm_s += comm_s;
  summary_.rounds = round + 1;
  nlohmann::json line{{"outer_step", round + 1}, {"round", round + 1}, {"step", (round + 1) * config_.dist.inner_steps},
                      {"bytes_sent", sent}, {"bytes_recv", recv}, {"comm_s", comm_s}, {"compute_s", compute_s_},
                      {"tasks", tasks_here}, {"dropped", verdict.dropped}, {"members", members_},
                      {"modelled_link_s", held_->modelled_s()}, {"round_s", seconds_since(round_start)},
                      {"elapsed_s", seconds_since(start_)}};
  if (held_->path_local()) {
    line["bytes_up"] = reduce_sent;  // pseudo-gradients (+ weights, + the touched mask) to the owners
    line["bytes_published"] = depot.published;
    line["bytes_fetched"] = depot.fetched;
    line["bytes_state"] = state_put + depot.state_got;
    line["bytes_state_put"] = state_put;
    line["bytes_state_got"] = depot.state_got;  // what the path state cost this worker to fetch (0 for its own paths)
    line["fetch_s"] = depot.fetch_s;
  }
  metrics_->write(line.dump());
  save_outer_states(run_dir_, round + 1, held_->outer());  // resume.h: before dipaco.json says the round is done
  if (held_->feedback()) save_feedback(run_dir_, round + 1, env_.rank, *held_->feedback());
  if (env_.distributed()) group_->barrier();
  if (lead_) {
    // Path-local, the leader fetches every module to write the run's files (the checkpoint's cost, not counted above).
    save_modules(run_dir_, config_, grid_, held_->all(round + 1), round + 1);
    held_->take_depot_bytes();
    const int64_t every = config_.dipaco.eval_every_rounds;
    if (every > 0 && (round + 1) % every == 0 && round + 1 < rounds_) {  // the last round: finish() evaluates
      const auto eval_start = Clock::now();
      const auto routed = evaluate_routed(run_dir_, false, config_.dipaco.eval_units, device_);
      eval_s_ += seconds_since(eval_start);
      // elapsed_s includes every evaluation so far (eval_s): the others wait for the leader at the next settle.
      metrics_->write(nlohmann::json{{"round", round + 1}, {"step", (round + 1) * config_.dist.inner_steps},
                                     {"val_loss", routed.loss}, {"val_ppl", std::exp(routed.loss)}, {"eval_s", eval_s_},
                                     {"elapsed_s", seconds_since(start_)}}
                          .dump());
      log::info("round {:>3}/{} | routed val loss {:.4f} (ppl {:.3f})", round + 1, rounds_, routed.loss,
                std::exp(routed.loss));
    }
    log::info("round {:>3}/{} done | {} task(s) here | {:.2f} MB sent | comm {:.1f} s of {:.1f} s{}", round + 1,
              rounds_, tasks_here, sent / 1e6, comm_s, seconds_since(round_start),
              verdict.dropped.empty() ? std::string()
                                      : fmt::format(" | dropped paths {}", fmt::join(verdict.dropped, ", ")));
  }
}

// Each path's shard from dipaco.routes, refused naming the key when it was routed for another grid or context.
void Worker::load_routed_data() {
  const fs::path routes = config_.dipaco.routes;
  const RouteInfo route_info = read_route_info(routes);
  if (route_info.modules != grid_.describe())
    fail("dipaco.routes = '{}' was routed for a {} grid but dipaco.modules = '{}'; route again with --modules {}",
         routes.string(), route_info.modules, grid_.describe(), grid_.describe());
  if (route_info.context != config_.model.context)
    fail("dipaco.routes = '{}' holds units of {} tokens but model.context = {}; route with --context {}",
         routes.string(), route_info.context + 1, config_.model.context, config_.model.context);
  for (int64_t p = 0; p < grid_.num_paths(); ++p) data_.push_back(load_path_data(routes, p, config_));
  if (config_.model.vocab_size == 0) config_.model.vocab_size = data_.front().vocab_size;
}

DipacoSummary Worker::finish() {
  summary_.run_dir = run_dir_;
  summary_.elapsed_s = seconds_since(start_);
  if (lead_) {
    state_->gather_best(grid_.num_paths());
    auto routed = evaluate_routed(run_dir_, false, config_.dipaco.eval_units, device_);
    auto early = evaluate_routed(run_dir_, true, config_.dipaco.eval_units, device_);
    summary_.val_loss = routed.loss;
    summary_.val_ppl = std::exp(routed.loss);
    summary_.val_loss_early = early.loss;
    summary_.val_ppl_early = std::exp(early.loss);
    nlohmann::json j = {{"algorithm", "dipaco"}, {"modules", grid_.describe()}, {"paths", grid_.num_paths()},
                        {"rounds", summary_.rounds}, {"val_loss", routed.loss}, {"val_ppl", summary_.val_ppl},
                        {"val_loss_early_stopped", early.loss}, {"val_ppl_early_stopped", summary_.val_ppl_early},
                        {"eval_tokens", routed.num_tokens}, {"units_per_path", routed.units_per_path},
                        {"loss_per_path", routed.loss_per_path}, {"bytes_sent", summary_.bytes_sent},
                        {"bytes_recv", summary_.bytes_recv}, {"comm_s", summary_.comm_s},
                        {"tasks_dropped", summary_.tasks_dropped}, {"elapsed_s", summary_.elapsed_s},
                        {"world_size", env_.world_size}};
    write_file_atomic(run_dir_ / "summary.json", j.dump(2) + "\n");
    log::info("DiPaCo {}: routed val loss {:.4f} (ppl {:.3f}) on tokens after the {}-token prefix; early-stopped "
              "{:.4f} (ppl {:.3f})",
              grid_.describe(), routed.loss, summary_.val_ppl, kRoutingPrefix, early.loss, summary_.val_ppl_early);
  }
  if (env_.distributed()) group_->barrier();  // the leader hosts the store: others leave only after the evaluation
  return summary_;
}

}  // namespace

DipacoSummary train_dipaco(const RunConfig& config, const TrainOptions& options) {
  const DistEnv& env = options.dist;
  if (env.distributed()) log::set_prefix(getenv("TRIBUTARY_LAUNCHED") ? "" : fmt::format("[rank {}] ", env.rank));
  configure_threads(config.train.threads, env.local_world_size);
  Worker worker(config, env, options);
  const int64_t rounds = config.train.steps / config.dist.inner_steps, tau = config.dist.inner_steps;
  if (worker.start_round() > 0 && env.rank == 0) log::info("DiPaCo: resuming after round {}", worker.start_round());
  for (int64_t round = worker.start_round(); round < rounds; ++round) {
    worker.run_round(round);
    if (options.stop_after_step > 0 && (round + 1) * tau >= options.stop_after_step && round + 1 < rounds) {
      if (env.rank == 0)
        log::info("stopped after round {} (step {}); continue with --resume", round + 1, (round + 1) * tau);
      break;
    }
  }
  return worker.finish();
}

}  // namespace tributary
