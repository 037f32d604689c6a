// What one invocation of `train` reports back (summary.json is written from it): steps, losses, validation, speed,
// and for multi-process runs this rank's traffic, outer steps, faults and pipeline stages.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <vector>

#include "tributary/core/fs.h"
#include "tributary/parallel/layout.h"

namespace tributary {

// What a run reports (summary.json, the CLI's last lines, the tests). Size: one member per reported figure.
struct TrainSummary {
  int64_t steps = 0;
  int64_t tokens = 0;
  std::vector<double> losses;  // per optimizer step (mean over micro-batches), this invocation only
  double val_loss = 0, val_bpb = 0, val_ppl = 0;
  double val_loss_early = 0;  // DiPaCo: every path's early-stopped parameters (val_loss: the last round's)
  bool evaluated = false;     // false: no evaluation ran (e.g. --stop-after-step); summary.json then has null val_*
  double unigram_bpb = 0;     // the unigram baseline on the same validation split
  double tokens_per_s = 0, mfu = 0, peak_flops = 0;  // mfu: at most 1 (a peak measured low under load)
  std::string peak_source;                           // which measurement peak_flops is (perf/flops.h)
  double elapsed_s = 0;
  int64_t num_parameters = 0;
  bool stopped_early = false;
  // Distributed runs: what kind (the layout's), this rank's traffic and time blocked in communication, and the number
  // of outer steps.
  RunKind kind = RunKind::kSingle;
  SyncKind sync = SyncKind::kNone;
  int world_size = 1;
  double bytes_sent = 0, bytes_recv = 0, comm_s = 0;
  int64_t outer_steps = 0;
  int64_t islands = 0;       // parallel.islands: how many (bytes_sent is then the outer shard's, over the slow link)
  double bytes_inside = 0;   // islands: this rank's gradient all-reduce inside its island (the fast link)
  int64_t rejected = 0;      // updates dropped (dist.reject_norm_factor)
  int64_t reformations = 0;  // groups re-formed (deaths, joins)
  bool lead = true;          // this process wrote the run's metrics and summary (rank 0, or who took over from it)
  // Pipelines: per stage of pipeline 0, compute and blocked seconds, the measured bubble (1 - compute / step time),
  // the bytes of activations and activation gradients it sent, and the bytes it sent to its replicas in the other
  // pipelines (sync_bytes: the gradient all-reduce, or DiLoCo's pseudo-gradient exchanges).
  nlohmann::json stages;
  // What only one kind of run reports, merged into summary.json's top level (DiPaCo: its grid, paths, tasks dropped
  // and the early-stopped paths' routed evaluation).
  nlohmann::json details;
  fs::path run_dir, checkpoint;
};

}  // namespace tributary
