// What a training run tells its user: metrics.jsonl (rank 0), the console lines, and summary.json. The loop calls it
// at fixed points; it owns the interval accounting (tokens/s, MFU, ETA, the share of time blocked in communication).
// In a distributed run every worker also writes workers/rank{R}.jsonl: its own tokens/s and MFU at each logged step,
// and at each exchange its compute and blocked seconds — what `tributary report` draws per worker.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include <optional>

#include "tributary/artifacts/inference.h"
#include "tributary/comm/exchange.h"
#include "tributary/parallel/train_step.h"
#include "tributary/runtime/metrics.h"
#include "tributary/runtime/train_summary.h"

namespace tributary {

// A worker's own lines in a run directory: workers/rank{R}.jsonl.
fs::path worker_lines_file(const fs::path& run_dir, int rank);

struct ReportSetup {
  fs::path run_dir;
  bool lead = true;  // rank 0 writes metrics and prints
  // A machine's first worker that does not lead prints its own step lines (marked as its own), so that every
  // machine's console shows its progress; the run's lines and files stay the lead's.
  bool machine_console = false;
  int64_t resume_step = -1;  // >= 0: metrics.jsonl keeps only lines up to this step
  int64_t total_steps = 0;
  int64_t stops_at = 0;  // the step --stop-after-step ends this invocation at (the ETA's), 0: total_steps
  int64_t log_every = 1;
  int world_size = 1;
  bool distributed = false;  // more than one process: every worker writes workers/rank{rank}.jsonl
  bool exchanges = false;    // replicas exchange (data parallel, DiLoCo): the console shows their share of the time
  int rank = 0;              // the worker's launch rank: distributed runs also write workers/rank{rank}.jsonl
  int64_t worker_resume_step = -1;  // that file keeps its lines up to this step (a resume, or a healed worker's rejoin)
  // A process that does not lead may keep metrics lines of its own in the run directory under this name (DiPaCo's
  // workers: their tasks and rounds in metrics-rank{R}.jsonl); empty: it writes none.
  std::string own_metrics;
  double flops_per_token = 0, peak_flops = 0;
  double bytes_per_token = 1;  // validation bytes per token (bits/byte)
};

class RunReport {
 public:
  explicit RunReport(const ReportSetup& setup);

  void write(const nlohmann::json& line);  // a metrics line (the lead's metrics.jsonl, or setup.own_metrics)
  // Every step: the step's time and tokens (all replicas) for the interval statistics, and a loss when one was
  // reported (local stages report theirs late).
  void step_done(double seconds, int64_t tokens, std::optional<double> loss);
  // After an exchange (or a logged data-parallel step): traffic and blocked time since the last one.
  // Fault-tolerant or guarded runs add the members now (`world_size` > 0) and the updates rejected (`rejected` >= 0).
  void exchange_done(int64_t step, int64_t outer_step, int64_t inner_steps, const comm::CommStats& stats,
                     double elapsed, int world_size = 0, int64_t rejected = -1,
                     const std::map<int, double>& scores = {});
  // Fault tolerance: this rank leads from now on (the one before it died); metrics.jsonl is continued after `step`.
  void take_lead(int64_t step);
  bool log_due(int64_t step) const { return step % setup_.log_every == 0 || step == setup_.total_steps; }
  // The result of step `step`; local parallelism adds each chunk's loss ("chunk_losses", also printed), each
  // stage's step seconds ("stage_step_s") and bytes sent forward ("stage_bytes_forward").
  void log_step(int64_t step, int64_t tokens_seen, const StepResult& result, double lr, double elapsed);
  // `eval_s`: seconds of this invocation's evaluations before this one, which `elapsed` holds (elapsed - eval_s: time
  // not spent evaluating, the clock of time-to-loss measurements).
  void evaluated(int64_t step, int64_t tokens_seen, const EvalResult& result, double elapsed, double eval_s,
                 TrainSummary& summary);
  // summary.json (the lead only): val_* are null when nothing was evaluated (a 0.0 loss would read as a perfect model);
  // `summary.details` are added at its top level.
  void write_summary(const TrainSummary& summary, const std::string& algorithm, const std::string& compression);

 private:
  ReportSetup setup_;
  std::unique_ptr<MetricsWriter> metrics_;
  std::unique_ptr<MetricsWriter> worker_;  // workers/rank{R}.jsonl (distributed runs)
  // MFU and tokens/s on the log lines: the world's rate over the last completed round (between two exchanges; the
  // lead's step time there includes the wait for the slowest worker), or over the interval before the first round.
  // The lead's own step rate x the world read 102-155% in DiLoCo while the lead ran ahead of slower workers. The
  // peak is that of the workers the run was launched with (`launched_world_`): workers that die leave their share of
  // a shared machine to the others, so the survivors' figure is measured against the hardware the run holds.
  double round_seconds_ = 0, round_comm_s_ = 0, interval_seconds_ = 0, interval_loss_ = 0;
  bool mfu_capped_said_ = false;  // the warning that MFU came out above 100% is said once
  double round_tokens_ = 0, last_round_tokens_per_s_ = 0;
  int launched_world_ = 1;
  double train_s_ = 0;  // seconds in training steps this invocation (no evaluation, no checkpoints)
  int64_t interval_tokens_ = 0, interval_steps_ = 0, interval_losses_ = 0;
};

std::string thousands(double value);  // 1234567 -> "1,234,567"

// A run that starts over (no --resume) first removes the results an earlier run left in `run_dir`: summary.json,
// report.html and TensorBoard event files (tb/events.out.tfevents.*; metrics.jsonl is cleared as it is reopened).
// Otherwise a run that fails before its end leaves the earlier run's summary in place, and it reads as this run's
// (a chaos run that stalled at step 400 "finished 600 steps" that way). Only files of those names are touched.
void forget_earlier_results(const fs::path& run_dir);

}  // namespace tributary
