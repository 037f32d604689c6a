#include "tributary/data/tokenizer.h"

#include "tributary/data/dataset.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <optional>

#include "tributary/core/error.h"
#include "tributary/core/log.h"
#include "tributary/data/bpe_tokenizer.h"

namespace tributary {

std::vector<int32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<uint8_t>(text[i]);
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  out.reserve(ids.size());
  for (int32_t id : ids)
    if (id >= 0 && id < 256) out.push_back(static_cast<char>(id));
  return out;
}

struct SentencePieceTokenizer::Impl {
  sentencepiece::SentencePieceProcessor processor;
  int64_t vocab = 0;
  int32_t eos = -1;
};

SentencePieceTokenizer::SentencePieceTokenizer(const fs::path& model_file) : impl_(std::make_unique<Impl>()) {
  if (const auto status = impl_->processor.Load(model_file.string()); !status.ok())
    fail("cannot load SentencePiece model '{}': {}", model_file.string(), status.ToString());
  impl_->vocab = impl_->processor.GetPieceSize();
  impl_->eos = impl_->processor.eos_id();
  if (impl_->eos < 0)
    fail("SentencePiece model '{}' has no end-of-sentence piece; train it with an eos id", model_file.string());
}
SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::vector<int32_t> SentencePieceTokenizer::encode(std::string_view text) const {
  std::vector<int> ids;
  if (const auto status = impl_->processor.Encode(text, &ids); !status.ok())
    fail("SentencePiece encode failed: {}", status.ToString());
  return {ids.begin(), ids.end()};
}

std::string SentencePieceTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::vector<int> in;
  for (int32_t id : ids)
    if (id != eot_id() && id >= 0 && id < vocab_size()) in.push_back(id);
  std::string out;
  if (const auto status = impl_->processor.Decode(in, &out); !status.ok())
    fail("SentencePiece decode failed: {}", status.ToString());
  return out;
}

int64_t SentencePieceTokenizer::vocab_size() const { return impl_->vocab; }
int32_t SentencePieceTokenizer::eot_id() const { return impl_->eos; }

namespace {

// SentencePiece 0.1.97 logs its whole command line before it reads --minloglevel, so its stderr goes to a temporary
// file while it trains, and into the error when training fails.
std::optional<std::string> train_quietly(const std::string& args) {
  char log_path[] = "/tmp/tributary-spm-XXXXXX";
  const int log_fd = mkstemp(log_path);
  const int saved = log_fd >= 0 ? dup(2) : -1;
  if (saved >= 0) dup2(log_fd, 2);
  const auto status = sentencepiece::SentencePieceTrainer::Train(args);
  std::string log;
  if (saved >= 0) {
    dup2(saved, 2);
    close(saved);
  }
  if (log_fd >= 0) {
    char buf[4096];
    lseek(log_fd, 0, SEEK_SET);
    for (ssize_t n; (n = read(log_fd, buf, sizeof(buf))) > 0;) log.append(buf, static_cast<size_t>(n));
    close(log_fd);
    unlink(log_path);
  }
  if (status.ok()) return std::nullopt;
  const size_t keep = 600;
  return status.ToString() +
         (log.empty() ? "" : "; its log ends: " + log.substr(log.size() - std::min(keep, log.size())));
}

}  // namespace

void train_sentencepiece(const std::vector<std::string_view>& texts, const fs::path& out_prefix,
                         const SentencePieceOptions& options) {
  // Train from a newline-separated sample file: the library's input is files of sentences.
  fs::path sample = out_prefix;
  sample += ".train.txt";
  {
    std::string buffer;
    for (auto t : texts) {
      if (static_cast<int64_t>(buffer.size()) >= options.max_training_bytes) break;
      buffer.append(t.substr(0, std::min<size_t>(t.size(), 1 << 16)));
      buffer.push_back('\n');
    }
    write_file(sample, buffer, /*sync=*/false);
  }
  std::string args = fmt::format(
      "--input={} --model_prefix={} --vocab_size={} --model_type={} --character_coverage=1.0 --byte_fallback=true "
      "--max_sentence_length=65536 --normalization_rule_name=identity --remove_extra_whitespaces=false "
      "--split_by_whitespace=true --pad_id=-1 --unk_id=0 --bos_id=-1 --eos_id=1 "
      "--minloglevel=2 --num_threads=2",
      sample.string(), out_prefix.string(), options.vocab_size, options.model_type);
  const std::optional<std::string> error = train_quietly(args);
  fs::remove(sample);
  if (error) fail("SentencePiece training failed ({}); try a smaller --vocab-size or more text", *error);
}

std::unique_ptr<Tokenizer> load_tokenizer(const fs::path& dataset_dir) {
  fs::path meta = dataset_dir / "dataset.json";
  if (!fs::exists(meta)) fail_not_a_dataset(dataset_dir);
  auto spec = nlohmann::json::parse(read_file(meta), nullptr, false);
  if (spec.is_discarded() || !spec.contains("tokenizer")) fail("'{}' is corrupt: no tokenizer entry", meta.string());
  const auto& entry = spec["tokenizer"];
  const std::string kind = entry.value("kind", "");
  if (kind != "byte" && kind != "sentencepiece" && kind != "bpe")
    fail("'{}': unknown tokenizer kind '{}' (expected byte, sentencepiece or bpe)", meta.string(), kind);
  std::optional<int32_t> eot;
  if (entry.contains("eot_id") && entry["eot_id"].is_number_integer()) eot = entry["eot_id"].get<int32_t>();
  return open_tokenizer(dataset_dir, kind, eot);
}

std::vector<fs::path> tokenizer_files(const fs::path& dir, const std::string& kind) {
  std::vector<fs::path> files;
  if (kind == "sentencepiece") files.push_back(dir / "tokenizer.model");
  if (kind == "bpe") {
    files.push_back(dir / "tokenizer.json");
    std::error_code ec;
    if (fs::is_regular_file(dir / "tokenizer_config.json", ec)) files.push_back(dir / "tokenizer_config.json");
  }
  return files;
}

std::unique_ptr<Tokenizer> open_tokenizer(const fs::path& dir, const std::string& kind, std::optional<int32_t> eot_id) {
  if (kind == "byte") return std::make_unique<ByteTokenizer>();
  if (kind == "sentencepiece") return std::make_unique<SentencePieceTokenizer>(dir / "tokenizer.model");
  if (kind == "bpe") return std::make_unique<BpeTokenizer>(dir / "tokenizer.json", eot_id);
  fail("'{}': unknown tokenizer kind '{}' (expected byte, sentencepiece or bpe)", dir.string(), kind);
}

}  // namespace tributary
