// Where a model's own tokenizer comes from (`data build --tokenizer PATH`): a Hugging Face tokenizer.json, a
// SentencePiece .model, or a directory holding one — a Hugging Face model directory, a checkpoint (its state.json
// names the kind), a dataset (its dataset.json does). The CLI turns a run directory into its newest checkpoint first.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>

#include "tributary/core/fs.h"
#include "tributary/data/tokenizer.h"

namespace tributary {

// Copies the tokenizer at `source` into `into` under a dataset's names (tokenizer.json and tokenizer_config.json, or
// tokenizer.model; data/tokenizer.h tokenizer_files), opens it there, and sets `entry`'s "model" and "source" (the
// dataset.json entry; the caller adds kind, vocabulary and end of document). Error naming `source` for a path that is
// neither, a directory without a tokenizer, or a recorded kind that is not byte, sentencepiece or bpe.
std::unique_ptr<Tokenizer> copy_tokenizer(const fs::path& source, const fs::path& into, nlohmann::json& entry);

}  // namespace tributary
