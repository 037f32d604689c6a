// DiPaCo training (arXiv 2403.10616): every round, each path trains like a DiLoCo replica for tau = dist.inner_steps
// inner AdamW steps from the current global modules on its routed shard; then every module takes one outer Nesterov
// step with the shard-weighted, norm-rescaled average of the pseudo-gradients of the paths through it
// (optim/module_outer.h).
//
// Processes and data flow, one round:
//   1. tasks: the round's paths are claimed from the TaskQueue as workers become free (more paths than workers is the
//      normal case); a worker accumulates w_p * delta_p per module in its own memory;
//   2. settle: the run's quorum (comm/membership.h, as for fault-tolerant replicas) waits for every live worker's
//      vote; after a death the survivors re-form the group under a new epoch, and the dead worker's tasks are
//      re-queued or dropped (dipaco.on_failure);
//   3. exchange + outer step in one ring (Exchange::reduce_update_gather: compression, accounting and the emulated
//      WAN of the runtime apply): a reduce-scatter leaves module m's owner (modules are dealt round-robin over the
//      workers) with m's full sum; the owner takes m's Nesterov step and an all-gather ships the change to everyone
//      (an all-reduce's bytes). Weights and path counts go through an exact fp32 all-reduce. Nobody but the owner
//      holds a module's outer state.
// What a worker holds of the modules and how the round's sums reach the owners: held_modules.h (the owners' ring, or
// path-local workers: dipaco.path_local). Inner AdamW state is per path and follows the path from worker to worker;
// per-path early stopping keeps each path's parameters from its best round on a held-out slice of its shard
// (path_state.h: the shared RUN_DIR, or the run's store for path-local workers, which need no shared directory).
// A run resumes after its last complete round (--resume; what a round leaves on disk: resume.h); --stop-after-step S
// stops after the round that reaches step S, and so does SIGINT/SIGTERM after the round it came in: a round is one unit
// of the one run loop (runtime/run_loop.h), which votes on stopping after each, as it does after the trainer's steps.
#pragma once

#include <memory>

#include "tributary/config/run_config.h"
#include "tributary/runtime/run_loop.h"
#include "tributary/runtime/train_options.h"

namespace tributary::dipaco {

// This process's rounds, for run_loop(). Its summary is every kind of run's TrainSummary: outer_steps are the rounds,
// val_loss the routed validation loss (tokens after the 32-token prefix), val_loss_early that of every path's
// early-stopped parameters.
std::unique_ptr<WorkSource> make_path_rounds(const RunConfig& config, const TrainOptions& options);

}  // namespace tributary::dipaco
