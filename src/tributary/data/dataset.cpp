#include "tributary/data/dataset.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tributary/core/counted.h"
#include "tributary/core/error.h"
#include "tributary/core/hash.h"
#include "tributary/core/log.h"
#include "tributary/core/progress.h"
#include "tributary/data/tokenizer_source.h"

namespace tributary {
namespace {

constexpr int kFormatVersion = 1;

SplitInfo split_from_json(const nlohmann::json& j) {
  SplitInfo s;
  s.shards = j.at("shards").get<std::vector<std::string>>();
  s.num_tokens = j.at("num_tokens").get<int64_t>();
  s.num_docs = j.at("num_docs").get<int64_t>();
  s.num_bytes = j.at("num_bytes").get<int64_t>();
  return s;
}

nlohmann::json split_to_json(const SplitInfo& s) {
  return {{"shards", s.shards}, {"num_tokens", s.num_tokens}, {"num_docs", s.num_docs}, {"num_bytes", s.num_bytes}};
}

// Edits (insert, delete, replace a character) between a and b.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

}  // namespace

void fail_not_a_dataset(const fs::path& dir) {
  std::error_code ec;
  const std::string where =
      dir.is_relative() ? fmt::format(" (relative to the working directory '{}')", fs::current_path(ec).string())
                        : std::string();
  if (fs::is_directory(dir, ec)) {
    // A directory of text: the dataset is built beside it (data build refuses an --out that holds its input).
    const bool has_files = fs::directory_iterator(dir, ec) != fs::directory_iterator();
    const std::string built = dir.filename().empty() ? dir.parent_path().string() + "-data" : dir.string() + "-data";
    if (has_files)
      fail(
          "'{}'{} is not a Tributary dataset: it has no dataset.json. If it holds your texts, build a dataset from "
          "them into a new directory, `tributary data build {} --out {}`, and train with --set data.dir={}",
          dir.string(), where, dir.string(), built, built);
    fail(
        "'{}'{} is not a Tributary dataset: it has no dataset.json. Build one there with `tributary data "
        "build-default --out {}` (the built-in corpus) or `tributary data build TEXTS --out {}`",
        dir.string(), where, dir.string(), dir.string());
  }
  // A misspelt name: the datasets beside it, the closest first.
  const fs::path parent = dir.has_parent_path() ? dir.parent_path() : fs::path(".");
  std::vector<std::pair<size_t, std::string>> near;
  for (const auto& e : fs::directory_iterator(parent, ec))
    if (fs::exists(e.path() / "dataset.json", ec))
      near.emplace_back(edit_distance(e.path().filename().string(), dir.filename().string()),
                        (dir.has_parent_path() ? parent / e.path().filename() : e.path().filename()).string());
  std::sort(near.begin(), near.end());
  if (!near.empty() && near.front().first <= std::max<size_t>(2, dir.filename().string().size() / 4))
    fail("dataset '{}'{} does not exist; did you mean '{}'?", dir.string(), where, near.front().second);
  std::string others;
  for (size_t i = 0; i < near.size() && i < 5; ++i) others += (i ? ", '" : "'") + near[i].second + "'";
  fail(
      "dataset '{}'{} does not exist{}. Build one with `tributary data build-default --out {}` (the built-in "
      "corpus) or `tributary data build TEXTS --out {}`",
      dir.string(), where, others.empty() ? "" : "; datasets beside it: " + others, dir.string(), dir.string());
}

Dataset Dataset::open(const fs::path& dir) {
  fs::path meta = dir / "dataset.json";
  if (!fs::exists(meta)) fail_not_a_dataset(dir);
  auto j = nlohmann::json::parse(read_file(meta), nullptr, false);
  if (j.is_discarded()) fail("'{}' is not valid JSON; rebuild the dataset", meta.string());
  Dataset d;
  d.dir_ = dir;
  try {
    if (j.at("format").get<std::string>() != "tributary-dataset" || j.at("version").get<int>() != kFormatVersion)
      fail("'{}' has an unsupported format/version; rebuild the dataset", meta.string());
    d.tokenizer_kind_ = j.at("tokenizer").at("kind").get<std::string>();
    d.vocab_size_ = j.at("tokenizer").at("vocab_size").get<int64_t>();
    if (j["tokenizer"].contains("eot_id")) d.eot_id_ = j["tokenizer"]["eot_id"].get<int32_t>();
    d.domains_ = j.at("domains").get<std::vector<std::string>>();
    d.train_ = split_from_json(j.at("splits").at("train"));
    d.val_ = split_from_json(j.at("splits").at("val"));
    d.unigram_val_bits_ = j.at("unigram").at("val_cross_entropy_bits").get<double>();
    d.unigram_train_entropy_bits_ = j.at("unigram").at("train_entropy_bits").get<double>();
  } catch (const nlohmann::json::exception& e) {
    fail("'{}' is missing a field or has a wrong type ({}); rebuild the dataset", meta.string(), e.what());
  }
  d.validate(meta);
  return d;
}

// dataset.json is a file a user can edit or corrupt: every field is checked before anything trusts it.
void Dataset::validate(const fs::path& meta) const {
  auto bad = [&](const std::string& what) {
    fail("'{}': {}; rebuild the dataset (tributary data build ... --overwrite)", meta.string(), what);
  };
  if (tokenizer_kind_ != "byte" && tokenizer_kind_ != "sentencepiece" && tokenizer_kind_ != "bpe")
    bad(fmt::format("tokenizer.kind '{}' is neither byte, sentencepiece nor bpe", tokenizer_kind_));
  if (vocab_size_ < 2 || vocab_size_ > (int64_t{1} << 24))
    bad(fmt::format("tokenizer.vocab_size {} is outside 2..{}", vocab_size_, int64_t{1} << 24));
  if (tokenizer_kind_ == "byte" && vocab_size_ != 257)
    bad(fmt::format("a byte tokenizer has 257 ids, not {}", vocab_size_));
  if (tokenizer_kind_ == "sentencepiece" && !fs::is_regular_file(dir_ / "tokenizer.model"))
    bad("tokenizer.kind is sentencepiece but tokenizer.model is missing beside it");
  if (tokenizer_kind_ == "bpe" && !fs::is_regular_file(dir_ / "tokenizer.json"))
    bad("tokenizer.kind is bpe but tokenizer.json is missing beside it");
  if (domains_.empty()) bad("'domains' is empty");
  for (const auto* s : {&train_, &val_}) {
    const char* name = s == &train_ ? "train" : "val";
    if (s->num_tokens <= 0 || s->num_docs <= 0 || s->num_bytes < 0)
      bad(fmt::format("splits.{} has {} tokens, {} documents and {} bytes (need positive counts)", name, s->num_tokens,
                      s->num_docs, s->num_bytes));
    if (s->shards.empty()) bad(fmt::format("splits.{} lists no shards", name));
    for (const auto& shard : s->shards)
      if (shard.empty() || shard.find('/') != std::string::npos || shard == "." || shard == ".." ||
          fs::path(shard).filename() != fs::path(shard))
        bad(fmt::format("splits.{} names shard '{}', which is not a file of this directory", name, shard));
  }
  for (double bits : {unigram_val_bits_, unigram_train_entropy_bits_})
    if (!std::isfinite(bits) || bits < 0) bad(fmt::format("a unigram entropy is {}", bits));
}

const SplitInfo& Dataset::split(const std::string& name) const {
  if (name == "train") return train_;
  if (name == "val") return val_;
  fail("unknown data split '{}' (expected train or val)", name);
}

double Dataset::bytes_per_token(const std::string& split_name) const {
  const auto& s = split(split_name);
  return s.num_tokens > 0 ? static_cast<double>(s.num_bytes) / static_cast<double>(s.num_tokens) : 1.0;
}

std::vector<Shard> Dataset::load_shards(const std::string& split_name) const {
  std::vector<Shard> shards;
  for (const auto& name : split(split_name).shards) shards.push_back(Shard::read(dir_ / name));
  return shards;
}

std::vector<std::vector<uint32_t>> Dataset::load_domains(const std::string& split_name) const {
  std::vector<std::vector<uint32_t>> out(domains_.size());
  for (const auto& name : split(split_name).shards) {
    const Shard shard = read_shard(name);
    for (const ShardDoc& doc : shard.docs) {
      if (doc.domain >= out.size())
        fail("'{}' has a document of domain {} but '{}' lists {} domains; rebuild the dataset", (dir_ / name).string(),
             doc.domain, (dir_ / "dataset.json").string(), out.size());
      const auto first = shard.tokens.begin() + int64_t(doc.first_token);
      out[doc.domain].insert(out[doc.domain].end(), first, first + doc.num_tokens);
    }
  }
  return out;
}

Shard Dataset::read_shard(const std::string& name) const {
  Shard shard = Shard::read(dir_ / name);
  for (uint32_t t : shard.tokens)
    if (t >= vocab_size_)
      fail("'{}' holds token id {} but the tokenizer has only {} ids; rebuild the dataset", (dir_ / name).string(), t,
           vocab_size_);
  return shard;
}

std::vector<uint32_t> Dataset::load_tokens(const std::string& split_name) const {
  std::vector<uint32_t> tokens;
  for (const auto& name : split(split_name).shards) {
    const Shard shard = read_shard(name);
    tokens.insert(tokens.end(), shard.tokens.begin(), shard.tokens.end());
  }
  // The shards carry checksums of their own; dataset.json's counts are checked against them here.
  if (static_cast<int64_t>(tokens.size()) != split(split_name).num_tokens)
    fail("'{}' says the {} split has {} tokens but its shards hold {}; rebuild the dataset",
         (dir_ / "dataset.json").string(), split_name, split(split_name).num_tokens, tokens.size());
  return tokens;
}

UnigramBits unigram_bits(const std::vector<double>& train_counts, const std::vector<double>& val_counts) {
  double train_total = 0, val_total = 0;
  for (double c : train_counts) train_total += c;
  for (double c : val_counts) val_total += c;
  const double vocab = static_cast<double>(train_counts.size());
  UnigramBits out;
  for (size_t t = 0; t < train_counts.size(); ++t) {
    const double p = train_total > 0 ? train_counts[t] / train_total : 0.0;
    if (p > 0) out.train_entropy -= p * std::log2(p);
    const double q = (train_counts[t] + 1.0) / (train_total + vocab);
    out.val_cross_entropy -= val_counts[t] * std::log2(q);
  }
  if (val_total > 0) out.val_cross_entropy /= val_total;
  return out;
}

namespace {

bool is_tributary_dataset(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_regular_file(dir / "dataset.json", ec)) return false;
  auto j = nlohmann::json::parse(read_file(dir / "dataset.json"), nullptr, false);
  return j.is_object() && j.value("format", "") == "tributary-dataset";
}

// a == b, or a lies under b (both made absolute and normalised, symlinks resolved where they exist).
bool within(const fs::path& a, const fs::path& b) {
  std::error_code ec;  // a path that cannot be resolved (a vanished working directory) is compared as written
  fs::path ca = fs::weakly_canonical(fs::absolute(a, ec), ec), cb = fs::weakly_canonical(fs::absolute(b, ec), ec);
  if (ca.empty()) ca = a.lexically_normal();
  if (cb.empty()) cb = b.lexically_normal();
  auto ia = ca.begin();
  for (auto ib = cb.begin(); ib != cb.end(); ++ib, ++ia) {
    if (ib->empty()) continue;  // a trailing separator
    if (ia == ca.end() || *ia != *ib) return false;
  }
  return true;
}

void remove_stale_temporaries(const fs::path& out_dir) {
  const fs::path parent = fs::absolute(out_dir).parent_path();
  const std::string prefix = fs::absolute(out_dir).filename().string() + ".tmp-";
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(parent, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string pid = name.substr(prefix.size());
    if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos) continue;
    if (::kill(static_cast<pid_t>(std::stoll(pid)), 0) == 0 || errno != ESRCH) continue;  // its builder still runs
    fs::remove_all(e.path(), ec);
  }
}

// The tokenizer of the build (a SentencePiece model is trained on the training documents only, into `tmp`; a model's
// own is copied there) and its dataset.json entry.
std::unique_ptr<Tokenizer> make_tokenizer(const Corpus& corpus, const std::vector<bool>& is_val, const fs::path& tmp,
                                          const DatasetBuildOptions& options, nlohmann::json& tok_json) {
  std::unique_ptr<Tokenizer> tokenizer;
  if (options.tokenizer == "byte") {
    tokenizer = std::make_unique<ByteTokenizer>();
  } else if (options.tokenizer == "sentencepiece") {
    std::vector<std::string_view> texts;
    for (size_t i = 0; i < corpus.docs.size(); ++i)
      if (!is_val[i]) texts.push_back(corpus.docs[i].text);
    log::info("training SentencePiece ({}, vocab {})", options.sentencepiece.model_type,
              options.sentencepiece.vocab_size);
    train_sentencepiece(texts, tmp / "tokenizer", options.sentencepiece);
    tokenizer = std::make_unique<SentencePieceTokenizer>(tmp / "tokenizer.model");
    tok_json["model"] = "tokenizer.model";
  } else {
    tokenizer = copy_tokenizer(options.tokenizer, tmp, tok_json);
  }
  tok_json["kind"] = tokenizer->kind();
  tok_json["vocab_size"] = tokenizer->vocab_size();
  tok_json["eot_id"] = tokenizer->eot_id();
  if (const auto bos = tokenizer->bos_id()) tok_json["bos_id"] = *bos;
  return tokenizer;
}

// Replaces `out_dir` by the finished `tmp` (the old directory goes only after the new one is in place).
void publish(const fs::path& tmp, const fs::path& out_dir) {
  fsync_path(tmp);
  if (fs::exists(out_dir)) {
    fs::path old = out_dir;
    old += fmt::format(".old-{}", ::getpid());
    rename_durable(out_dir, old);
    rename_durable(tmp, out_dir);
    fs::remove_all(old);
  } else {
    if (out_dir.has_parent_path()) fs::create_directories(out_dir.parent_path());
    rename_durable(tmp, out_dir);
  }
}

// The build proper, into `tmp`; renamed over `out_dir` at the end.
void write_dataset(const Corpus& corpus, const fs::path& out_dir, const fs::path& tmp,
                   const DatasetBuildOptions& options) {
  // Split first (by content hash), so a SentencePiece model is trained on training documents only.
  std::vector<bool> is_val(corpus.docs.size());
  for (size_t i = 0; i < corpus.docs.size(); ++i)
    is_val[i] = static_cast<int64_t>(hash64(corpus.docs[i].text) % 1000) < options.val_permille;
  nlohmann::json tok_json;
  const std::unique_ptr<Tokenizer> tokenizer = make_tokenizer(corpus, is_val, tmp, options, tok_json);
  const int64_t vocab = tokenizer->vocab_size();
  std::vector<double> train_counts(static_cast<size_t>(vocab), 0.0);
  std::vector<double> val_counts(static_cast<size_t>(vocab), 0.0);
  SplitInfo infos[2];
  Shard current[2];
  const char* names[2] = {"train", "val"};
  auto flush = [&](int s) {
    if (current[s].tokens.empty()) return;
    std::string file = fmt::format("{}-{:05d}.bin", names[s], infos[s].shards.size());
    current[s].write(tmp / file, vocab - 1);
    infos[s].shards.push_back(file);
    current[s] = Shard{};
  };
  Progress progress("data build: tokenizing", static_cast<int64_t>(corpus.docs.size()), "documents");
  for (size_t i = 0; i < corpus.docs.size(); ++i) {
    progress.advance();
    const auto& doc = corpus.docs[i];
    int s = is_val[i] ? 1 : 0;
    std::vector<int32_t> ids = tokenizer->encode(doc.text);
    if (const auto bos = tokenizer->bos_id()) ids.insert(ids.begin(), *bos);
    ids.push_back(tokenizer->eot_id());
    Shard& shard = current[s];
    shard.docs.push_back({shard.tokens.size(), static_cast<uint32_t>(ids.size()), doc.domain});
    auto& counts = s == 0 ? train_counts : val_counts;
    for (int32_t id : ids) {
      shard.tokens.push_back(static_cast<uint32_t>(id));
      counts[static_cast<size_t>(id)] += 1;
    }
    infos[s].num_tokens += static_cast<int64_t>(ids.size());
    infos[s].num_docs += 1;
    infos[s].num_bytes += static_cast<int64_t>(doc.text.size());
    if (static_cast<int64_t>(shard.tokens.size()) >= options.shard_tokens) flush(s);
  }
  progress.done();
  flush(0);
  flush(1);
  if (infos[0].num_tokens == 0 || infos[1].num_tokens == 0)
    fail(
        "the corpus has {}: too few to give both a training and a validation split (val_permille = {}); "
        "add documents or raise the validation share",
        counted(int64_t(corpus.docs.size()), "document"), options.val_permille);

  // The split is by document hash, so a domain of few documents may get none: its loss would go unmeasured silently.
  std::vector<int64_t> val_docs(corpus.domains.size(), 0), all_docs(corpus.domains.size(), 0);
  for (size_t i = 0; i < corpus.docs.size(); ++i) {
    all_docs[corpus.docs[i].domain] += 1;
    if (is_val[i]) val_docs[corpus.docs[i].domain] += 1;
  }
  for (size_t d = 0; d < corpus.domains.size(); ++d)
    if (all_docs[d] > 0 && val_docs[d] == 0)
      log::warn(
          "domain '{}' has no validation document ({} document(s), val_permille = {}): the validation loss does not "
          "measure it; add documents to it or raise --val-permille",
          corpus.domains[d], all_docs[d], options.val_permille);
  const auto [entropy, cross] = unigram_bits(train_counts, val_counts);

  nlohmann::json meta = {
      {"format", "tributary-dataset"},
      {"version", kFormatVersion},
      {"tokenizer", tok_json},
      {"domains", corpus.domains},
      {"val_permille", options.val_permille},
      {"splits", {{"train", split_to_json(infos[0])}, {"val", split_to_json(infos[1])}}},
      {"unigram", {{"train_entropy_bits", entropy}, {"val_cross_entropy_bits", cross}}},
  };
  // dataset.json last: a directory without it is incomplete by definition.
  write_file_atomic(tmp / "dataset.json", meta.dump(2) + "\n");
  publish(tmp, out_dir);
  log::info(
      "dataset '{}': train {} docs / {} tokens, val {} docs / {} tokens, tokenizer {} (vocab {}), unigram "
      "entropy {:.3f} bits/token",
      out_dir.string(), infos[0].num_docs, infos[0].num_tokens, infos[1].num_docs, infos[1].num_tokens,
      tokenizer->kind(), vocab, entropy);
}

}  // namespace

void check_dataset_output(const fs::path& out_dir, bool overwrite, const fs::path& input) {
  if (out_dir.empty()) fail("--out is empty: name the dataset directory to write");
  if (!input.empty() && (within(input, out_dir) || within(out_dir, input)))
    fail(
        "--out '{}' overlaps the input '{}': the dataset would replace or mix with the corpus it is built from; "
        "choose an --out outside the input",
        out_dir.string(), input.string());
  std::error_code ec;
  const auto st = fs::status(out_dir, ec);
  if (fs::exists(st)) {
    if (!fs::is_directory(st))
      fail("--out '{}' exists and is not a directory; choose another --out (nothing was changed)", out_dir.string());
    if (!fs::is_empty(out_dir)) {
      if (!is_tributary_dataset(out_dir))
        fail(
            "--out '{}' is a non-empty directory that is not a Tributary dataset; refusing to replace it (choose a "
            "new or empty directory)",
            out_dir.string());
      if (!overwrite)
        fail("--out '{}' already holds a dataset: pass --overwrite to replace it, or choose another --out",
             out_dir.string());
    }
  }
  remove_stale_temporaries(out_dir);
}

void build_dataset(const Corpus& corpus, const fs::path& out_dir, const DatasetBuildOptions& options) {
  if (corpus.docs.empty()) fail("the corpus is empty: nothing to tokenize");
  check_dataset_output(out_dir, options.overwrite);
  fs::path tmp = out_dir;
  tmp += fmt::format(".tmp-{}", ::getpid());
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  try {
    write_dataset(corpus, out_dir, tmp, options);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);  // a failed build leaves nothing behind
    throw;
  }
}

uint64_t dataset_fingerprint(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_regular_file(dir / "dataset.json", ec) || fs::file_size(dir / "dataset.json", ec) > (1 << 24)) return 0;
  std::string material = read_file(dir / "dataset.json");
  const auto meta = nlohmann::json::parse(material, nullptr, false);
  if (meta.is_object() && meta.contains("splits") && meta["splits"].is_object())
    for (const auto& [split, info] : meta["splits"].items()) {
      if (!info.is_object() || !info.contains("shards") || !info["shards"].is_array()) continue;
      for (const auto& shard : info["shards"]) {
        if (!shard.is_string() || shard.get<std::string>().find('/') != std::string::npos) continue;
        std::ifstream in(dir / shard.get<std::string>(), std::ios::binary);
        char header[64] = {};
        in.read(header, sizeof(header));
        material.append(header, size_t(in.gcount()));
      }
    }
  return hash64(material);
}

}  // namespace tributary
