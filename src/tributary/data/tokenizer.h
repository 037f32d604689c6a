// Tokenizers turn text into token ids and back. Byte-level is the default (vocab 256 bytes + end-of-text);
// SentencePiece (BPE or unigram: trained with libsentencepiece, or a model's own tokenizer.model) and a Hugging Face
// tokenizer.json of the byte-level BPE families (data/bpe_tokenizer.h: a model's own) are the subword options. A
// dataset directory records which one it was built with (dataset.json "tokenizer") and holds its file; a checkpoint
// holds a copy too, so training, eval, generate and export always agree.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tributary/core/fs.h"

namespace tributary {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int32_t eot_id() const = 0;  // appended after every document
  // Put before every document, where the model's own tokenizer says so (a tokenizer.json whose template begins with a
  // special token: Llama 3's <|begin_of_text|>); none otherwise.
  virtual std::optional<int32_t> bos_id() const { return std::nullopt; }
  virtual std::string kind() const = 0;  // "byte" | "sentencepiece" | "bpe"
};

class ByteTokenizer final : public Tokenizer {
 public:
  static constexpr int32_t kEot = 256;
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return 257; }
  int32_t eot_id() const override { return kEot; }
  std::string kind() const override { return "byte"; }
};

class SentencePieceTokenizer final : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(const fs::path& model_file);  // Error naming the file if it cannot be loaded
  ~SentencePieceTokenizer() override;
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override;
  int32_t eot_id() const override;
  std::string kind() const override { return "sentencepiece"; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct SentencePieceOptions {
  int64_t vocab_size = 4096;
  std::string model_type = "bpe";        // bpe | unigram
  int64_t max_training_bytes = 8 << 20;  // sample of the corpus used to train
};

// Trains a SentencePiece model on `texts` and writes `<out_prefix>.model`.
void train_sentencepiece(const std::vector<std::string_view>& texts, const fs::path& out_prefix,
                         const SentencePieceOptions& options);

// The tokenizer a dataset directory was built with (reads dataset.json).
std::unique_ptr<Tokenizer> load_tokenizer(const fs::path& dataset_dir);

// The files in `dir` (a dataset or a checkpoint directory) that hold its tokenizer of `kind`: tokenizer.model for
// sentencepiece; tokenizer.json, and tokenizer_config.json where it is there, for bpe; none for byte. A checkpoint
// copies them under the same names.
std::vector<fs::path> tokenizer_files(const fs::path& dir, const std::string& kind);

// The tokenizer of `kind` whose files are in `dir`; `eot_id`: the end of a document as recorded (bpe; for the others
// it is the tokenizer's own). Error naming `dir` for an unknown kind or a missing file.
std::unique_ptr<Tokenizer> open_tokenizer(const fs::path& dir, const std::string& kind,
                                          std::optional<int32_t> eot_id = std::nullopt);

}  // namespace tributary
