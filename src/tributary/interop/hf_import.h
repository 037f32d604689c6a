// `tributary import HF_DIR --out RUN_DIR`: a Hugging Face Llama checkpoint (config.json, model.safetensors or shards
// listed by model.safetensors.index.json, its tokenizer: tokenizer.json of the byte-level BPE families, or
// tokenizer.model; copied into the checkpoint, which export writes back) as a model-only checkpoint of ours, which
// `eval`, `generate`, `export` and `train --set train.init_from=RUN_DIR` load. The inverse of hf_export: exporting the
// import of our own export gives the same bytes.
#pragma once

#include <string>

#include "tributary/core/fs.h"

namespace tributary {

// `data_dir`: the dataset recorded in the checkpoint's config (eval reads its validation split; its tokenizer must be
// the model's). Errors name the file or field: no config.json, another architecture, a missing or misshapen tensor,
// no tokenizer we can read (tokenizer.json, tokenizer.model, or tributary_tokenizer.json of a byte-level export), an
// --out that already holds files.
fs::path import_hf(const fs::path& dir, const fs::path& out, const std::string& data_dir);

}  // namespace tributary
