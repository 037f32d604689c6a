#include "tributary/runtime/hf_import.h"

#include <nlohmann/json.hpp>

#include <set>

#include "tributary/core/error.h"
#include "tributary/core/progress.h"
#include "tributary/core/safetensors.h"
#include "tributary/model/hf_llama.h"
#include "tributary/runtime/checkpoint.h"
#include "tributary/runtime/run_config.h"

namespace tributary {
namespace {

// Every tensor of the checkpoint by name: model.safetensors, or the shards its index names.
std::map<std::string, torch::Tensor> read_hf_tensors(const fs::path& dir) {
  std::vector<fs::path> files;
  const fs::path index = dir / "model.safetensors.index.json";
  if (fs::exists(index)) {
    const auto j = nlohmann::json::parse(read_file(index), nullptr, false);
    if (j.is_discarded() || !j.contains("weight_map") || !j["weight_map"].is_object())
      fail("{}: no 'weight_map' object", index.string());
    std::set<std::string> shards;
    for (const auto& [name, file] : j["weight_map"].items()) {
      if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos)
        fail("{}: weight_map['{}'] is not a file name of this directory", index.string(), name);
      shards.insert(file.get<std::string>());
    }
    for (const auto& shard : shards) files.push_back(dir / shard);
  } else {
    files.push_back(dir / "model.safetensors");
  }
  std::map<std::string, torch::Tensor> tensors;
  for (const auto& file : files) {
    if (!fs::exists(file)) fail("'{}' is missing: an import needs the model's weights in safetensors", file.string());
    const auto loaded = safetensors::File::load(file);
    for (const auto& [name, view] : loaded.tensors())
      if (!tensors.emplace(name, to_torch(view)).second)
        fail("{}: tensor '{}' appears in more than one shard", file.string(), name);
  }
  return tensors;
}

// The tokenizer: "byte" (a byte-level export of ours) or "sentencepiece" (tokenizer.model beside the weights).
std::string tokenizer_kind(const fs::path& dir) {
  const fs::path ours = dir / "tributary_tokenizer.json";
  if (fs::exists(ours)) {
    const auto j = nlohmann::json::parse(read_file(ours), nullptr, false);
    const std::string type = j.is_object() ? j.value("type", std::string()) : std::string();
    if (type == "byte") return type;
    if (type == "sentencepiece" && fs::exists(dir / "tokenizer.model")) return type;
    fail("{}: type '{}' is not byte, or sentencepiece with tokenizer.model beside it", ours.string(), type);
  }
  if (fs::exists(dir / "tokenizer.model")) return "sentencepiece";
  fail(
      "'{}' has no tokenizer this tool reads (tokenizer.model: SentencePiece; tributary_tokenizer.json); a "
      "tokenizer.json (Hugging Face BPE) alone is not supported",
      dir.string());
}

}  // namespace

fs::path import_hf(const fs::path& dir, const fs::path& out, const std::string& data_dir) {
  require_empty_output(out, "--out");
  const fs::path config_file = dir / "config.json";
  if (!fs::exists(config_file))
    fail("'{}' is missing: is '{}' a Hugging Face model directory?", config_file.string(), dir.string());
  RunConfig config;
  config.model = llama_model_config(read_file(config_file), config_file.string());
  config.data.dir = data_dir;
  config.validate();
  const std::string kind = tokenizer_kind(dir);
  Progress progress("import", 3, "steps");  // read, convert, write: a large model takes a while on each
  Transformer model(config.model);
  auto tensors = read_hf_tensors(dir);
  progress.advance();
  const NamedTensors params = from_hf_llama(model, std::move(tensors), dir.string());
  progress.advance();
  const nlohmann::json state = {
      {"step", 0}, {"tokens", 0}, {"tokenizer", kind}, {"imported_from", fs::absolute(dir).string()}};
  const fs::path tok_model = kind == "sentencepiece" ? dir / "tokenizer.model" : fs::path();
  const fs::path saved = save_checkpoint(out, 0, {params, {}, state, config.to_toml(), tok_model}, 1);
  progress.done();
  return saved;
}

}  // namespace tributary
