// Checkpoints: RUN_DIR/checkpoints/step-NNNNNNNN/ holding
//   model.safetensors   weights (names = module keys, see model/transformer.h)
//   optim.safetensors   optimizer state ("<param>.exp_avg", ...) and the torch RNG state ("rng.cpu")
//   state.json          step, tokens, elapsed time, loader position, tokenizer kind, optimizer step count
//   config.toml         the resolved run configuration
//   tokenizer.model     (SentencePiece datasets only) so eval/generate need nothing else
//   manifest.json       written last: every file's size and xxh64. A directory without it is not a checkpoint.
// Writes go to a temp directory (fsync per file), then one rename; only then are old checkpoints pruned (keep N).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "tributary/core/fs.h"
#include "tributary/core/safetensors.h"
#include "tributary/model/tensor_io.h"

namespace tributary {

struct CheckpointContents {
  NamedTensors model;
  NamedTensors optim;
  nlohmann::json state;
  std::string config_toml;
  fs::path tokenizer_model;  // empty: none to copy
};

// Returns the final checkpoint directory.
fs::path save_checkpoint(const fs::path& run_dir, int64_t step, const CheckpointContents& contents, int64_t keep);

// Newest complete checkpoint under RUN_DIR/checkpoints, if any.
std::optional<fs::path> latest_checkpoint(const fs::path& run_dir);

struct LoadedCheckpoint {
  fs::path dir;
  safetensors::File model;
  safetensors::File optim;
  nlohmann::json state;
  std::string config_toml;
};
// Verifies the manifest (sizes and checksums) before parsing anything; Error naming the file on any mismatch.
// `path` may be a checkpoint directory or a run directory (then its latest checkpoint).
LoadedCheckpoint load_checkpoint(const fs::path& path);

}  // namespace tributary
