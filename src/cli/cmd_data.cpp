#include <chrono>

#include "cli/commands.h"
#include "tributary/artifacts/checkpoint.h"
#include "tributary/core/error.h"
#include "tributary/core/fs.h"
#include "tributary/core/log.h"
#include "tributary/data/dataset.h"
#include "tributary/data/loader.h"

namespace tributary::cli {
namespace {

void add_build_options(CLI::App* cmd, DatasetBuildOptions& o) {
  cmd->add_option(
      "--tokenizer", o.tokenizer,
      "byte, sentencepiece (trained on the corpus), or a model's own: a tokenizer.json, a SentencePiece .model, "
      "or a directory holding one (a Hugging Face model, a checkpoint or run directory, a dataset)");
  cmd->add_option("--vocab-size", o.sentencepiece.vocab_size, "SentencePiece vocabulary size")
      ->check(CLI::Range(260, 1 << 20));
  cmd->add_option("--sp-model-type", o.sentencepiece.model_type, "SentencePiece model: bpe or unigram")
      ->check(CLI::IsMember({"bpe", "unigram"}));
  cmd->add_option("--val-permille", o.val_permille, "documents per thousand in the validation split")
      ->check(CLI::Range(1, 999));
  cmd->add_flag("--overwrite", o.overwrite, "replace an existing Tributary dataset at --out");
}

// --tokenizer RUN_DIR: the run's newest checkpoint holds its tokenizer.
void resolve_tokenizer(DatasetBuildOptions& o) {
  std::error_code ec;
  if (o.tokenizer == "byte" || o.tokenizer == "sentencepiece" ||
      !fs::is_directory(fs::path(o.tokenizer) / "checkpoints", ec))
    return;
  const auto latest = latest_checkpoint(o.tokenizer);
  if (!latest) fail("--tokenizer '{}': a run directory without a complete checkpoint", o.tokenizer);
  o.tokenizer = latest->string();
}

}  // namespace

void add_data(CLI::App& app) {
  auto* data = app.add_subcommand("data", "build and inspect token datasets");
  data->require_subcommand(1);

  struct DefaultArgs {
    std::string out = "data/default";
    double mb_per_domain = 3.0;
    DatasetBuildOptions options;
  };
  auto d = std::make_shared<DefaultArgs>();
  auto* def = data->add_subcommand("build-default", "build the built-in multi-domain corpus from Debian packages");
  def->add_option("--out", d->out, "output dataset directory");
  def->add_option("--mb-per-domain", d->mb_per_domain, "cap on the text taken from each domain (MB)")
      ->check(finite_range(1e-6, 1e6));
  add_build_options(def, d->options);
  def->callback([d]() {
    check_dataset_output(d->out, d->options.overwrite);  // before minutes of work
    resolve_tokenizer(d->options);
    auto start = std::chrono::steady_clock::now();
    Corpus corpus = build_default_corpus({.max_bytes_per_domain = static_cast<int64_t>(d->mb_per_domain * (1 << 20))});
    log::info("built-in corpus: {} documents, {:.1f} MB in {} domains", corpus.docs.size(),
              double(corpus.num_bytes()) / (1 << 20), corpus.domains.size());
    build_dataset(corpus, d->out, d->options);
    log::info("done in {:.1f} s", std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  });

  struct BuildArgs {
    std::string input, out;
    DatasetBuildOptions options;
  };
  auto b = std::make_shared<BuildArgs>();
  auto* build = data->add_subcommand("build", "tokenize your own text: a directory of text files or a JSONL file");
  build->add_option("input", b->input, "directory of text files, or JSONL with a \"text\" field")->required();
  build->add_option("--out", b->out, "output dataset directory")->required();
  add_build_options(build, b->options);
  build->callback([b]() {
    check_dataset_output(b->out, b->options.overwrite, b->input);
    resolve_tokenizer(b->options);
    Corpus corpus = read_corpus(b->input);
    log::info("read {} documents ({:.1f} MB) from '{}'", corpus.docs.size(), double(corpus.num_bytes()) / (1 << 20),
              b->input);
    build_dataset(corpus, b->out, b->options);
  });

  auto dir = std::make_shared<std::string>();
  auto* inspect = data->add_subcommand("inspect", "verify a dataset's shards and print its statistics");
  inspect->add_option("dir", *dir, "dataset directory")->required();
  inspect->callback([dir]() {
    Dataset ds = Dataset::open(*dir);
    std::printf("dataset %s: tokenizer %s (vocab %lld)\n", dir->c_str(), ds.tokenizer_kind().c_str(),
                static_cast<long long>(ds.vocab_size()));
    for (const char* split : {"train", "val"}) {
      auto shards = ds.load_shards(split);  // verifies checksums
      std::vector<int64_t> per_domain(ds.domains().size(), 0);
      for (const auto& s : shards)
        for (const auto& doc : s.docs) per_domain.at(doc.domain) += doc.num_tokens;
      const auto& info = ds.split(split);
      std::printf("  %-5s %lld docs, %lld tokens, %lld bytes, %zu shard(s) verified\n", split,
                  static_cast<long long>(info.num_docs), static_cast<long long>(info.num_tokens),
                  static_cast<long long>(info.num_bytes), shards.size());
      for (size_t i = 0; i < per_domain.size(); ++i)
        std::printf("        %-12s %lld tokens\n", ds.domains()[i].c_str(), static_cast<long long>(per_domain[i]));
    }
    std::printf("  unigram: train entropy %.4f bits/token, val cross-entropy %.4f bits/token\n",
                ds.unigram_train_entropy_bits(), ds.unigram_val_bits_per_token());
  });

  // The exact windows a replica of a run reads, for a peer trained outside Tributary on the same data order
  // (bench/torchft_peer.py): the trainer's own loader with the run's seed, batch, context, rank and world.
  struct BatchesArgs {
    std::string dir, split = "train", out;
    LoaderOptions loader;
    int64_t count = 0;
  };
  auto ba = std::make_shared<BatchesArgs>();
  auto* batches = data->add_subcommand(
      "batches", "write the token windows a replica reads (int32, [count, batch, context + 1], row-major) to a file");
  batches->add_option("dir", ba->dir, "dataset directory")->required();
  batches->add_option("--split", ba->split, "train (shuffled by --seed, as a run reads it) or val (in stream order)")
      ->check(CLI::IsMember({"train", "val"}));
  batches->add_option("--batch-size", ba->loader.batch_size, "train.batch_size")->check(CLI::Range(1, 1 << 16));
  batches->add_option("--context", ba->loader.context, "model.context")->check(CLI::Range(1, 1 << 20));
  batches->add_option("--seed", ba->loader.seed, "train.seed");
  batches->add_option("--rank", ba->loader.rank, "the replica's rank")->check(CLI::NonNegativeNumber);
  batches->add_option("--world", ba->loader.world_size, "the run's replicas")->check(CLI::Range(1, 1 << 16));
  batches->add_option("--count", ba->count, "batches to write")->required()->check(CLI::Range(1, 1 << 24));
  batches->add_option("--out", ba->out, "output file")->required();
  batches->callback([ba]() {
    if (ba->loader.rank >= ba->loader.world_size)
      fail("data batches: --rank {} is not below --world {}", ba->loader.rank, ba->loader.world_size);
    Dataset ds = Dataset::open(ba->dir);
    ba->loader.shuffle = ba->split == "train";
    BatchLoader loader(std::make_shared<const std::vector<uint32_t>>(ds.load_tokens(ba->split)), ba->loader,
                       fmt::format("'{}' {}", ba->dir, ba->split));
    const int64_t per_batch = loader.batch_size() * (loader.context() + 1);
    std::vector<int64_t> window(per_batch);
    std::string bytes;
    bytes.reserve(size_t(ba->count * per_batch) * sizeof(int32_t));
    for (int64_t b = 0; b < ba->count; ++b) {
      loader.next(window.data());
      for (const int64_t id : window) {
        const auto v = static_cast<int32_t>(id);
        bytes.append(reinterpret_cast<const char*>(&v), sizeof v);
      }
    }
    write_file_atomic(ba->out, bytes);
    log::info("wrote {} batches of {} x {} tokens ({} of {} replicas, {} split) to '{}'", ba->count,
              loader.batch_size(), loader.context() + 1, ba->loader.rank, ba->loader.world_size, ba->split, ba->out);
  });
}

}  // namespace tributary::cli
