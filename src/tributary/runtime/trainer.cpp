#include "tributary/runtime/trainer.h"

#include "tributary/core/log.h"
#include "tributary/model/eval.h"
#include "tributary/runtime/dipaco/worker.h"
#include "tributary/runtime/run_layout.h"
#include "tributary/runtime/run_loop.h"
#include "tributary/runtime/training_run.h"

namespace tributary::detail {

bool TrainingRun::sync(int64_t step, double lr) {
  if (islands_) return islands_->after_step(step, lr, parts_.trained, step == tc_.steps);
  if (!sync_) return false;
  bool synced = sync_->after_step(step, lr, parts_.trained);             // DiLoCo: outer step every H inner steps
  if (step == tc_.steps) synced |= sync_->finish(step, parts_.trained);  // pending inner steps at the end
  return synced;
}

void TrainingRun::report_exchange(int64_t step, bool synced, double elapsed) {
  if (!sync_ || !(synced || (sync_->averaging_gradients() && report_->log_due(step)))) return;
  const auto c = sync_->take_stats();
  count_traffic(c);
  const int64_t rejected = replicas_ ? replicas_->take_rejected() : -1;  // -1: not guarded
  summary_.rejected += std::max<int64_t>(0, rejected);
  report_->exchange_done(step, sync_->ddp() ? step : sync_->outer_steps(), sync_->ddp() ? 1 : sync_->inner_steps_now(),
                         c, elapsed, rejected >= 0 ? sync_->size() : 0, rejected);
}

void TrainingRun::count_traffic(const comm::CommStats& c) {
  if (stages_) stages_->add_sync_bytes(c.bytes_sent);
  summary_.bytes_sent += c.bytes_sent;
  summary_.bytes_recv += c.bytes_recv;
  summary_.comm_s += c.comm_s;
}

void TrainingRun::save(int64_t step, double elapsed) {
  auto path = save_run({config_, *data_.dataset, parts_.params, *parts_.optimizer, *data_.loader, replicas_.get(),
                        pipelines_.get(), &parts_.aux_params, islands_.get()},
                       step, progress_.tokens, elapsed);
  if (!path.empty()) summary_.checkpoint = path;
}

// One unit: next batch -> step -> sync -> (membership) -> report.
UnitDone TrainingRun::next() {
  const auto step_start = Clock::now();
  const int64_t step = progress_.step;
  const double lr = schedule_.lr(step);
  const StepResult result = step_once(step, lr);
  progress_.step = step + 1;
  faults_.after_step(progress_.step);
  progress_.tokens += tokens_per_step_;
  const bool averaged = sync_ && sync_->averaging_gradients();  // data parallel, or DiLoCo's warm-up
  const bool synced = sync(progress_.step, lr);
  const bool round = synced || averaged;
  if (round) follow_membership(progress_.step);  // the replicas' membership may change only at a round
  measure_stage();
  const double dt = seconds_since(step_start);
  train_seconds_ += dt;
  report_->step_done(dt, tokens_per_step_, result.reported ? std::optional(result.loss) : std::nullopt);
  const double now = elapsed();
  report_exchange(progress_.step, synced, now);
  if (result.reported) record(result, progress_.step, schedule_.lr(step - result.lag), now);
  const bool quiescent = islands_ ? islands_->quiescent() : !sync_ || sync_->quiescent();
  return {.step = progress_.step, .quiescent = quiescent, .synced = synced, .round = round, .elapsed_s = now};
}

StopAgreement::Vote TrainingRun::stop_vote() {
  if (pipelines_) return [this](bool local) { return pipelines_->stop_agreed(local); };
  if (replicas_) return [this](bool local) { return replicas_->stop_agreed(local); };
  if (islands_) return [this](bool local) { return islands_->stop_agreed(local); };
  return {};
}

StepResult TrainingRun::step_once(int64_t step, double lr) {
  const auto start = Clock::now();
  const double blocked_before = replicas_ ? replicas_->blocked_total_s() : 0;
  StepResult result = step_.step->run(step, lr);
  // Time-paced islands (parallel.island_steps): a faster island takes more optimizer steps per tick, at the tick's
  // learning rate; the tick reports its last.
  for (int64_t k = 1; k < layout_.islands().steps_per_tick(); ++k) result = step_.step->run(step, lr);
  // dist.slow_workers: a slower machine computes slower; the wait for the others (data parallel) is not its own
  if (!step_.slows_itself)
    slowdown_->after_step(seconds_since(start) - (replicas_ ? replicas_->blocked_total_s() - blocked_before : 0));
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
  const bool last = step == tc_.steps;
  // DiLoCo replicas hold the global model only right after an outer step: periodic checkpoints then (their
  // model.safetensors is the global model), or at the end. Every rank takes part in a multi-process checkpoint.
  const bool at_global = (!sync_ && !islands_) || (sync_ && sync_->averaging_gradients()) || unit.synced;
  const bool periodic = tc_.checkpoint_every > 0 && step % tc_.checkpoint_every == 0 && at_global && unit.quiescent;
  return {.last = last,
          .stop = stop,
          .eval = (tc_.eval_every > 0 && step % tc_.eval_every == 0) || last,
          .checkpoint = periodic || last || stop};
}

void TrainingRun::when_due(const UnitDone& unit, const Due& due) {
  const int64_t step = unit.step;
  // Pipeline stages hold only their own parameters current: bring the whole model to every rank first.
  if (pipelines_ && (due.eval || due.checkpoint)) {
    pipelines_->consolidate(parts_.params, config_.model.blocks_per_level());
    if (parts_.aux_heads) pipelines_->consolidate_aux_heads(parts_.aux_params);
  }
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
// lead heals those that asked since (training_run_membership.cpp).
void TrainingRun::between_units(const UnitDone& unit) {
  if (unit.round) admit_joiners(unit.step, unit.elapsed_s);
  offer_heals(unit.step, unit.elapsed_s);
}

// A step's numbers into the summary and the log. A step that reports late (local stages) gives the numbers of the
// step `result.lag` steps before `step`, the one just run; `lr` is that earlier step's.
void TrainingRun::record(const StepResult& result, int64_t step, double lr, double now) {
  summary_.losses.push_back(result.loss);
  const int64_t of = step - result.lag;
  if (report_->log_due(of)) report_->log_step(of, progress_.tokens - result.lag * tokens_per_step_, result, lr, now);
}

TrainSummary TrainingRun::finish(bool stopped_early) {
  const int64_t step = progress_.step;
  if (stopped_early) {
    if (lead_.is())
      log::info("stopped after step {} (checkpoint '{}'); continue with --resume", step, summary_.checkpoint.string());
    summary_.stopped_early = true;
  }
  if (sync_) count_traffic(sync_->take_stats());  // data parallel stopped between two log lines
  if (islands_) {
    const comm::CommStats inside = islands_->take_inside_stats();
    summary_.bytes_inside = inside.bytes_sent;
    summary_.world_size = options_.dist.world_size;
    summary_.islands = layout_.islands().count();
  }
  summary_.steps = step;
  summary_.lead = lead_.is();
  summary_.kind = layout_.kind();
  summary_.sync = layout_.sync();
  if (replicas_) summary_.world_size = replicas_->size();
  if (sync_) summary_.outer_steps = sync_->outer_steps();
  if (pipelines_) {
    summary_.world_size = options_.dist.world_size;
    summary_.stages = stages_ ? stages_->gather(*pipelines_, train_seconds_) : nlohmann::json::array();
  }
  summary_.tokens = progress_.tokens;
  summary_.elapsed_s = elapsed();
  // The tokens the members trained while this process did (tokens_per_step_ is the members' count at the end: a
  // run whose world shrank and grew again would count every step at the final size), against the launched
  // workers' peak (docs/architecture.md, "MFU").
  summary_.tokens_per_s = double(progress_.tokens - tokens_at_start_) / train_seconds_;
  summary_.mfu = summary_.tokens_per_s * flops_per_token_ / (summary_.peak_flops * options_.dist.world_size);
  report_->write_summary(summary_, layout_.name(), config_.dist.compression);
  return summary_;
}

}  // namespace tributary::detail

namespace tributary {

TrainSummary train(const RunConfig& config, const TrainOptions& options) {
  std::unique_ptr<WorkSource> work;
  if (run_layout(config, options.dist).kind() == RunKind::kDipaco)
    work = dipaco::make_path_rounds(config, options);
  else
    work = std::make_unique<detail::TrainingRun>(config, options);
  return run_loop(*work, options.stop_after_step);
}

}  // namespace tributary
