// The single-process trainer. The loop reads as a sentence:
//   next batch -> forward -> loss -> backward (x grad_accum) -> clip -> AdamW step -> log / evaluate / checkpoint.
// Fully deterministic for a seed and thread count; `resume` continues bit for bit from a checkpoint.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

#include "tributary/core/fs.h"
#include "tributary/runtime/dist_env.h"
#include "tributary/runtime/run_config.h"

namespace tributary {

struct TrainOptions {
  bool resume = false;          // continue from a checkpoint
  std::string resume_from;      // checkpoint or run directory; empty with resume: latest in train.run_dir
  int64_t stop_after_step = 0;  // > 0: checkpoint and stop after this step (a planned pre-emption)
  bool overwrite = false;       // start fresh even if train.run_dir already has checkpoints
  DistEnv dist;                 // rank and world of this process (single process by default)
};

struct TrainSummary {
  int64_t steps = 0;
  int64_t tokens = 0;
  std::vector<double> losses;  // per optimizer step (mean over micro-batches), this invocation only
  double val_loss = 0, val_bpb = 0, val_ppl = 0;
  bool evaluated = false;  // false: no evaluation ran (e.g. --stop-after-step); summary.json then has null val_*
  double unigram_bpb = 0;       // the unigram baseline on the same validation split
  double tokens_per_s = 0, mfu = 0, peak_flops = 0;
  double elapsed_s = 0;
  int64_t num_parameters = 0;
  bool stopped_early = false;
  // Distributed runs: this rank's traffic and time blocked in communication, and the number of outer steps.
  int world_size = 1;
  double bytes_sent = 0, bytes_recv = 0, comm_s = 0;
  int64_t outer_steps = 0;
  int64_t rejected = 0, reformations = 0;  // updates dropped (dist.reject_norm_factor); groups re-formed (deaths, joins)
  bool lead = true;  // this process wrote the run's metrics and summary (rank 0, or who took over from it)
  // Pipelines: per stage of pipeline 0, compute and blocked seconds, the measured bubble (1 - compute / step time),
  // the bytes of activations and activation gradients it sent, and the bytes it sent to its replicas in the other
  // pipelines (sync_bytes: the gradient all-reduce, or DiLoCo's pseudo-gradient exchanges).
  nlohmann::json stages;
  fs::path run_dir, checkpoint;
};

TrainSummary train(const RunConfig& config, const TrainOptions& options);

}  // namespace tributary
