#include "tributary/runtime/hf_export.h"

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "tributary/core/error.h"
#include "tributary/model/hf_llama.h"
#include "tributary/runtime/dipaco/modules.h"
#include "tributary/runtime/inference.h"

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

// A code point as UTF-8.
std::string utf8(uint32_t cp) {
  std::string out;
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
  return out;
}

// Our byte tokenizer (id b < 256 is byte b, 256 ends a document) in the `tokenizers` library's format: a byte-level
// BPE without merges, whose vocabulary is GPT-2's printable stand-in for each byte (the ByteLevel pre-tokenizer's
// alphabet) at the byte's own id, and the end of a document as a special added token. transformers'
// PreTrainedTokenizerFast (AutoTokenizer) then encodes text to our ids and decodes them back.
nlohmann::json byte_level_tokenizer(int32_t eot_id) {
  std::vector<uint32_t> stand_in(256, 0);
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    stand_in[b] = printable ? b : next++;
  }
  nlohmann::json vocab = nlohmann::json::object();
  for (uint32_t b = 0; b < 256; ++b) vocab[utf8(stand_in[b])] = b;
  const std::string eot = "<|endoftext|>";
  vocab[eot] = eot_id;
  const nlohmann::json byte_level = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}};
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens",
           {{{"id", eot_id},
             {"content", eot},
             {"single_word", false},
             {"lstrip", false},
             {"rstrip", false},
             {"normalized", false},
             {"special", true}}}},
          {"normalizer", nullptr},
          {"pre_tokenizer", byte_level},
          {"post_processor", nullptr},
          {"decoder", byte_level},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"ignore_merges", false},
            {"vocab", vocab},
            {"merges", nlohmann::json::array()}}}};
}

}  // namespace

fs::path export_hf(const std::string& run_or_checkpoint, const fs::path& out, std::optional<int64_t> path) {
  require_empty_output(out, "--out");
  const bool dipaco = fs::exists(fs::path(run_or_checkpoint) / "dipaco.json");
  if (dipaco && !path) fail("'{}' is a DiPaCo run: say which path to export with --path P", run_or_checkpoint);
  if (!dipaco && path) fail("--path {}: '{}' is not a DiPaCo run (it has one model)", *path, run_or_checkpoint);
  std::optional<PathCheckpoint> assembled;
  if (dipaco) assembled.emplace(run_or_checkpoint, *path);
  const LoadedModel loaded = load_model(dipaco ? assembled->dir.string() : run_or_checkpoint, torch::kCPU);
  const ModelConfig& c = loaded.config.model;
  check_llama_shaped(c);
  fs::create_directories(out);
  write_file_atomic(out / "config.json", hf_llama_config_json(c));
  write_file_atomic(out / "model.safetensors", tensors_to_safetensors(to_hf_llama(*loaded.model), {{"format", "pt"}}));
  nlohmann::json tokenizer = {{"type", loaded.tokenizer->kind()},
                              {"vocab_size", loaded.tokenizer->vocab_size()},
                              {"eot_id", loaded.tokenizer->eot_id()}};
  if (loaded.tokenizer->kind() == "byte") {
    tokenizer["ids"] = "id b < 256 is the byte b; 256 ends a document";
    write_file_atomic(out / "tokenizer.json", byte_level_tokenizer(loaded.tokenizer->eot_id()).dump(2) + "\n");
    const nlohmann::json config = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                                   {"eos_token", "<|endoftext|>"},
                                   {"model_max_length", c.context},
                                   {"clean_up_tokenization_spaces", false}};
    write_file_atomic(out / "tokenizer_config.json", config.dump(2) + "\n");
  } else {
    write_file_atomic(out / "tokenizer.model", read_file(loaded.dir / "tokenizer.model"));
    tokenizer["file"] = "tokenizer.model";
  }
  write_file_atomic(out / "tributary_tokenizer.json", tokenizer.dump(2) + "\n");
  return out;
}

}  // namespace tributary
