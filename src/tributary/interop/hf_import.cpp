#include "tributary/interop/hf_import.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <optional>
#include <set>

#include "tributary/artifacts/checkpoint.h"
#include "tributary/config/run_config.h"
#include "tributary/core/error.h"
#include "tributary/core/progress.h"
#include "tributary/core/safetensors.h"
#include "tributary/data/tokenizer.h"
#include "tributary/model/hf_llama.h"

namespace tributary {
namespace {

// `name` inside the model directory `dir`, if it is there: a regular file (not a device, a pipe or a directory) whose
// real place is inside `dir`. A link out of the directory (to a private key, to /dev/zero) is refused: an import
// copies what it reads into the new checkpoint and reads it whole.
std::optional<fs::path> own_file(const fs::path& dir, const std::string& name) {
  const fs::path path = dir / name;
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(path, ec))) return std::nullopt;
  if (!fs::is_regular_file(path, ec))
    fail("'{}' is not a regular file (a device, a pipe, a directory or a dangling link): import reads files only",
         path.string());
  const fs::path real = fs::weakly_canonical(path, ec), home = fs::weakly_canonical(dir, ec);
  const auto [end, at] = std::mismatch(home.begin(), home.end(), real.begin(), real.end());
  if (end != home.end())
    fail("'{}' is a link to '{}', outside '{}': import reads only the directory's own files (copy it in)",
         path.string(), real.string(), dir.string());
  return path;
}

// Every tensor of the checkpoint by name: model.safetensors, or the shards its index names.
std::map<std::string, torch::Tensor> read_hf_tensors(const fs::path& dir) {
  std::vector<fs::path> files;
  if (const auto index_file = own_file(dir, "model.safetensors.index.json")) {
    const fs::path& index = *index_file;
    const auto j = nlohmann::json::parse(read_file(index), nullptr, false);
    if (j.is_discarded() || !j.contains("weight_map") || !j["weight_map"].is_object())
      fail("{}: no 'weight_map' object", index.string());
    std::set<std::string> shards;
    for (const auto& [name, file] : j["weight_map"].items()) {
      if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos)
        fail("{}: weight_map['{}'] is not a file name of this directory", index.string(), name);
      shards.insert(file.get<std::string>());
    }
    for (const auto& shard : shards) files.push_back(shard);
  } else {
    files.push_back("model.safetensors");
  }
  std::map<std::string, torch::Tensor> tensors;
  for (const auto& name : files) {
    const auto own = own_file(dir, name);
    if (!own) fail("'{}' is missing: an import needs the model's weights in safetensors", (dir / name).string());
    const fs::path& file = *own;
    const auto loaded = safetensors::File::load(file);
    for (const auto& [name, view] : loaded.tensors())
      if (!tensors.emplace(name, to_torch(view)).second)
        fail("{}: tensor '{}' appears in more than one shard", file.string(), name);
  }
  return tensors;
}

// The tokenizer: "byte" (a byte-level export of ours), "sentencepiece" (tokenizer.model beside the weights: preferred
// where a tokenizer.json converted from it is there too) or "bpe" (a tokenizer.json of the byte-level BPE families).
std::string tokenizer_kind(const fs::path& dir) {
  const bool sentencepiece = own_file(dir, "tokenizer.model").has_value();
  if (const auto ours = own_file(dir, "tributary_tokenizer.json")) {
    const auto j = nlohmann::json::parse(read_file(*ours), nullptr, false);
    const auto type_field = j.is_object() && j.contains("type") ? j["type"] : nlohmann::json();
    const std::string type = type_field.is_string() ? type_field.get<std::string>() : std::string();
    if (type == "byte") return type;
    if (type == "sentencepiece" && sentencepiece) return type;
    fail("{}: type '{}' is not byte, or sentencepiece with tokenizer.model beside it", ours->string(), type);
  }
  if (sentencepiece) return "sentencepiece";
  if (own_file(dir, "tokenizer.json")) return "bpe";
  fail(
      "'{}' has no tokenizer (tokenizer.json: a Hugging Face byte-level BPE; tokenizer.model: SentencePiece; "
      "tributary_tokenizer.json: a byte-level export of ours): copy the model's tokenizer files beside its weights",
      dir.string());
}

}  // namespace

fs::path import_hf(const fs::path& dir, const fs::path& out, const std::string& data_dir) {
  require_empty_output(out, "--out");
  const auto own_config = own_file(dir, "config.json");
  if (!own_config)
    fail("'{}' is missing: is '{}' a Hugging Face model directory?", (dir / "config.json").string(), dir.string());
  const fs::path& config_file = *own_config;
  RunConfig config;
  config.model = llama_model_config(read_file(config_file), config_file.string());
  config.data.dir = data_dir;
  try {
    config.validate();
  } catch (const Error& e) {  // the keys are ours: say which file they came from
    fail("{}: the model it describes cannot be built: {}", config_file.string(), e.what());
  }
  const std::string kind = tokenizer_kind(dir);
  // The tokenizer loads, and every id it gives has a row of the embedding: checked here, not at the first eval.
  std::vector<fs::path> tokenizer_sources;
  for (const auto& file : tokenizer_files(dir, kind)) tokenizer_sources.push_back(*own_file(dir, file.filename()));
  const auto tokenizer = open_tokenizer(dir, kind);
  if (tokenizer->vocab_size() > config.model.vocab_size)
    fail("{}: vocab_size = {} is smaller than the tokenizer's {} ids ({}): not this model's tokenizer",
         config_file.string(), config.model.vocab_size, tokenizer->vocab_size(),
         tokenizer_sources.empty() ? std::string("byte-level") : tokenizer_sources.front().string());
  Progress progress("import", 3, "steps");  // read, convert, write: a large model takes a while on each
  auto tensors = read_hf_tensors(dir);
  // The model config.json describes is built only if the weights could fill it (a config of a few hundred bytes may
  // ask for terabytes).
  int64_t held = 0;
  for (const auto& [name, t] : tensors) held += t.numel();
  const int64_t wanted = config.model.num_parameters(config.model.vocab_size);
  if (wanted > held)
    fail("{} describes a model of {} parameters, but the weights beside it hold {} values: not this model's weights",
         config_file.string(), wanted, held);
  Transformer model(config.model);
  progress.advance();
  const NamedTensors params = from_hf_llama(model, std::move(tensors), dir.string());
  progress.advance();
  const nlohmann::json state = {{"step", 0},
                                {"tokens", 0},
                                {"tokenizer", kind},
                                {"eot_id", tokenizer->eot_id()},
                                {"imported_from", fs::absolute(dir).string()}};
  const fs::path saved = save_checkpoint(out, 0, {params, {}, state, config.to_toml(), tokenizer_sources}, 1);
  progress.done();
  return saved;
}

}  // namespace tributary
