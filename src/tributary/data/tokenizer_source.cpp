#include "tributary/data/tokenizer_source.h"

#include <optional>

#include "tributary/core/error.h"

namespace tributary {

std::unique_ptr<Tokenizer> copy_tokenizer(const fs::path& source, const fs::path& into, nlohmann::json& entry) {
  std::error_code ec;
  std::string kind;
  fs::path from = source;
  std::optional<int32_t> eot;
  // A dataset's dataset.json ({"tokenizer": {"kind", "eot_id"}}) or a checkpoint's state.json ({"tokenizer": kind,
  // "eot_id"}; no entry: byte): the kind and end of document recorded there.
  const auto recorded = [&](const fs::path& file, bool dataset) {
    const auto j = nlohmann::json::parse(read_file(file), nullptr, false);
    if (!j.is_object())
      fail("'{}' is not a JSON object: is '{}' a dataset or a checkpoint?", file.string(), source.string());
    const auto holder = dataset ? j.value("tokenizer", nlohmann::json()) : j;
    const auto named = !holder.is_object() ? nlohmann::json()
                       : dataset           ? holder.value("kind", nlohmann::json())
                                           : holder.value("tokenizer", nlohmann::json("byte"));
    if (!named.is_string())
      fail("'{}': no tokenizer entry: is '{}' a dataset or a checkpoint?", file.string(), source.string());
    kind = named.get<std::string>();
    if (holder.contains("eot_id") && holder["eot_id"].is_number_integer()) eot = holder["eot_id"].get<int32_t>();
  };
  if (fs::is_directory(source, ec)) {
    if (fs::is_regular_file(source / "dataset.json", ec)) {
      recorded(source / "dataset.json", true);
    } else if (fs::is_regular_file(source / "state.json", ec)) {
      recorded(source / "state.json", false);
    } else if (fs::is_regular_file(source / "tokenizer.model", ec)) {
      kind = "sentencepiece";
    } else if (fs::is_regular_file(source / "tokenizer.json", ec)) {
      kind = "bpe";
    } else {
      fail(
          "--tokenizer '{}': the directory holds no tokenizer.model, tokenizer.json, dataset.json or checkpoint "
          "state.json (for a run directory give its checkpoint, RUN/checkpoints/step-N)",
          source.string());
    }
  } else if (fs::is_regular_file(source, ec)) {
    const std::string ext = source.extension().string();
    if (ext != ".json" && ext != ".model")
      fail("--tokenizer '{}': a tokenizer file is a Hugging Face tokenizer.json (.json) or a SentencePiece .model",
           source.string());
    kind = ext == ".json" ? "bpe" : "sentencepiece";
    from = source.parent_path();
    const fs::path name = kind == "bpe" ? "tokenizer.json" : "tokenizer.model";
    fs::copy_file(source, into / name, fs::copy_options::overwrite_existing);
  } else {
    fail("--tokenizer '{}': neither byte, sentencepiece nor an existing tokenizer file or directory", source.string());
  }
  if (kind != "byte" && kind != "sentencepiece" && kind != "bpe")
    fail("--tokenizer '{}': its tokenizer kind '{}' is not byte, sentencepiece or bpe", source.string(), kind);
  for (const auto& file : tokenizer_files(from, kind))
    if (!fs::exists(into / file.filename(), ec)) fs::copy_file(file, into / file.filename());
  auto tokenizer = open_tokenizer(into, kind, eot);
  if (kind != "byte") entry["model"] = kind == "bpe" ? "tokenizer.json" : "tokenizer.model";
  entry["source"] = fs::absolute(source).string();
  return tokenizer;
}

}  // namespace tributary
