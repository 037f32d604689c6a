// How long one optimizer step takes this rank, measured at start-up: what runs paced by measurement read (StartState::
// step_seconds). parallel.island_steps = "auto": islands of unlike speed (Async Local-SGD's dynamic local updates,
// measured once) — the run all-gathers the times, an island is as slow as its slowest rank, and island i takes
// round(T_slowest / T_i) optimizer steps per tick (parallel/island_shape.h), so every island's tick lasts about as long
// and none waits for the others at an outer step; the schedule is logged and kept in every checkpoint, so a resumed run
// keeps it and `parallel.island_steps = '<the logged steps>'` replays the run. dist.round_seconds = -1: asynchronous
// DiLoCo's time-paced rounds last dist.inner_steps steps of the median member (runtime/sync/async_sync.h).
#pragma once

#include <torch/torch.h>

#include "tributary/config/run_config.h"
#include "tributary/model/transformer.h"

namespace tributary {

// Seconds one optimizer step of `model` takes this rank: the median of three timed steps after a warm-up one, times
// `slow_factor`. Leaves the parameters, their gradients (none), the data and the global random generator as they were.
double measure_step_seconds(Transformer& model, const RunConfig& config, torch::Device device, double slow_factor);

}  // namespace tributary
