#include "tributary/interop/hf_export.h"

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "tributary/artifacts/inference.h"
#include "tributary/artifacts/modules.h"
#include "tributary/core/error.h"
#include "tributary/core/log.h"
#include "tributary/core/progress.h"
#include "tributary/data/bpe_tokenizer.h"
#include "tributary/data/hf_tokenizer.h"
#include "tributary/model/hf_llama.h"

namespace tributary {

namespace {

// A DiPaCo path assembled as a dense checkpoint in a scratch directory of our own, removed when done.
struct PathCheckpoint {
  fs::path dir;
  PathCheckpoint(const fs::path& run_dir, int64_t path) {
    const DipacoRun run = load_dipaco_run(run_dir);
    run.grid.path_modules(path);  // Error naming the range when out of it
    dir = fs::temp_directory_path() / fmt::format("tributary-export-{}-{}", ::getpid(), path);
    fs::remove_all(dir);
    export_path(run, path, dir, /*early_stopped=*/false);
  }
  ~PathCheckpoint() {
    std::error_code ignored;
    fs::remove_all(dir, ignored);
  }
};

void write_hf_tokenizer(const fs::path& out, const HfTokenizer& hf) {
  write_file_atomic(out / "tokenizer.json", hf.tokenizer.dump(2) + "\n");
  write_file_atomic(out / "tokenizer_config.json", hf.config.dump(2) + "\n");
}

}  // namespace

fs::path export_hf(const std::string& run_or_checkpoint, const fs::path& out, std::optional<int64_t> path) {
  require_empty_output(out, "--out");
  const bool dipaco = fs::exists(fs::path(run_or_checkpoint) / "dipaco.json");
  if (dipaco && !path) fail("'{}' is a DiPaCo run: say which path to export with --path P", run_or_checkpoint);
  if (!dipaco && path) fail("--path {}: '{}' is not a DiPaCo run (it has one model)", *path, run_or_checkpoint);
  std::optional<PathCheckpoint> assembled;
  if (dipaco) assembled.emplace(run_or_checkpoint, *path);
  Progress progress("export", 3, "steps");  // read, convert, write: a large model takes a while on each
  const LoadedModel loaded = load_model(dipaco ? assembled->dir.string() : run_or_checkpoint, torch::kCPU);
  const ModelConfig& c = loaded.config.model;
  check_llama_shaped(c);
  progress.advance();
  fs::create_directories(out);
  write_file_atomic(out / "config.json", hf_llama_config_json(c));
  std::string weights = tensors_to_safetensors(to_hf_llama(*loaded.model), {{"format", "pt"}});
  progress.advance();
  write_file_atomic(out / "model.safetensors", weights);
  progress.done();
  nlohmann::json tokenizer = {{"type", loaded.tokenizer->kind()},
                              {"vocab_size", loaded.tokenizer->vocab_size()},
                              {"eot_id", loaded.tokenizer->eot_id()}};
  const int64_t max_length = c.context;
  if (loaded.tokenizer->kind() == "byte") {
    tokenizer["ids"] = "id b < 256 is the byte b; 256 ends a document";
    write_hf_tokenizer(out, hf_byte_tokenizer(loaded.tokenizer->eot_id(), max_length));
  } else if (loaded.tokenizer->kind() == "bpe") {
    // The model's own tokenizer.json, written back as it was imported (and its tokenizer_config.json, or one that
    // names the end of a document as transformers' eos_token).
    for (const auto& file : tokenizer_files(loaded.dir, "bpe"))
      write_file_atomic(out / file.filename(), read_file(file));
    if (!fs::exists(out / "tokenizer_config.json")) {
      const BpeTokenizer bpe(loaded.dir / "tokenizer.json", loaded.tokenizer->eot_id());
      const nlohmann::json config = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                                     {"eos_token", bpe.token_text(loaded.tokenizer->eot_id())},
                                     {"model_max_length", max_length}};
      write_file_atomic(out / "tokenizer_config.json", config.dump(2) + "\n");
    }
    tokenizer["file"] = "tokenizer.json";
  } else {
    const fs::path model_file = loaded.dir / "tokenizer.model";
    const std::string bytes = read_file(model_file);
    write_file_atomic(out / "tokenizer.model", bytes);
    tokenizer["file"] = "tokenizer.model";
    const SentencePieceModel model = SentencePieceModel::parse(bytes, model_file.string());
    if (const std::string why = hf_unsupported(model); why.empty())
      write_hf_tokenizer(out, hf_sentencepiece_tokenizer(model, loaded.tokenizer->eot_id(), max_length));
    else
      log::warn("export: no tokenizer.json for '{}', a SentencePiece model with {}: tokenizer.model only",
                model_file.string(), why);
  }
  write_file_atomic(out / "tributary_tokenizer.json", tokenizer.dump(2) + "\n");
  return out;
}

}  // namespace tributary
