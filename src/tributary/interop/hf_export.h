// `tributary export RUN_OR_CHECKPOINT --format hf --out DIR`: the trained dense model in the Hugging Face Llama layout
// (model/hf_llama.h): config.json, model.safetensors (fp32, Hugging Face names) and the tokenizer beside them
// (the byte tokenizer as tokenizer.json + tokenizer_config.json, which transformers' AutoTokenizer reads;
// tokenizer.model for SentencePiece; tributary_tokenizer.json says which ids are which). Local parallelism's auxiliary
// heads live in their own files and are never exported; a DiPaCo run exports one path (`path`, as `export-path`
// assembles it).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "tributary/core/fs.h"

namespace tributary {

// Errors name the file or key: a DiPaCo run without a path, a model without a Llama counterpart, an --out that
// already has files.
fs::path export_hf(const std::string& run_or_checkpoint, const fs::path& out, std::optional<int64_t> path = {});

}  // namespace tributary
