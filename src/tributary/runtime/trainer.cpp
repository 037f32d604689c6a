#include "tributary/runtime/trainer.h"

#include <sys/resource.h>

#include "tributary/core/log.h"
#include "tributary/model/eval.h"
#include "tributary/optim/schedule.h"
#include "tributary/runtime/step_factory.h"
#include "tributary/runtime/stop.h"
#include "tributary/runtime/training_run.h"

namespace tributary::detail {

bool TrainingRun::sync(int64_t step, double lr) {
  if (!synced_) return false;
  bool synced = synced_->after_step(step, lr, trained_);            // DiLoCo: outer step every H inner steps
  if (step == tc_.steps) synced |= synced_->finish(step, trained_);  // pending inner steps at the end
  return synced;
}

void TrainingRun::report_exchange(int64_t step, bool synced, double elapsed) {
  if (!synced_ || !(synced || (synced_->averaging_gradients() && report_->log_due(step)))) return;
  auto c = synced_->take_stats();
  sync_bytes_ += c.bytes_sent;
  summary_.bytes_sent += c.bytes_sent;
  summary_.bytes_recv += c.bytes_recv;
  summary_.comm_s += c.comm_s;
  const int64_t rejected = replicas_ ? replicas_->take_rejected() : -1;  // -1: not guarded
  summary_.rejected += std::max<int64_t>(0, rejected);
  report_->exchange_done(step, synced_->ddp() ? step : synced_->outer_steps(),
                         synced_->ddp() ? 1 : synced_->inner_steps_now(), c, elapsed,
                         rejected >= 0 ? synced_->size() : 0, rejected);
}

void TrainingRun::add_stage_stats(const pipeline::PipelineStats& s) {
  stage_stats_.activation_bytes += s.activation_bytes;
  stage_stats_.gradient_bytes += s.gradient_bytes;
  stage_stats_.compute_s += s.compute_s;
  stage_stats_.blocked_s += s.blocked_s;
  sync_bytes_ += double(s.data_parallel_bytes);
  summary_.bytes_sent += double(s.activation_bytes + s.gradient_bytes + s.data_parallel_bytes);
  summary_.comm_s += s.blocked_s;
}

// Every rank of the pipeline takes part; rank 0 writes what pipeline 0's stages measured.
void TrainingRun::summarise_stages(double train_seconds) {
  const auto& s = stage_stats_;
  const auto all = pipelines_->gather_stages({s.compute_s, s.blocked_s, double(s.activation_bytes),
                                              double(s.gradient_bytes), train_seconds, sync_bytes_,
                                              peak_rss_mb_});
  summary_.stages = nlohmann::json::array();
  for (const auto& v : all)
    summary_.stages.push_back({{"compute_s", v[0]}, {"blocked_s", v[1]}, {"bubble", v[4] > 0 ? 1.0 - v[0] / v[4] : 0.0},
                               {"activation_bytes", v[2]}, {"gradient_bytes", v[3]}, {"sync_bytes", v[5]},
                               {"peak_rss_mb", v[6]}});
}

void TrainingRun::save(int64_t step, double elapsed) {
  auto path = save_run({config_, *dataset_, params_, *optimizer_, *loader_, replicas_.get(), pipelines_.get(),
                        &aux_params_},
                       step, progress_.tokens, elapsed);
  if (!path.empty()) summary_.checkpoint = path;
}

// The loop: next batch -> step -> sync -> report / evaluate / checkpoint / stop when due.
TrainSummary TrainingRun::run() {
  auto built = make_train_step({config_, *model_, params_, trained_, aux_heads_.get(), *optimizer_, *loader_,
                                 replicas_.get(), pipelines_.get(), device_, slowdown_->factor()});
  take_stage_stats_ = std::move(built.take_stage_stats);
  TrainStep& train_step = *built.step;
  StopAgreement::Vote vote;
  if (replicas_) vote = [this](bool local) { return replicas_->stop_agreed(local); };
  if (pipelines_) vote = [this](bool local) { return pipelines_->stop_agreed(local); };
  StopAgreement stop(vote, options_.stop_after_step, lead_);
  const CosineSchedule schedule{config_.optim.lr, config_.optim.warmup_steps, tc_.steps, config_.optim.min_lr_ratio};
  model_->train();
  run_start_ = Clock::now();
  tokens_at_start_ = progress_.tokens;
  double train_seconds = 0;
  int64_t step = progress_.step;
  while (step < tc_.steps) {
    const auto step_start = Clock::now();
    const double blocked_before = replicas_ ? replicas_->blocked_total_s() : 0;
    const double lr = schedule.lr(step);
    const StepResult result = train_step.run(step, lr);
    // dist.slow_workers: a slower machine computes slower; the wait for the others (data parallel) is not its own
    if (!built.slows_itself)
      slowdown_->after_step(seconds_since(step_start) - (replicas_ ? replicas_->blocked_total_s() - blocked_before : 0));
    step += 1;
    faults_.after_step(step);
    progress_.tokens += tokens_per_step_;
    const bool averaged = synced_ && synced_->averaging_gradients();  // data parallel, or DiLoCo's warm-up
    const bool synced = sync(step, lr);
    const bool round = synced || averaged;  // the replicas' membership may change only at a round
    if (round) follow_membership(step);
    if (take_stage_stats_) {
      add_stage_stats(take_stage_stats_());
      rusage usage{};  // the peak resident memory of training (model, optimizer, stashed activations), read before
      getrusage(RUSAGE_SELF, &usage);  // the last step's consolidation and checkpoint add theirs
      peak_rss_mb_ = double(usage.ru_maxrss) / 1024.0;
    }
    const double dt = seconds_since(step_start);
    train_seconds += dt;
    report_->step_done(dt, tokens_per_step_, result.reported ? std::optional(result.loss) : std::nullopt);
    const double now = elapsed();
    report_exchange(step, synced, now);
    if (result.reported) record(result, step, schedule.lr(step - 1 - result.lag), now);
    const bool last = step == tc_.steps;
    const bool quiescent = !synced_ || synced_->quiescent();
    const bool stop_now = stop.after_step(step, quiescent);
    // DiLoCo replicas hold the global model only right after an outer step: periodic checkpoints then (their
    // model.safetensors is the global model), or at the end. Every rank takes part in a multi-process checkpoint.
    const bool at_global = !synced_ || synced_->averaging_gradients() || synced;
    const bool eval_due = (tc_.eval_every > 0 && step % tc_.eval_every == 0) || last;
    const bool periodic = tc_.checkpoint_every > 0 && step % tc_.checkpoint_every == 0 && at_global && quiescent;
    // Pipeline stages hold only their own parameters current: bring the whole model to every rank first.
    if (pipelines_ && (eval_due || periodic || last || stop_now)) {
      pipelines_->consolidate(params_, config_.model.blocks_per_level());
      if (aux_heads_) pipelines_->consolidate_aux_heads(aux_params_);
    }
    if (lead_ && eval_due) {
      BatchLoader val(val_tokens_, {.batch_size = tc_.batch_size, .context = config_.model.context, .shuffle = false},
                      fmt::format("'{}' val", config_.data.dir));
      const auto eval_start = Clock::now();
      const EvalResult result = evaluate(*model_, val, tc_.eval_batches, device_);
      report_->evaluated(step, progress_.tokens, result, now, eval_seconds_, summary_);
      eval_seconds_ += seconds_since(eval_start);
    }
    if ((lead_ || replicas_ || pipelines_) && (periodic || last || stop_now)) save(step, now);
    if (last || stop_now)  // the numbers of the last steps, when they come late
      for (const StepResult& owed : train_step.drain())
        record(owed, step, schedule.lr(step - 1 - owed.lag), now);
    if (round && !last && !stop_now) admit_joiners(step, now);  // after this step's checkpoint
    if (!last && !stop_now) offer_heals(step, now);
    if (stop_now && !last) {
      if (lead_) log::info("stopped after step {} (checkpoint '{}'); continue with --resume", step,
                           summary_.checkpoint.string());
      summary_.stopped_early = true;
      break;
    }
  }
  finish(step, train_seconds);
  return summary_;
}

// A step's numbers into the summary and the log. A step that reports late (local stages) gives the numbers of the
// step `result.lag` steps before `step`, the one just run; `lr` is that earlier step's.
void TrainingRun::record(const StepResult& result, int64_t step, double lr, double now) {
  summary_.losses.push_back(result.loss);
  const int64_t of = step - result.lag;
  if (report_->log_due(of))
    report_->log_step(of, progress_.tokens - result.lag * tokens_per_step_, result, lr, now);
}

void TrainingRun::finish(int64_t step, double train_seconds) {
  if (synced_) {  // data parallel stopped between two log lines: the exchanges since the last one count too
    const auto c = synced_->take_stats();
    sync_bytes_ += c.bytes_sent;
    summary_.bytes_sent += c.bytes_sent;
    summary_.bytes_recv += c.bytes_recv;
    summary_.comm_s += c.comm_s;
  }
  summary_.steps = step;
  summary_.lead = lead_;
  if (replicas_) summary_.world_size = replicas_->size();
  if (synced_) summary_.outer_steps = synced_->outer_steps();
  if (pipelines_) {
    summary_.world_size = options_.dist.world_size;
    summarise_stages(train_seconds);
  }
  summary_.tokens = progress_.tokens;
  summary_.elapsed_s = elapsed();
  // The tokens the members trained while this process did (tokens_per_step_ is the members' count at the end: a
  // run whose world shrank and grew again would count every step at the final size), against the launched
  // workers' peak (docs/architecture.md, "MFU").
  summary_.tokens_per_s = double(progress_.tokens - tokens_at_start_) / train_seconds;
  summary_.mfu = summary_.tokens_per_s * flops_per_token_ / (summary_.peak_flops * options_.dist.world_size);
  report_->write_summary(summary_, layout_.name(), config_.dist.compression);
}

}  // namespace tributary::detail

namespace tributary {

TrainSummary train(const RunConfig& config, const TrainOptions& options) {
  detail::TrainingRun run(config, options);
  return run.run();
}

}  // namespace tributary
