// Resuming a DiPaCo run (--resume) at a round boundary. What a round leaves on disk, written in this order:
//   RUN_DIR/inner/path-{p}.round-{r}.safetensors   each path's AdamW state (written by the task, worker.cpp)
//   RUN_DIR/outer/{module}.round-{R}.safetensors   each module's outer state — master copy, Nesterov momentum and
//                                                  step count — written by its owner (this file)
//   (every worker waits for the others here)
//   RUN_DIR/modules/*, dipaco.json (round R)        by the lead, dipaco.json last (modules.h)
// so a dipaco.json that says round R finds every file of round R beside it. The rest follows from the round: each
// path's loader position and learning rate, the best-path copies (best/), the metrics (cut back to the round).
// Module ownership is recomputed from the workers of the resumed run, so another number of workers may resume.
// A round interrupted by a crash is run again from the start.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "tributary/core/fs.h"
#include "tributary/optim/outer.h"
#include "tributary/runtime/dipaco/modules.h"
#include "tributary/runtime/run_config.h"

namespace tributary {

using OuterStates = std::map<std::string, std::unique_ptr<OuterOptimizer>>;  // by module id, the owned ones

// The run in `run_dir`, checked against `config`: Error naming the differing keys (train.steps, the grid, the
// model ...) and what to do.
DipacoRun load_resumable_dipaco_run(const fs::path& run_dir, const RunConfig& config);
// At start: the run to continue (`resume`; it resumes in its own directory), or none for a fresh run — which refuses
// a directory already holding a DiPaCo run unless `overwrite`.
std::optional<DipacoRun> open_dipaco_run_dir(const fs::path& run_dir, const RunConfig& config, bool resume,
                                             const std::string& resume_from, bool overwrite);
// The resumed modules' tensors into `modules` (every module of the grid, in the model's tensor order; files store
// tensors sorted by name), by name; Error naming a module or tensor the run lacks.
void adopt_modules(ModuleSet& modules, const ModuleSet& resumed, const fs::path& run_dir);
// Owners, after round `round`: their modules' outer state (atomic per file); the files of round - 2 go.
void save_outer_states(const fs::path& run_dir, int64_t round, const OuterStates& outer);
// Each owned module's outer state of round `round`; Error naming a missing or damaged file.
void load_outer_states(const fs::path& run_dir, int64_t round, OuterStates& outer);

}  // namespace tributary
