// Resuming a DiPaCo run (--resume) at a round boundary. What a round leaves on disk, written in this order:
//   RUN_DIR/inner/path-{p}.round-{r}.safetensors   each path's AdamW state (written by the task, worker.cpp)
//   RUN_DIR/outer/{module}.round-{R}.safetensors   each module's outer state — master copy, Nesterov momentum and
//                                                  step count — written by its owner (this file)
//   RUN_DIR/outer/feedback-worker-{w}.round-{R}.safetensors   path-local SparseLoCo: worker w's error feedback
//   (every worker waits for the others here)
//   RUN_DIR/modules/*, dipaco.json (round R)        by the lead, dipaco.json last (modules.h)
// so a dipaco.json that says round R finds every file of round R beside it. The rest follows from the round: each
// path's loader position and learning rate, the best-path copies (best/), the metrics (cut back to the round).
// Module ownership is recomputed from the workers of the resumed run, so another number of workers may resume.
// A round interrupted by a crash is run again from the start.
// Path-local workers with a run directory each (no shared filesystem): only the lead's holds dipaco.json and the
// module files; every owner's holds its modules' outer state (which has their master copies) and the path state it
// wrote. Such a run resumes with the same workers, each in its own directory: the others take the round from the lead
// and put their path state back into the fresh store.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "tributary/artifacts/modules.h"
#include "tributary/comm/group.h"
#include "tributary/config/run_config.h"
#include "tributary/core/fs.h"
#include "tributary/optim/module_feedback.h"
#include "tributary/optim/outer.h"
#include "tributary/runtime/dipaco/path_state.h"

namespace tributary {

using OuterStates = std::map<std::string, OuterOptimizer*>;  // by module id, the owned ones (HeldModules::outer)

// The run in `run_dir`, checked against `config`: Error naming the differing keys (train.steps, the grid, the
// model ...) and what to do.
DipacoRun load_resumable_dipaco_run(const fs::path& run_dir, const RunConfig& config);
// At start: the run to continue (`resume`; it resumes in its own directory), or none for a fresh run — which refuses
// a directory already holding a DiPaCo run unless `overwrite`.
std::optional<DipacoRun> open_dipaco_run_dir(const fs::path& run_dir, const RunConfig& config, bool resume,
                                             const std::string& resume_from, bool overwrite);
// A fresh run: what an earlier run left in this worker's run directory goes (path state, dipaco.json; the results if
// `lead`). Path-local workers may each have their own directory: a stale inner state there would be read when the
// store lacks a path's (e.g. after a skipped task). Call before the rendezvous, which nobody passes before everyone
// arrived (a shared directory is cleared before anyone writes to it).
void clear_earlier_run(const fs::path& run_dir, bool lead);
// The resumed modules' tensors into `modules` (every module of the grid, in the model's tensor order; files store
// tensors sorted by name), by name; Error naming a module or tensor the run lacks.
void adopt_modules(ModuleSet& modules, const ModuleSet& resumed, const fs::path& run_dir);
// Owners, after round `round`: their modules' outer state (atomic per file); the files of round - 2 go.
void save_outer_states(const fs::path& run_dir, int64_t round, const OuterStates& outer);
// Each owned module's outer state of round `round`; Error naming a missing or damaged file.
void load_outer_states(const fs::path& run_dir, int64_t round, const OuterStates& outer);
// A stand-in owner (its owner died): each module's outer state of round `round` where its owner wrote one into
// `run_dir` (a shared directory; before the first round there is none, nor in a dead path-local worker's own
// directory). Returns the modules without one, which start from their global parameters and zero momentum.
std::vector<std::string> take_over_outer_states(const fs::path& run_dir, int64_t round, const OuterStates& outer);
// Path-local SparseLoCo: worker `worker`'s error feedback after round `round` (atomic; round - 2's file goes), and
// back. A missing file (another worker count, or a run stopped before it sent anything) starts it from zero, saying
// so; a damaged one is an Error naming it.
void save_feedback(const fs::path& run_dir, int64_t round, int worker, const ModuleFeedback& feedback);
void load_feedback(const fs::path& run_dir, int64_t round, int worker, ModuleFeedback& feedback,
                   const std::vector<int64_t>& numel);
// Path-local --resume: the lead's round for everyone (collective). `from_lead`: this worker's directory has no
// dipaco.json; otherwise its own round must be the lead's (Error naming both).
int64_t agree_on_resumed_round(comm::Group& group, int64_t round, bool from_lead);
// Path-local --resume: every worker's path state back into the store, worker after worker (collective).
void republish_path_state(PathState& state, comm::Group& group, int64_t num_paths, int64_t round);

}  // namespace tributary
