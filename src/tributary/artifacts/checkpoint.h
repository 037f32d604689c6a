// Checkpoints: RUN_DIR/checkpoints/step-NNNNNNNN/ holding
//   model.safetensors   weights (names = module keys, see model/transformer.h)
//   optim.safetensors   optimizer state ("<param>.exp_avg", ...) and the torch RNG state ("rng.cpu")
//   state.json          step, tokens, elapsed time, loader position, tokenizer kind, optimizer step count
//   config.toml         the resolved run configuration
//   tokenizer.model     (SentencePiece datasets) or tokenizer.json (+ tokenizer_config.json; bpe datasets): the
//                       dataset's tokenizer (data/tokenizer.h tokenizer_files), so eval/generate/export need nothing
//                       else
//   manifest.json       written last: every file's size and xxh64. A directory without it is not a checkpoint.
// Multi-process runs add, per rank R >= 1, rank-R.model.safetensors and rank-R.optim.safetensors (that replica's
// parameters, optimizer state and RNG; rank 0's are model/optim) and outer.safetensors (DiLoCo's global parameters
// and momentum, identical on every rank), and with a stateful codec rank-R.codec.safetensors for every rank, 0
// included (its error feedback: what it has not sent yet). The other ranks write their files into staging_dir() first;
// rank 0 then writes its own files and the manifest covering all of them, and renames: one rename publishes every
// rank's state. A rank on a machine that does not share rank 0's run directory keeps a whole checkpoint of its own
// replica in RUN_DIR/ranks/rank-R/checkpoints/step-N instead (runtime/replica_checkpoint.h).
// Writes go to a temp directory (fsync per file), then one rename; only then are old checkpoints pruned (keep N).
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "tributary/core/fs.h"
#include "tributary/core/safetensors.h"
#include "tributary/model/tensor_io.h"

namespace tributary {

struct StagedFile {  // written by another rank into staging_dir(run_dir, step)
  std::string name;
  uint64_t bytes = 0;
  uint64_t xxh64 = 0;
};

struct CheckpointContents {
  NamedTensors model;
  NamedTensors optim;
  nlohmann::json state;
  std::string config_toml;
  std::vector<fs::path> tokenizer_files;                            // copied under their own names
  std::vector<std::pair<std::string, NamedTensors>> extra_tensors;  // more safetensors files (name, tensors)
  std::vector<StagedFile> staged;  // non-empty: the temp directory is staging_dir(), already holding them
};

// Where the other ranks of a multi-process run put their files for the checkpoint of `step`.
fs::path staging_dir(const fs::path& run_dir, int64_t step);
// Writes `bytes` to `dir / name` (fsync) and returns its manifest entry.
StagedFile stage_file(const fs::path& dir, const std::string& name, const std::string& bytes);

// Returns the final checkpoint directory.
fs::path save_checkpoint(const fs::path& run_dir, int64_t step, const CheckpointContents& contents, int64_t keep);

// The steps of the complete checkpoints under RUN_DIR/checkpoints, oldest first.
std::vector<int64_t> checkpoint_steps(const fs::path& run_dir);
// The directory of step `step`'s checkpoint under RUN_DIR/checkpoints.
fs::path checkpoint_dir(const fs::path& run_dir, int64_t step);
// Newest complete checkpoint under RUN_DIR/checkpoints, if any.
std::optional<fs::path> latest_checkpoint(const fs::path& run_dir);

struct LoadedCheckpoint {
  fs::path dir;
  safetensors::File model;
  safetensors::File optim;
  nlohmann::json state;
  std::string config_toml;
  std::map<std::string, std::string> other_files;  // every other file of the manifest, by name (verified bytes)

  bool has(const std::string& name) const { return other_files.count(name) > 0; }
  safetensors::File tensors(const std::string& name) const;  // Error naming the checkpoint if absent
};
// Verifies the manifest (sizes and checksums) before parsing anything; Error naming the file on any mismatch.
// `path` may be a checkpoint directory or a run directory (then its latest checkpoint).
LoadedCheckpoint load_checkpoint(const fs::path& path);

}  // namespace tributary
