// Where a training run starts from and what it leaves: the run directory (fresh, --overwrite, or --resume with the
// same configuration and number of workers), train.init_from, restoring a checkpoint into the model, optimizer,
// RNG and loader, and saving one (every rank's replica and the outer state in multi-process runs).
#pragma once

#include <functional>
#include <optional>

#include "tributary/artifacts/checkpoint.h"
#include "tributary/data/dataset.h"
#include "tributary/data/loader.h"
#include "tributary/model/tensor_io.h"
#include "tributary/model/transformer.h"
#include "tributary/optim/adamw.h"
#include "tributary/runtime/ft/admission.h"
#include "tributary/runtime/replica_checkpoint.h"
#include "tributary/runtime/train_options.h"

namespace tributary {

// Resolves model.vocab_size from the dataset, checks a resume against the checkpoint (same config up to the
// resumable keys, same number of workers), refuses to silently reuse a run directory, prepares it and writes
// config.toml (rank 0). Returns the checkpoint to resume from, if any.
std::optional<LoadedCheckpoint> prepare_run(RunConfig& config, const TrainOptions& options, const Dataset& dataset);

// The steps a rank can resume from (oldest first): every complete checkpoint of the directory `ckpt` was found in, or
// `ckpt`'s step alone when --resume DIR named it. Empty without a checkpoint.
std::vector<int64_t> resumable_steps(const std::optional<LoadedCheckpoint>& ckpt, const TrainOptions& options);
// Replaces `ckpt` by the checkpoint of `step` beside it (the newest step every rank holds), when it is another.
void resume_at(LoadedCheckpoint& ckpt, int64_t step);

// The progress a checkpoint carries.
struct RunProgress {
  int64_t step = 0, tokens = 0;
  double elapsed_before = 0;
};

// train.init_from (fresh runs only): the weights of another checkpoint; the optimizer and schedule start over.
void init_from(Transformer& model, const std::string& from);
// Loads this rank's replica (parameters, AdamW state, RNG, loader position) and returns the progress.
// Elastic resume (replicas of the whole model, a checkpoint of another number of workers than `world_size`): every
// rank loads rank 0's replica — its parameters (the global ones after an outer step), AdamW state and RNG — and the
// data is re-sharded from rank 0's position (BatchLoader::reshard); DiLoCo's outer state is shared anyway.
RunProgress restore(LoadedCheckpoint& ckpt, Transformer& model, AdamW& optimizer, BatchLoader& loader, int rank,
                    int world_size);

// Fault tolerance: what a joining worker receives from the lead — the trained parameters and AdamW state (in
// place, `trained` and `optimizer`'s state on both sides), the step, tokens and loader position — and applying the
// lead's meta on the joiner. The joiner reads its own rank's windows from the lead's position on; the steps it
// missed are not replayed.
HealState heal_state(const NamedTensors& trained, const AdamW& optimizer, const BatchLoader& loader,
                     const RunProgress& progress);
// A restarted worker (DistEnv::joining) instead of ReplicaRounds::start: waits to be admitted (or healed mid-round:
// then the PendingHeal) and takes the lead's state; when the run ended first, progress.step = total_steps.
std::optional<PendingHeal> join_run(Admission& admission, NamedTensors& trained, AdamW& optimizer, BatchLoader& loader,
                                    RunProgress& progress, int64_t total_steps);
// The same for a member whose state is more than one rank's (a pipeline's, runtime/sync/pipeline_state.h): `state`
// (the names and shapes the lead sends) is received in place, its first tensors being `params`.
std::optional<PendingHeal> join_run(Admission& admission, NamedTensors& params, HealState state, AdamW& optimizer,
                                    BatchLoader& loader, RunProgress& progress, int64_t total_steps);

struct SaveRequest {
  const RunConfig& config;
  const Dataset& dataset;
  NamedTensors& params;
  const AdamW& optimizer;
  const BatchLoader& loader;
  // The multi-process run's part (every rank takes part): `mine` staged for rank 0 or published (the replicas'
  // outer state, a pipeline stage's, the islands' whole outer state); false on the ranks that do not publish. Empty
  // for one process.
  std::function<bool(const fs::path& run_dir, int64_t step, const RankState& mine, CheckpointContents& contents)>
      stage_state;
  // local parallelism: the auxiliary heads, kept beside the model (kAuxHeadsFile)
  const NamedTensors* aux_heads = nullptr;
  // The optimizer's state, read once by a caller that may take the checkpoint again (ZeRO-1 reads it with its island,
  // which takes part once); null: read here.
  const NamedTensors* optimizer_state = nullptr;
};

// Local parallelism's auxiliary heads in a checkpoint: beside model.safetensors, so export/eval/generate, which read
// the model, never see them, and --resume restores them.
inline const std::string kAuxHeadsFile = "aux_heads.safetensors";

// Writes checkpoint step-N (every rank takes part in a multi-process checkpoint). Returns its path on rank 0, an
// empty path elsewhere.
fs::path save_run(const SaveRequest& request, int64_t step, int64_t tokens, double elapsed);

}  // namespace tributary
