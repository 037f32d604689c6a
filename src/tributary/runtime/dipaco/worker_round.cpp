#include "tributary/runtime/dipaco/worker_impl.h"

namespace tributary::dipaco {

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
  metrics_->write(nlohmann::json{{"round", round},
                                 {"path", p},
                                 {"worker", env_.rank},
                                 {"step", (round + 1) * tau},
                                 {"tokens", (round + 1) * tau * tc.batch_size * T},
                                 {"loss", loss_sum / double(tau)},
                                 {"holdout_loss", holdout},
                                 {"task_s", dt},
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
    settle(round, gen++, round_tasks, verdict);
    work.dropped.insert(work.dropped.end(), verdict.dropped.begin(), verdict.dropped.end());
  };
  const ExchangeGate gate = [&] {
    const std::vector<int> before = members_;
    settle_next();
    return !verdict.again && members_ == before;
  };
  for (bool exchanged = false; !exchanged;) {
    for (; verdict.again; settle_next()) {
      const std::vector<int64_t> tasks = verdict.tasks;
      while (auto p = queue_->claim(round, gen, tasks, prefer)) {
        trained_.push_back(*p);
        train_task(*p, round);
        queue_->done(round, *p);
        work.tasks += 1;
      }
    }
    faults_.in_exchange(round + 1);
    const auto comm_start = Clock::now();
    try {
      std::tie(work.sent, work.recv) =
          held_->reduce(round, (round + 1) * config_.dist.inner_steps, accs_, *group_, *exchange_, gate);
      if (!held_->path_local()) held_->check_identical(*group_, fmt::format("after round {}", round + 1));
      exchanged = true;
    } catch (const ExchangeAborted& e) {
      log::warn("DiPaCo round {}: a worker died during the exchange ({}); it runs again with worker(s) {}", round + 1,
                comm::error_text(e), fmt::join(members_, ", "));
    }
    work.comm_s += seconds_since(comm_start);
  }
  return work;
}

void Worker::run_round(int64_t round) {
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
                      {"members", members_},
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
  metrics_->write(line.dump());
  save_outer_states(run_dir_, round + 1, held_->outer());  // resume.h: before dipaco.json says the round is done
  if (held_->feedback()) save_feedback(run_dir_, round + 1, env_.rank, *held_->feedback());
  if (env_.distributed()) group_->barrier();
  if (lead_) after_round_as_leader(round, work, sent, round_start);
}

// The run's files (path-local, the leader fetches every module: the checkpoint's cost, not counted in the round's
// bytes), the routed validation every dipaco.eval_every_rounds, the round's console line.
void Worker::after_round_as_leader(int64_t round, const RoundWork& work, double sent, Clock::time_point round_start) {
  save_modules(run_dir_, config_, grid_, held_->all(round + 1), round + 1);
  held_->take_depot_bytes();
  const int64_t every = config_.dipaco.eval_every_rounds;
  if (every > 0 && (round + 1) % every == 0 && round + 1 < rounds_) {  // the last round: finish() evaluates
    const auto eval_start = Clock::now();
    const auto routed = evaluate_routed(run_dir_, false, config_.dipaco.eval_units, device_);
    eval_s_ += seconds_since(eval_start);
    // elapsed_s includes every evaluation so far (eval_s): the others wait for the leader at the next settle.
    metrics_->write(nlohmann::json{{"round", round + 1},
                                   {"step", (round + 1) * config_.dist.inner_steps},
                                   {"val_loss", routed.loss},
                                   {"val_ppl", std::exp(routed.loss)},
                                   {"eval_s", eval_s_},
                                   {"elapsed_s", seconds_since(start_)}}
                        .dump());
    log::info("round {:>3}/{} | routed val loss {:.4f} (ppl {:.3f})", round + 1, rounds_, routed.loss,
              std::exp(routed.loss));
  }
  log::info("round {:>3}/{} done | {} task(s) here | {:.2f} MB sent | comm {:.1f} s of {:.1f} s{}", round + 1, rounds_,
            work.tasks, sent / 1e6, work.comm_s, seconds_since(round_start),
            work.dropped.empty() ? std::string() : fmt::format(" | dropped paths {}", fmt::join(work.dropped, ", ")));
}

}  // namespace tributary::dipaco
