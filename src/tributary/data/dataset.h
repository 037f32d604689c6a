// A tokenized dataset directory: dataset.json (tokenizer, domains, splits, statistics) plus token shards.
// Documents go to the validation split by a hash of their text, so the split is the same whatever order or machine
// the corpus was read on.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tributary/core/fs.h"
#include "tributary/data/corpus.h"
#include "tributary/data/shard.h"
#include "tributary/data/tokenizer.h"

namespace tributary {

struct DatasetBuildOptions {
  // byte | sentencepiece (trained on the corpus) | a model's own: a tokenizer.json, a SentencePiece .model, or a
  // directory holding one (a Hugging Face model directory, a checkpoint, a dataset)
  std::string tokenizer = "byte";
  SentencePieceOptions sentencepiece;
  int64_t val_permille = 20;        // documents per thousand that go to validation
  int64_t shard_tokens = 16 << 20;  // tokens per shard file
  bool overwrite = false;           // replace an existing Tributary dataset at the output
};

// Refuses an output that would lose data, before any work: a file, a non-empty directory that is not a Tributary
// dataset, an existing dataset without `overwrite`, or a path that contains, equals or lies inside `input` (the
// corpus being read; empty when there is none). Also removes temporary directories that killed builds of the same
// output left behind (`OUT.tmp-PID` whose process is gone).
void check_dataset_output(const fs::path& out_dir, bool overwrite, const fs::path& input = {});

struct SplitInfo {
  std::vector<std::string> shards;
  int64_t num_tokens = 0;
  int64_t num_docs = 0;
  int64_t num_bytes = 0;  // UTF-8 bytes of the documents' text (for bits per byte)
};

// The error for a dataset directory without dataset.json: whether it exists (and relative to which working
// directory), a dataset beside it with a close name ("did you mean"), or how to build one there.
[[noreturn]] void fail_not_a_dataset(const fs::path& dir);

class Dataset {
 public:
  static Dataset open(const fs::path& dir);  // Error naming the directory/file when missing or corrupt

  const fs::path& dir() const { return dir_; }
  const std::string& tokenizer_kind() const { return tokenizer_kind_; }
  int64_t vocab_size() const { return vocab_size_; }
  // The end of a document as built (nullopt for a dataset.json older than the field: the tokenizer's own).
  std::optional<int32_t> eot_id() const { return eot_id_; }
  const std::vector<std::string>& domains() const { return domains_; }
  const SplitInfo& split(const std::string& name) const;  // "train" | "val"
  double unigram_val_bits_per_token() const { return unigram_val_bits_; }
  double unigram_train_entropy_bits() const { return unigram_train_entropy_bits_; }
  double bytes_per_token(const std::string& split_name) const;

  // The split's shards concatenated (every document ends with end-of-text), read and checksum-verified.
  std::vector<uint32_t> load_tokens(const std::string& split_name) const;
  // The split's shards with their document tables (routing needs the documents).
  std::vector<Shard> load_shards(const std::string& split_name) const;
  // The split's documents by domain, each domain's concatenated ([d]: domain d of domains(), empty when it has no
  // document there), read and checked as load_tokens: unlike shards (data.shards = "domains").
  std::vector<std::vector<uint32_t>> load_domains(const std::string& split_name) const;

 private:
  void validate(const fs::path& meta) const;
  Shard read_shard(const std::string& name) const;  // checksum-verified, every id below the vocabulary
  fs::path dir_;
  std::string tokenizer_kind_;
  int64_t vocab_size_ = 0;
  std::optional<int32_t> eot_id_;
  std::vector<std::string> domains_;
  SplitInfo train_, val_;
  double unigram_val_bits_ = 0, unigram_train_entropy_bits_ = 0;
};

// The unigram baseline from per-id token counts: entropy of the training distribution and its (add-one smoothed)
// cross-entropy on validation, in bits per token.
// What identifies a dataset's contents without reading its tokens: xxh64 over dataset.json and the header of every
// shard it lists (each header holds the xxh64 of its tokens and document table). 0 when `dir` has no dataset.json
// (opening it reports that). Workers compare theirs at the rendezvous: a machine with other data at the same path is
// refused before it trains.
uint64_t dataset_fingerprint(const fs::path& dir);

struct UnigramBits {
  double train_entropy = 0, val_cross_entropy = 0;
};
UnigramBits unigram_bits(const std::vector<double>& train_counts, const std::vector<double>& val_counts);

// Tokenizes `corpus`, splits it, writes shards and dataset.json into `out_dir` (replaced only once complete).
void build_dataset(const Corpus& corpus, const fs::path& out_dir, const DatasetBuildOptions& options);

}  // namespace tributary
